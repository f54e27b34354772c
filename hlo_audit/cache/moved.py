"""A lowering served for code that only moved: the same program, its lines where they are now.

An edit above a function a lowering ran (a helper added to a shared module, a comment, a longer function that did
not run) moves that function's lines without changing what it executes. The program is the same but for the lines
jax wrote into its metadata, which is where hlo-audit places a finding (``at moe.py:753``) and how ``check
--changes`` tells which changed lines a cell ran. So such a cell is not lowered again: its entry is copied with each
recorded line moved as its code object moved (``code.moves``: every code object the lowering ran, its first and last
line as recorded and how far it moved; a line belongs to the innermost one holding it), under a new variant whose
reads are the files as they are now, and its result is analysed again from that lowering (``run.run_cells``).

Only the lowering's own tables are moved: an entry whose text carries lines itself (a text printed with its
metadata) is lowered again instead.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterable, Mapping

from hlo_audit.cache import code as code_keys
from hlo_audit.cache.code import Move
from hlo_audit.patch import ranges

# A recorded file (as a manifest names it) -> its code objects' moves (``code.moves``).
Moves = Mapping[str, list[Move]]


def moved_line(line: int, spans: Iterable[Move]) -> int:
    """Where a recorded line is now: moved as the innermost code object holding it moved (spans widest first).
    ValueError where no code object the lowering ran holds it: where it is now is not known."""
    moved = None
    for first, last, delta in spans:
        if first <= line <= last:
            moved = line + delta
    if moved is None:
        raise ValueError(f"line {line} is in no code the lowering ran")
    return moved


def text_has_lines(text: str) -> bool:
    return "source_line=" in text or "source_file=" in text


def moved_lowering(meta: dict, moves: Moves, recorded_as: Mapping[str, str]) -> dict:
    """A lowering record (``Lowering.meta()``) with the lines of the moved files moved: its stack frame tables'
    locations and any ``file:line`` source. ``recorded_as``: a file as the metadata names it -> as the manifest
    does (files the lowering did not record stay as they are). ValueError where a line of a moved file is in no code
    the lowering ran: the cell is lowered again."""
    if text_has_lines(json.dumps({name: value for name, value in meta.items() if name != "metadata"})):
        raise ValueError("the lowering record carries lines outside its metadata tables (a dump's)")
    meta = copy.deepcopy(meta)
    metadata = meta.get("metadata")
    if not isinstance(metadata, dict):
        return meta
    for name in metadata.get("files", []):  # a moved file under another root (a copy): where its lines are is unknown
        if name not in recorded_as and any(not os.path.isabs(moved) and str(name).endswith(os.sep + moved)
                                           for moved in moves):
            raise ValueError(f"{name} is a moved file as lowered elsewhere")
    files = [recorded_as.get(name) for name in metadata.get("files", [])]
    metadata["locations"] = [
        [number, moved_line(line, moves[files[number - 1]])]
        if 0 < number <= len(files) and files[number - 1] in moves else [number, line]
        for number, line in metadata.get("locations", [])]
    sources = []
    for source in metadata.get("sources", []):
        path, _, line = source.rpartition(":")
        recorded = recorded_as.get(path)
        sources.append(f"{path}:{moved_line(int(line), moves[recorded])}"
                       if recorded in moves and line.isdigit() else source)
    if "sources" in metadata:
        metadata["sources"] = sources
    return meta


def moved_reads(reads: dict, moves: Moves, locate) -> dict:
    """A manifest variant's reads (``reads.portable``'s record) as the moved files are now: their code objects'
    digests, the lines heard of them moved. Their stamps are refreshed by the caller."""
    reads = copy.deepcopy(reads)
    for recorded, spans in moves.items():
        path = locate(recorded)
        record = reads["code"][recorded]
        each = code_keys.each(code_keys.compiled(path), *code_keys.ran_of(record["each"]))
        if each is None:
            raise ValueError(recorded)
        record["each"], record["digest"] = each, code_keys.combined(each)
        heard = reads.get("lines", {}).get(recorded)
        if heard:  # the lines heard of code that ran only at import (the module's statements) do not move here
            lines = {_moved_or_kept(line, spans) for first, last in heard for line in range(first, last + 1)}
            reads["lines"][recorded] = [list(run) for run in ranges(lines)]
    return reads


def _moved_or_kept(line: int, spans: Iterable[Move]) -> int:
    try:
        return moved_line(line, spans)
    except ValueError:
        return line


def names_as_recorded(meta: dict, moves: Moves, locate) -> dict[str, str]:
    """The file names a lowering record's metadata gives that are moved files: each as the manifest records it."""
    metadata = meta.get("metadata")
    files = metadata.get("files", []) if isinstance(metadata, dict) else []
    wanted = {os.path.abspath(locate(recorded)): recorded for recorded in moves if locate(recorded)}
    return {name: wanted[os.path.abspath(name)] for name in files
            if isinstance(name, str) and os.path.isabs(name) and os.path.abspath(name) in wanted}
