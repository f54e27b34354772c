"""Writing files so that no reader ever sees half of one."""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import tempfile
from pathlib import Path


def write_atomic(path: Path | str, data: str, mode: int | None = None) -> None:
    """Write ``data`` to a temporary file in the same folder, then rename it into place: a kill midway leaves
    the old file or the new one, never a torn one. ``mode``: the new file's permissions (default mkstemp's
    0600, for files only hlo-audit reads)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(data)
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


class OutputError(ValueError):
    """A report path that cannot be written as asked; the message names the option and the path."""


def write_output(path: Path | str, text: str, option: str, suggested_name: str = "report.txt") -> None:
    """Write a report where the user asked for it, as asked.

    ``-`` is standard output. A character device, FIFO or socket (``/dev/null``, ``/dev/stdout``, a pipe's name)
    is opened and written as a stream: it is never replaced by a file. A folder is the user's mistake. A regular
    file, or a path that does not exist yet, is written atomically (``write_atomic``) through any symlink, with
    the mode the umask gives a new file.
    """
    if str(path) == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    path = Path(path)
    try:
        info = path.stat()
    except FileNotFoundError:
        info = None
    except OSError as exc:
        raise OutputError(f"{option} {path}: cannot write: {exc.strerror or exc}") from None
    try:
        if info is not None and stat.S_ISDIR(info.st_mode):
            raise OutputError(f"{option} {path}: is a folder; give a file name such as {path / suggested_name}")
        if info is not None and not stat.S_ISREG(info.st_mode):
            with open(path, "w", encoding="utf-8") as stream:  # a device or pipe: written, never replaced
                stream.write(text)
            return
        write_atomic(path.resolve() if path.is_symlink() else path, text, mode=_new_file_mode())
    except OSError as exc:
        raise OutputError(f"{option} {path}: cannot write: {exc.strerror or exc}") from None


def _new_file_mode() -> int:
    """The mode ``open()`` gives a new file under the process's umask (``mkstemp`` would give 0600)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask
