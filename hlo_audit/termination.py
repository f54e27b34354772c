"""How a command ends when it is told to stop, and what it leaves behind: nothing.

Three signals stop a command: SIGINT (Ctrl-C), SIGTERM (a cancelled CI job: GitHub Actions and GitLab send it, then
SIGKILL after a grace period), SIGHUP (the terminal or SSH session went away). All three end it the same way:

* in the main thread, SIGTERM and SIGHUP raise ``Terminated``, a ``KeyboardInterrupt``, where SIGINT raises
  ``KeyboardInterrupt`` itself; so everything that finishes or undoes work on Ctrl-C does the same for them (a
  golden update keeps the old tree or the new one, an atomic write leaves the old file, a cache entry is whole);
* a signal that arrives while the first one is being handled is ignored (SIGKILL still ends everything), so the
  clean-up below is never cut short by the CI runner's second signal;
* the worker pool is abandoned, not waited for (``abandon_pool``: its workers ignore SIGINT, so a Ctrl-C that
  reaches the whole process group does not print a traceback per worker, and are ended by the main process);
* before the command exits, every process it started and its descendants (workers, a compiler's child process)
  get SIGTERM, and SIGKILL after ``GRACE_SECONDS`` (``end_descendants``). multiprocessing's resource tracker is
  left to end by itself: it ignores both signals and leaves as soon as the last process holding its pipe (the
  command and its workers) is gone, having unlinked what they left;
* the exit code is 128 + the signal's number, as a shell reports a process the signal killed: 130 (SIGINT), 143
  (SIGTERM), 129 (SIGHUP), with one line on stderr.

A signal a shell told the command to ignore (``nohup``: SIGHUP; a background job: SIGINT) stays ignored.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
GRACE_SECONDS = 2.0
_SAID = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated", signal.SIGHUP: "hung up"}


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP in the main thread: handled wherever Ctrl-C is."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def signal_of(stop: KeyboardInterrupt) -> int:
    return getattr(stop, "signum", signal.SIGINT)


def exit_code(stop: KeyboardInterrupt) -> int:
    """128 + the signal's number: 130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP."""
    return 128 + signal_of(stop)


def message(stop: KeyboardInterrupt) -> str:
    """``interrupted (SIGINT)``, ``terminated (SIGTERM)``, ``hung up (SIGHUP)``."""
    signum = signal_of(stop)
    return f"{_SAID.get(signum, 'stopped')} ({signal.Signals(signum).name})"


_received: list[int] = []  # the signal that stopped this process, once one has


def _handler(signum: int, frame) -> None:
    if _received:  # the first one is being handled: its clean-up must not be cut short
        return
    _received.append(signum)
    raise KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum)


@contextlib.contextmanager
def ending_on_signals() -> Iterator[None]:
    """Around a command, in the main thread: SIGINT, SIGTERM and SIGHUP stop it as the module doc says, and when one
    did, every process it started is ended before the block is left. Handlers are put back afterwards."""
    _received.clear()
    previous = {}
    for signum in SIGNALS:
        current = signal.getsignal(signum)
        if current is signal.SIG_IGN:  # nohup, a background job: the shell's choice stands
            continue
        previous[signum] = current
        signal.signal(signum, _handler)
    try:
        yield
    finally:
        if _received:
            end_descendants()
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def stopped_exit_code() -> int | None:
    """128 + the number of the signal that stopped the last ``ending_on_signals`` block, None if none did."""
    return 128 + _received[0] if _received else None


def worker_init() -> None:
    """First thing in a worker process: a Ctrl-C reaching the whole process group leaves the worker to the main
    process, which ends it (``abandon_pool``)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def abandon_pool(pool) -> None:
    """A ``ProcessPoolExecutor`` left because the command is stopping: queued cells are cancelled, running ones are
    not waited for (a cell can take minutes), its workers are ended now."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    _end([p.pid for p in processes if p.pid is not None])
    for process in processes:
        with contextlib.suppress(Exception):
            process.join(0)


def end_descendants() -> None:
    """SIGTERM to every process below this one (multiprocessing's resource tracker aside: see the module doc), then
    SIGKILL to those still there after ``GRACE_SECONDS``."""
    tracker = _resource_tracker_pid()
    _end([pid for pid in descendants(os.getpid()) if pid != tracker])
    for child in multiprocessing.active_children():  # reaps the workers it started
        child.join(0)


def _end(pids: list[int]) -> None:
    for pid in pids:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_SECONDS
    alive = pids
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [pid for pid in alive if _running(pid)]
    for pid in alive:
        _signal(pid, signal.SIGKILL)


def _signal(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signum)


def _running(pid: int) -> bool:
    """Whether ``pid`` still runs: a child of ours that ended is reaped here; a zombie is not running."""
    with contextlib.suppress(ChildProcessError, OSError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel whether the pid exists
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def descendants(root: int) -> list[int]:
    """Every process below ``root``, children first (from /proc; elsewhere multiprocessing's children only)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return [p.pid for p in multiprocessing.active_children() if p.pid is not None]
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                ppid = int(stat.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, queue = [], [root]
    while queue:
        for child in children.get(queue.pop(), ()):
            found.append(child)
            queue.append(child)
    return found


def _resource_tracker_pid() -> int | None:
    tracker = sys.modules.get("multiprocessing.resource_tracker")
    return getattr(getattr(tracker, "_resource_tracker", None), "_pid", None)
