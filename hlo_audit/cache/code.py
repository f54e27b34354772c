"""A module's file keyed by what of it ran (issue 45, item 2): its own statements, and each code object a lowering
executed, not its whole text.

An edit to a function no cell executed (model B's code, for model A's cells), to a comment or a docstring of code
that did not run, serves the cell; an edit to anything that ran re-lowers it. Code objects are named by their
qualified name and their rank among the code objects of that name in the file (two lambdas of one function), not
by line: an edit above a class that ran only at import shifts its lines without changing the program. The code a
lowering ran keeps its lines (its line table and first line): jax writes them into the HLO's metadata, so a lowering
served for a moved function would not be the text a fresh one gives.

Both sides compile the file's source (``compile``: nothing runs), the lowering process to record, the judging process
to check; code objects are compared by what they execute (bytecode, constants with nested code named, names,
arguments, flags), so the same source gives the same digest in any process. Each code object has its own digest
(``Index.each``, worked out once per compiled file in the process cells fork from), and a record keeps them
(``each``): a cell lowered again says which one changed first (``first_change``: ``RoutedMoE.get_topk changed``, or
``moved``), as its ``relowered_because``.
"""

from __future__ import annotations

import hashlib
import os
import types
from collections.abc import Iterable

# A code object's identity in its file: (qualified name, rank among code objects of that name).
CodeId = str


def identities(tree: types.CodeType) -> dict[CodeId, types.CodeType]:
    """Every code object a module's compiled code holds, by identity (the module's own is ``<module>#0``)."""
    found: dict[CodeId, types.CodeType] = {}
    seen: dict[str, int] = {}
    stack = [tree]
    while stack:
        code = stack.pop(0)
        rank = seen.get(code.co_qualname, 0)
        seen[code.co_qualname] = rank + 1
        found[f"{code.co_qualname}#{rank}"] = code
        stack.extend(const for const in code.co_consts if isinstance(const, types.CodeType))
    return found


# path -> (its stat when compiled: size, mtime, ctime, inode; its code). Filled in the process cells fork from
# (``reads.warm``), so each cell's process finds its modules compiled (MaxText's 138 files: 0.34 s a cell).
_COMPILED: dict[str, tuple[tuple[int, int, int, int], types.CodeType | None]] = {}


