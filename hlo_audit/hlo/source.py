"""Where HLO text comes from: a file, standard input, or an ``--xla_dump_to`` folder.

A dump folder holds every module XLA compiled in that process (jax's seed and convert helpers, the train
step...), each as text before and after optimizations, beside buffer assignments, memory reports and other
files. XLA names them (``FilenameFor``, xla/service/dump.cc) ``[<timestamp>.]module_<id>[.<module name>].<suffix>``
with ``.txt`` after a text dump; the suffix says the stage, and after optimizations each backend puts its own
word in front of it. Measured on this project's dumps (jaxlib 0.12.0.1):

* CPU: ``module_0003.jit_step.before_optimizations.txt``, ``module_0003.jit_step.cpu_after_optimizations.txt``;
* GPU (XLA's GPU compiler, device or deviceless): ``module_0001.jit_f.sm_9.0a_gpu_after_optimizations.txt`` (the
  compute capability in the name: ``sm_8.0``, ``sm_9.0a``, ``sm_10.0a``...);
* TPU (libtpu, as MaxText's ``train_compile`` dumps): ``module_0000.jit_step.cl_1014260217.before_optimizations.txt``
  and ``....cl_1014260217.after_optimizations.txt``.

So a file is a module at stage ``before``/``after`` when its name is ``module_<id>...`` ending in
``before_optimizations.txt`` / ``after_optimizations.txt`` right after a ``.`` or ``_``: that covers every
backend's word without a list of them, and leaves out the other files of the same stem
(``...after_optimizations-buffer-assignment.txt``, ``...after_optimizations_after_buffer_assignment.txt``,
per-pass dumps, ``after_spmd_partitioner``). The module's name is the one its text declares (``HloModule <name>``,
read from the file's first bytes), not a guess at where the name ends and a backend's word begins.
By default the largest ``jit_*`` module that is not one of jax's private ``jit__*`` helpers is the one the user
means: the train step dwarfs the rest.
"""

from __future__ import annotations

import os
import re
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

from hlo_audit.hlo.text import HloParseError, read_stream, read_text

STAGES = ("before", "after")
_DUMP_FILE = re.compile(r"^(?:\d+\.)?module_(?P<id>\d+)\.(?P<rest>.*)\.txt$")
_STAGE = re.compile(r"(?:^|(?<=[._]))(?P<stage>before|after)_optimizations$")
_HEADER_NAME = re.compile(rb"\s*HloModule\s+%?([A-Za-z_][\w.\-]*)")
# Where the name ends in a file name, when the text does not say (no header): before a TPU compile id or a
# CPU / GPU backend word.
_NAME_IN_FILE_NAME = re.compile(r"^(?P<name>.+?)(?:\.cl_\d+)?(?:\.(?:cpu|[a-z]+_[\d.]+[a-z]*_gpu|[a-z0-9]+_gpu))?$")


@dataclass(frozen=True)
class DumpEntry:
    path: Path
    module_name: str
    stage: str  # "before" | "after"
    size: int


def dump_entries(folder: Path) -> list[DumpEntry]:
    """The modules of a dump folder at either stage, by file name (see the module docstring)."""
    entries = []
    for path in sorted(folder.iterdir()):
        m = _DUMP_FILE.match(path.name)
        stage = _STAGE.search(m.group("rest")) if m else None
        if stage is None or not path.is_file():
            continue
        head = m.group("rest")[:stage.start()].rstrip("._")
        entries.append(DumpEntry(path, _module_name(path, head), stage.group("stage"), path.stat().st_size))
    return entries


def _module_name(path: Path, head: str) -> str:
    """The name the module's text declares; else the file name's, without a TPU compile id or backend word."""
    m = None
    try:  # without blocking: a FIFO put in the file's place since it was listed is not read
        with os.fdopen(os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)), "rb") as f:
            if stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                m = _HEADER_NAME.match(f.read(512))
    except OSError:
        pass
    if m:
        return m.group(1).decode()
    return _NAME_IN_FILE_NAME.match(head).group("name") if head else ""


def pick_dump_module(folder: Path, module_regex: str | None = None, stage: str = "before") -> Path:
    """The dump file for ``module_regex`` (default: largest jit_* module) at ``stage``."""
    entries = dump_entries(folder)
    if not entries:
        raise HloParseError("dump folder holds no HLO modules (module_*.before_optimizations.txt or "
                            "*after_optimizations.txt)", str(folder))
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
    """(text, source label) for a path, ``-`` (stdin) or a dump folder.

    Only these: a path that names a FIFO, a device or a socket is refused before anything is read from it
    (read_text), so ``count`` on a named pipe with no writer never blocks and ``count /dev/zero`` never fills
    memory.
    """
    if spec == "-":
        # Bytes, decoded like a file: a non-UTF-8 stdin is an input error, whatever the locale says.
        return read_stream(sys.stdin.buffer, "<stdin>"), "<stdin>"
    path = Path(spec)
    try:
        is_dir = path.is_dir()
    except OSError:  # a path too long, a loop of symbolic links: read_text names it
        is_dir = False
    if is_dir:
        if not os.access(path, os.R_OK | os.X_OK):
            raise HloParseError("cannot read the dump folder: permission denied", str(path))
        chosen = pick_dump_module(path, module_regex, stage)
        return read_text(chosen), str(chosen)
    return read_text(path), str(path)
