"""Writing files so that no reader ever sees half of one, and report files only where and as the user asked."""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import stat
import sys
import tempfile
import time
from pathlib import Path


def read_bounded(path: Path | str, limit: int, what: str, error: type[Exception], fifo: bool) -> bytes:
    """A user's input file (a config, a shard's report), at most ``limit`` bytes, or ``error`` with one line naming
    the path: missing, a folder, unreadable, too large, or not a file of a kind that ends. ``fifo``: a named pipe is
    read like a file (``--config <(...)``); without it only a regular file is, opened without blocking so a FIFO
    is refused instead of waiting for a writer."""
    opener = None if fifo else (lambda name, flags: os.open(name, flags | os.O_NONBLOCK))
    try:
        with open(path, "rb", opener=opener) as handle:
            mode = os.fstat(handle.fileno()).st_mode
            if not (stat.S_ISREG(mode) or (fifo and stat.S_ISFIFO(mode))):
                raise error(f"{path}: not {what} (a device or socket)" if fifo else f"{path}: not a regular file")
            data = handle.read(limit + 1)
    except FileNotFoundError:
        raise error(f"{path}: no such file") from None
    except IsADirectoryError:
        raise error(f"{path}: is a folder, not {what}") from None
    except OSError as exc:
        raise error(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise error(f"{path}: larger than {limit >> 20} MiB: not {what}")
    return data


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


def sync(path: Path | str) -> None:
    """Flush a file's or a folder's contents to disk (a folder's: its entries, made by rename, link or create).
    A filesystem that cannot sync a folder (EINVAL: some network ones) is left as it is: the rename still holds
    against a kill, only not against a power loss there."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise
    finally:
        os.close(fd)


def sync_tree(root: Path | str) -> None:
    """``sync`` of every folder under ``root`` and of ``root`` itself (files written are synced by their writer)."""
    for dirpath, _, _ in os.walk(root):
        sync(dirpath)


class OutputError(ValueError):
    """A report path that cannot be written as asked; the message names the option and the path."""


class LinkedOut(OutputError):
    """A path hlo-audit would write that a symbolic link leads out of the folder it must stay in (issue 48: init
    wrote its workflow through a ``.github`` linked outside the project); the message names the path, the link and
    where it leads."""


def confined(path: Path | str, within: Path | str, what: str, place: str = "the project folder") -> Path:
    """``path`` with its links followed, where that lies inside ``within`` (also resolved), else ``LinkedOut``: the
    one check every writer of a file asks before it writes one (init's files, the golden store, reports). A link
    that stays inside is followed (``golden`` linked to ``ci/golden``); one that leads out (a folder above the file,
    or the file itself) would have hlo-audit create or replace someone else's file. ``what`` and ``place`` name the
    path and ``within`` in the message."""
    path, within = absolute(path), absolute(within)
    try:
        real, home = path.resolve(), within.resolve()
    except (OSError, RuntimeError) as exc:  # a symbolic link loop
        raise LinkedOut(f"{path}: cannot resolve {what}: {exc}; nothing written") from None
    if real == home or home in real.parents:
        return real
    link = _first_link(path, within)
    how = f" through a symbolic link ({link})" if link else ""
    raise LinkedOut(f"{path}: {what} resolves{how} to {real}, outside {place} {home}; hlo-audit writes only "
                    "inside it: nothing written")


def _first_link(path: Path, within: Path) -> Path | None:
    """The first symbolic link on ``path`` below ``within`` (both absolute, as written), None where none is."""
    if not path.is_relative_to(within):
        return None
    here = within
    for part in path.relative_to(within).parts:
        here = here / part
        if here.is_symlink():
            return here
    return None


def report_folder(path: Path | str) -> Path:
    """The folder a report path must stay in once links are followed (``confined``): the working directory for a
    path inside it (a link checked in to the repository, ``hlo-audit.md -> ~/.bashrc``, is never written through),
    else the folder the path itself names (the user chose a place outside: only a link of the file itself out of it
    is refused)."""
    path = Path(os.path.normpath(absolute(path)))
    cwd = current_directory()  # gone (deleted): an absolute path still writes, held to its own folder
    return cwd if cwd is not None and path.is_relative_to(cwd) else path.parent


class NoWorkingDirectory(ValueError):
    """The working directory is gone (deleted, or moved away) and a path needs it; the message says so."""


def working_directory(needed_for: str = "") -> Path:
    """The working directory, or ``NoWorkingDirectory`` (a user error: one line, exit 2) where it no longer exists:
    every relative path hlo-audit reads or writes goes through here (``absolute``), so a command that needs none
    (``--config`` an absolute path) runs from a deleted folder, and one that does says so instead of a traceback
    from ``os.getcwd``."""
    try:
        return Path(os.getcwd())
    except FileNotFoundError:
        raise NoWorkingDirectory(
            "the working directory no longer exists (deleted or moved away)"
            + (f"; {needed_for} needs it" if needed_for else "")
            + ": cd to an existing folder, or give paths as absolute ones") from None


def current_directory() -> Path | None:
    """The working directory, None where it no longer exists (for what only adds it, as a search path)."""
    try:
        return working_directory()
    except NoWorkingDirectory:
        return None


def absolute(path: Path | str, needed_for: str = "") -> Path:
    """``path`` made absolute: itself when it is; else under the working directory (``working_directory``)."""
    path = Path(path)
    return path if path.is_absolute() else working_directory(needed_for or str(path)) / path


def check_output(path: Path | str, option: str, suggested_name: str = "report.txt") -> None:
    """Refuse, before any work is done, a report path that can never be written as asked: a folder, a block
    device, a path below a file, a folder nobody may write in. Everything else is ``write_output``'s to try."""
    if str(path) == "-":
        return
    path = Path(path)
    info = _stat(path, option)
    if info is not None:
        _refuse_kind(path, info, option, suggested_name)
        if not stat.S_ISREG(info.st_mode) or _own_stream(info) is not None:
            return
        _report_target(path, option)
        if os.access(path, os.W_OK):
            return
        raise OutputError(f"{option} {path}: cannot write: permission denied")
    # Absent: the nearest folder that exists must be a folder we may create entries in.
    path = absolute(path, f"{option} {path}")
    _report_target(path, option)
    _check_nearest_folder(path, path.resolve().parent if path.is_symlink() else path.parent, option)


def _check_nearest_folder(path: Path, start: Path, option: str) -> None:
    """The nearest of ``start`` and its parents that exists must be a folder we may create entries in."""
    folder = start
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise OutputError(f"{option} {path}: cannot write: {folder} is not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputError(f"{option} {path}: cannot write: permission denied in {folder}")


def check_output_folder(path: Path | str, option: str) -> None:
    """Refuse, before any work is done, a folder to write files into that can never be one: empty, a file or
    anything else that is not a folder, a path below a file, a folder nobody may write in (the nearest one that
    exists, for a path still to be made)."""
    if not str(path):
        raise OutputError(f"{option}: expected a folder, got an empty path")
    path = absolute(path, f"{option} {path}")
    info = _stat(path, option)
    if info is not None and not stat.S_ISDIR(info.st_mode):
        raise OutputError(f"{option} {path}: not a folder")
    _check_nearest_folder(path, path, option)


def write_output(path: Path | str, text: str, option: str, suggested_name: str = "report.txt") -> None:
    """Write a report where the user asked for it, as asked.

    * ``-``, or any path that names this process's own standard output or error (``/dev/stdout``,
      ``/proc/self/fd/1``, the file the shell redirected stdout to): written through that stream, after what it
      already holds; the file is never replaced or truncated.
    * A character device, FIFO or socket (``/dev/null``, a pipe's name): opened and written as a stream; it keeps
      its type, whoever runs hlo-audit (root included).
    * A regular file, through a symlink that stays in its folder (``report_folder``: a link out is ``LinkedOut``):
      replaced atomically (``write_atomic``), keeping its permissions; one in
      a folder we may not create files in is rewritten in place (``rewrite_in_place``: space reserved first). A
      write cut short (a full disk, ``ulimit -f``) leaves the old file whole, and no temporary file.
    * An absent path: a new file with the mode ``open()`` gives under the umask (not ``mkstemp``'s 0600).
    * A folder or a block device: the user's mistake (``OutputError``, one line).
    """
    if str(path) == "-":
        _write_stream(sys.stdout, text)
        return
    path = Path(path)
    try:
        info = _stat(path, option)
        if info is None:
            write_atomic(_report_target(path, option), text, mode=_new_file_mode())
            return
        _refuse_kind(path, info, option, suggested_name)
        own = _own_stream(info)
        if own is not None:
            _write_stream(own, text)
        elif stat.S_ISREG(info.st_mode):
            target = _report_target(path, option)
            if os.access(target.parent, os.W_OK | os.X_OK):
                write_atomic(target, text, mode=stat.S_IMODE(info.st_mode))
            else:
                rewrite_in_place(target, text.encode("utf-8"))
        elif stat.S_ISSOCK(info.st_mode):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.connect(str(path))
                sock.sendall(text.encode("utf-8"))
        else:  # a character device or FIFO: written, never replaced
            with open(path, "w", encoding="utf-8") as stream:
                stream.write(text)
    except OSError as exc:
        raise OutputError(f"{option} {path}: cannot write: {exc.strerror or exc}") from None


def _report_target(path: Path, option: str) -> Path:
    """Where a report file at ``path`` is created or replaced: links followed, never out of its folder
    (``confined``, ``report_folder``); streams are not files and never come here."""
    return confined(path, report_folder(path), f"the {option} report", "the folder")


def rewrite_in_place(path: Path, data: bytes) -> None:
    """Replace a file's content where it cannot be written beside and renamed over (a folder we may not create
    files in), all or nothing as far as the filesystem lets: the space for ``data`` is reserved first
    (``posix_fallocate``: a full disk, a quota or a file size limit fails there, before any byte changes), then
    the bytes are written and the file cut to their length. Without fallocate (some filesystems), the old content
    is put back when the write fails."""
    fd = os.open(path, os.O_RDWR | getattr(os, "O_NOCTTY", 0))
    try:
        try:
            os.posix_fallocate(fd, 0, max(len(data), 1))
            old = None
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL, errno.ENOSYS):
                raise
            old = _read_all(fd)
        try:
            _pwrite_all(fd, data)
            os.ftruncate(fd, len(data))
        except OSError:
            if old is not None:
                with contextlib.suppress(OSError):
                    _pwrite_all(fd, old)
                    os.ftruncate(fd, len(old))
            raise
    finally:
        os.close(fd)


def _read_all(fd: int) -> bytes:
    chunks, offset = [], 0
    while chunk := os.pread(fd, 1 << 20, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def _pwrite_all(fd: int, data: bytes) -> None:
    view, offset = memoryview(data), 0
    while offset < len(data):
        offset += os.pwrite(fd, view[offset:], offset)


def append_output(path: Path | str, text: str, timeout: float = 10.0) -> str | None:
    """Append ``text`` to ``path`` (``$GITHUB_STEP_SUMMARY``: a file the runner made, or one to create).

    Returns None when written, else why not in a few words, for a warning: a summary that cannot be written
    must not change the verdict of the run that made it, nor hold it up. Only a regular file (or a new one), a
    pipe with a reader, and the file behind our own stdout or stderr are written; the path is opened without
    blocking, so a FIFO nobody reads is skipped at once, and a reader that stops reading gets ``timeout``
    seconds to go on before the rest is dropped.
    """
    path = Path(path)
    try:
        info = path.stat()
    except FileNotFoundError:
        info = None
    except OSError as exc:
        return exc.strerror or str(exc)
    if info is not None:
        own = _own_stream(info)
        if own is not None:
            try:
                _write_stream(own, text)
            except OSError as exc:
                return exc.strerror or str(exc)
            return None
        if stat.S_ISDIR(info.st_mode):
            return "is a folder"
        if not (stat.S_ISREG(info.st_mode) or stat.S_ISFIFO(info.st_mode)):
            return "not a regular file or a pipe"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0),
                     0o666)
    except OSError as exc:
        return "a pipe nobody reads" if exc.errno == errno.ENXIO else exc.strerror or str(exc)
    try:
        mode = os.fstat(fd).st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode)):  # put there since it was looked at
            return "not a regular file or a pipe"
        return _write_all(fd, text.encode("utf-8"), timeout)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes, timeout: float) -> str | None:
    """Write ``data`` to a non-blocking descriptor; why not, when a pipe's reader left or stopped reading."""
    import select  # noqa: PLC0415 (only a job summary needs it)

    deadline = time.monotonic() + timeout
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([], [fd], [], left)[1]:
                return f"the pipe's reader stopped reading for {timeout:g} s (the summary is cut short)"
        except BrokenPipeError:
            return "the pipe's reader went away"
        except OSError as exc:
            return exc.strerror or str(exc)
    return None