def compiled(path: str) -> types.CodeType | None:
    """The file's code as ``compile`` makes it from its source now (nothing runs); None where it does not compile.
    Kept per file while its stat says it is the same file."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    stamp = (info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino)
    kept = _COMPILED.get(path)
    if kept is not None and kept[0] == stamp:
        return kept[1]
    try:
        with open(path, "rb") as handle:
            source = handle.read()
        code = compile(source, path, "exec", dont_inherit=True)
    except (OSError, SyntaxError, ValueError):
        code = None
    if kept is not None and kept[1] is not None:
        _INDEXES.pop(id(kept[1]), None)  # the file's older code: its index goes with it
    _COMPILED[path] = (stamp, code)
    return code


class Index:
    """One compiled file's code objects by identity and by where they start, and each one's digest, worked out once
    per compiled tree (``index``): in the process cells fork from, for the modules every cell loaded (``warm``), so
    keying a cell's reads is lookups (MaxText: 0.07 s of a cell's 0.12 s of keying was this, done again per cell)."""

    def __init__(self, tree: types.CodeType) -> None:
        self.by_id = identities(tree)
        self.by_start: dict[tuple[str, int], CodeId] = {}
        for name, candidate in self.by_id.items():
            self.by_start.setdefault((candidate.co_qualname, candidate.co_firstlineno), name)
        self._each: dict[tuple[CodeId, bool], str] = {}

    def each(self, name: CodeId, lines: bool) -> str | None:
        """A code object's own digest (``ran``'s entry in a record): what it executes, and for code a lowering ran,
        where its lines are (jax writes them into the program's metadata): ``+`` its line table's digest ``@`` its
        first line, kept apart so that a change can be told from a move (``moves``). None where the file holds no
        such code object."""
        found = self._each.get((name, lines))
        if found is None:
            code = self.by_id.get(name)
            if code is None:
                return None
            found = _short(_material(code))
            if lines:  # its line table (relative to its first line) and its first line: a move changes the latter
                found += f"+{_short(code.co_linetable)}@{code.co_firstlineno}"
            self._each[(name, lines)] = found
        return found

    def warm(self) -> None:
        for name in self.by_id:
            self.each(name, False)


_INDEXES: dict[int, tuple[types.CodeType, Index]] = {}  # id(tree) -> (the tree, kept alive; its index)


def index(tree: types.CodeType) -> Index:
    kept = _INDEXES.get(id(tree))
    if kept is None or kept[0] is not tree:
        kept = _INDEXES[id(tree)] = (tree, Index(tree))
    return kept[1]


def by_start(tree: types.CodeType) -> dict[tuple[str, int], CodeId]:
    """Each code object's identity by its qualified name and first line: how a live code object (one that ran) is
    found in its file's compiled code (the file is the one it was loaded from), all of a file's at once."""
    return index(tree).by_start


def each(tree: types.CodeType | None, ran: Iterable[CodeId], with_lines: Iterable[CodeId]) -> dict[CodeId, str] | None:
    """What a lowering executed of a file, code object by code object: its module's own statements
    (``<module>#0``) and each code object in ``ran`` (those in ``with_lines`` with their lines), each by its digest
    (``Index.each``). None where the file does not compile or no longer holds one of them."""
    if tree is None:
        return None
    found = index(tree)
    lines = set(with_lines)
    digests = {}
    for name in ["<module>#0", *sorted(set(ran) - {"<module>#0"})]:
        if (one := found.each(name, name in lines and name != "<module>#0")) is None:
            return None
        digests[name] = one
    return digests


def digest(tree: types.CodeType | None, ran: Iterable[CodeId], with_lines: Iterable[CodeId]) -> str | None:
    """What a lowering executed of a file, as one digest (``each``'s, in order). None as for ``each``."""
    digests = each(tree, ran, with_lines)
    return combined(digests) if digests is not None else None


def ran_of(recorded: dict[CodeId, str]) -> tuple[list[CodeId], list[CodeId]]:
    """What ran of a file as ``each`` records it: the code objects (its module's own statements aside) and those a
    lowering ran (kept with their lines: ``+`` in their digest)."""
    ran = [name for name in recorded if name != "<module>#0"]
    return ran, [name for name in ran if "+" in recorded[name]]


def combined(digests: dict[CodeId, str]) -> str:
    return hashlib.sha256("\n".join(f"{name}\0{one}" for name, one in digests.items()).encode()).hexdigest()


def first_change(tree: types.CodeType | None, recorded: dict[CodeId, str]) -> str:
    """What changed first of the code a lowering ran of a file, said as a reason to lower again: ``Class.method
    changed``, ``moved`` where only its lines did, ``is gone``, or its module's own statements; ``recorded``: the
    record's ``each``."""
    if tree is None:
        return "no longer compiles"
    found = index(tree)
    moved = None
    for name, was in recorded.items():
        shown = "module-level statements" if name == "<module>#0" else name.rpartition("#")[0]
        now = found.each(name, "+" in was)
        if now is None:
            return f"{shown} is gone"
        if now != was:
            if now.partition("+")[0] != was.partition("+")[0]:
                return f"{shown} changed"  # a change is said before any move
            if now.partition("@")[0] != was.partition("@")[0]:  # the same code, its lines apart differently
                moved = moved or f"{shown}: lines within it moved (jax writes its lines into the program)"
            moved = moved or f"{shown} moved (jax writes its lines into the program)"
    return moved or "changed"


# A code object that moved: its lines as a lowering recorded them (first, last) and how far they moved.
Move = tuple[int, int, int]


def moves(tree: types.CodeType | None, recorded: dict[CodeId, str]) -> list[Move] | None:
    """Where the code a lowering ran of a file is now, if nothing of it changed but where its lines are: for each
    code object that ran in the lowering, its lines as recorded and how far they moved (0: not at all), innermost
    last; None where anything else changed (a code object's bytecode, its line table, the module's statements).
    What it executes being the same, the program is the same but for the lines in its metadata (``cache.moved``)."""
    if tree is None:
        return None
    found = index(tree)
    spans: list[Move] = []
    for name, was in recorded.items():
        now = found.each(name, "+" in was)
        if now is None or now.partition("@")[0] != was.partition("@")[0]:
            return None
        if "@" in was:
            old_first, new_first = int(was.rpartition("@")[2]), int(now.rpartition("@")[2])
            last = max((line for *_, line in found.by_id[name].co_lines() if line is not None), default=new_first)
            spans.append((old_first, last - new_first + old_first, new_first - old_first))
    return sorted(spans, key=lambda span: span[0] - span[1])  # widest first: the innermost span is found last


def _short(material: bytes) -> str:
    return hashlib.sha256(material).hexdigest()[:16]


def _material(code: types.CodeType) -> bytes:
    """What a code object executes, the same in any process: bytecode, constants (nested code by name), names,
    arguments and flags; not where its lines are (``Index.each`` keeps those apart)."""
    parts = (code.co_code, tuple(_const(c) for c in code.co_consts), code.co_names, code.co_varnames,
             code.co_freevars, code.co_cellvars, code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount,
             code.co_flags)
    return repr(parts).encode()


def _const(value: object) -> object:
    """A constant as it compares across processes: nested code by name, sets in a fixed order."""
    if isinstance(value, types.CodeType):
        return ("<code>", value.co_qualname)
    if isinstance(value, tuple):
        return tuple(_const(v) for v in value)
    if isinstance(value, frozenset):
        return ("<frozenset>", tuple(sorted(repr(_const(v)) for v in value)))
    if isinstance(value, float):
        return ("<float>", value.hex())
    return value
