"""The standard streams as a CI runner or a shell may hand them over: closed, read by nobody any more, on a full
device. Each is an environment error: one line on stderr and exit 2, never a traceback, and never exit 1 (1 says
the gate found a difference; a passing `check --format json | head -1` must not say "regression").

* A standard stream that is closed when hlo-audit starts (``>&-``, ``2>&-``, ``<&-``) gets /dev/null put on its
  file descriptor, so that no file hlo-audit opens later takes descriptor 1 and receives what C code prints
  there. Standard output closed is refused before anything runs (nothing would receive the command's report).
* Standard output is written through ``GuardedStdout``: a write or flush that fails (EPIPE: the reader went away,
  ``| head -1``; ENOSPC: ``> /dev/full`` or a full disk; EIO...) raises ``StdoutError`` (an ``OutputError``, so a
  command reports it as it reports any other output it cannot write), and what is still buffered is dropped:
  descriptor 1 is pointed at /dev/null, so that Python's own flush at exit has nowhere to fail.
* Standard error is written through ``GuardedStderr``: a line it cannot take (``2> /dev/full``, ``> log 2>&1`` on a
  full CI volume) is lost, not the run: the command goes on, descriptor 2 is pointed at /dev/null (nothing later
  fails on it again, Python's flush at exit included) and the exit is 2 (issue 34: with both streams full, the one
  line about standard output failed in turn and a passing check exited 1 with no message).
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Iterator

from hlo_audit.files import OutputError


class StdoutError(OutputError):
    """Standard output cannot take the command's report; the message says why."""


def _closed(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return True
    return False


def _devnull_on(fd: int) -> None:
    null = os.open(os.devnull, os.O_RDWR)
    if null != fd:
        os.dup2(null, fd)
        os.close(null)


def reopen_closed() -> list[str]:
    """Put /dev/null on every standard descriptor that is closed; the names of those that were."""
    closed = []
    for fd, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        if _closed(fd):
            _devnull_on(fd)
            setattr(sys, name, io.TextIOWrapper(io.FileIO(fd, mode, closefd=False), encoding="utf-8",
                                                errors="backslashreplace", line_buffering=fd == 2))
            closed.append(name)
    return closed


def _why(exc: OSError) -> str:
    if isinstance(exc, BrokenPipeError):
        return "the reader went away (broken pipe)"
    return f"cannot write: {exc.strerror or exc}"


class _Guarded:
    """A standard stream whose first write failure is recorded (``failed``: why) and sends the stream's descriptor to
    /dev/null, so that nothing later (an exit hook, the interpreter's own flush) fails on it again."""

    def __init__(self, stream):
        self._stream = stream
        self.failed: str | None = None

    def _record(self, exc: OSError) -> None:
        self.failed = _why(exc)
        with contextlib.suppress(OSError, ValueError):
            _devnull_on(self._stream.fileno())

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


class GuardedStdout(_Guarded):
    """``sys.stdout`` whose failures are ``StdoutError`` (module doc); everything else is the stream's own."""

    def _fail(self, exc: OSError) -> StdoutError:
        self._record(exc)
        return StdoutError(f"standard output: {self.failed}")

    def write(self, text: str) -> int:
        if self.failed:
            raise StdoutError(f"standard output: {self.failed}")
        try:
            return self._stream.write(text)
        except OSError as exc:
            raise self._fail(exc) from None

    def flush(self) -> None:
        if self.failed:
            return
        try:
            self._stream.flush()
        except OSError as exc:
            raise self._fail(exc) from None


@contextlib.contextmanager
def guarded_stdout() -> Iterator[GuardedStdout]:
    """``sys.stdout`` guarded for the block, and flushed at its end (a report still buffered is written, or its
    failure is a ``StdoutError`` raised here)."""
    saved = sys.stdout
    guard = GuardedStdout(saved)
    sys.stdout = guard
    try:
        yield guard
        guard.flush()
    finally:
        sys.stdout = saved


class GuardedStderr(_Guarded):
    """``sys.stderr`` whose failures lose the line, not the run (module doc); ``failed`` says why, once one did."""

    def write(self, text: str) -> int:
        if not self.failed:
            try:
                return self._stream.write(text)
            except OSError as exc:
                self._record(exc)
        return len(text)

    def flush(self) -> None:
        if not self.failed:
            try:
                self._stream.flush()
            except OSError as exc:
                self._record(exc)


def whole_lines(stream) -> None:
    """Each line ``stream`` is given reaches its descriptor in one write, even under PYTHONUNBUFFERED (CI sets it),
    where ``print("lowering", cell.id)`` is otherwise three writes: the command and its lowering processes share
    stderr, and cells print side by side (--jobs), so a line written in pieces is cut by another's."""
    if hasattr(stream, "reconfigure"):
        stream.reconfigure(line_buffering=True, write_through=False)


@contextlib.contextmanager
def guarded_stderr() -> Iterator[GuardedStderr]:
    """``sys.stderr`` guarded for the block, and flushed at its end (a failure then is recorded as any other)."""
    whole_lines(sys.stderr)
    saved = sys.stderr
    guard = GuardedStderr(saved)
    sys.stderr = guard
    try:
        yield guard
        guard.flush()
    finally:
        sys.stderr = saved
