"""Where HLO text comes from: a file, standard input, or an ``--xla_dump_to`` folder.

A dump folder holds every module jax compiled in that process (seed, convert, the train step...), each
``before_optimizations`` and ``<platform>_after_optimizations`` plus buffer-assignment and other reports.
By default the largest ``jit_*`` module that is not one of jax's private ``jit__*`` helpers is the one the
user means: the train step dwarfs the rest.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

from hlo_audit.hlo.text import HloParseError, decode_text, read_text

STAGES = ("before", "after")
_DUMP_FILE = re.compile(r"^module_\d+\.(?P<name>.+?)\.(?P<stage>before_optimizations|[a-z]+_after_optimizations)\.txt$")


@dataclass(frozen=True)
class DumpEntry:
    path: Path
    module_name: str
    stage: str  # "before" | "after"
    size: int


def dump_entries(folder: Path) -> list[DumpEntry]:
    entries = []
    for path in sorted(folder.iterdir()):
        m = _DUMP_FILE.match(path.name)
        if m and path.is_file():
            stage = "before" if m.group("stage") == "before_optimizations" else "after"
            entries.append(DumpEntry(path, m.group("name"), stage, path.stat().st_size))
    return entries


def pick_dump_module(folder: Path, module_regex: str | None = None, stage: str = "before") -> Path:
    """The dump file for ``module_regex`` (default: largest jit_* module) at ``stage``."""
    entries = dump_entries(folder)
    if not entries:
        raise HloParseError("dump folder holds no HLO modules (*.before_optimizations.txt)", str(folder))
    at_stage = [e for e in entries if e.stage == stage]
    if not at_stage:
        raise HloParseError(f"dump folder holds no modules at stage {stage!r}", str(folder))
    if module_regex is None:
        # jit__name modules are jax's own private helpers (_threefry_seed, _truncated_normal, ...).
        candidates = [e for e in at_stage if e.module_name.startswith("jit_")
                      and not e.module_name.startswith("jit__")] or at_stage
    else:
        try:
            pattern = re.compile(module_regex)
        except re.error as exc:
            raise HloParseError(f"bad --module regex {module_regex!r}: {exc}", str(folder)) from None
        candidates = [e for e in at_stage if pattern.search(e.module_name)]
        if not candidates:
            names = ", ".join(sorted({e.module_name for e in at_stage}))
            raise HloParseError(f"no module matches {module_regex!r} (modules: {names})", str(folder))
    return max(candidates, key=lambda e: (e.size, e.path.name)).path


def read_input(spec: str, module_regex: str | None = None, stage: str = "before") -> tuple[str, str]:
    """(text, source label) for a path, ``-`` (stdin) or a dump folder."""
    if spec == "-":
        # Bytes, decoded like a file: a non-UTF-8 stdin is an input error, whatever the locale says.
        return decode_text(sys.stdin.buffer.read(), "<stdin>"), "<stdin>"
    path = Path(spec)
    if path.is_dir():
        chosen = pick_dump_module(path, module_regex, stage)
        return read_text(chosen), str(chosen)
    return read_text(path), str(path)