def _stat(path: Path, option: str) -> os.stat_result | None:
    """The path's status through symlinks; None when nothing is there (a dangling symlink included)."""
    try:
        return path.stat()
    except FileNotFoundError:
        return None
    except OSError as exc:  # below a file (ENOTDIR), a symlink loop, no permission to look
        raise OutputError(f"{option} {path}: cannot write: {exc.strerror or exc}") from None


def _refuse_kind(path: Path, info: os.stat_result, option: str, suggested_name: str) -> None:
    if stat.S_ISDIR(info.st_mode):
        raise OutputError(f"{option} {path}: is a folder; give a file name such as {path / suggested_name}")
    if stat.S_ISBLK(info.st_mode):
        raise OutputError(f"{option} {path}: is a block device, not a file or a stream")


def _own_stream(info: os.stat_result):
    """sys.stdout or sys.stderr when ``info`` is the file behind file descriptor 1 or 2, else None."""
    for fd, stream in ((1, sys.stdout), (2, sys.stderr)):
        try:
            own = os.fstat(fd)
        except OSError:
            continue
        if (own.st_dev, own.st_ino) == (info.st_dev, info.st_ino):
            return stream
    return None


def _write_stream(stream, text: str) -> None:
    stream.write(text)
    stream.flush()


def _new_file_mode() -> int:
    """The mode ``open()`` gives a new file under the process's umask (``mkstemp`` would give 0600)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask
