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
* while workers are being started (``starting_workers``) a signal waits until they have: multiprocessing writes
  what a worker runs into a pipe after its exec, and a stop between the two left it reading an empty pipe, its
  EOFError's traceback printed after the command's line (seen once in CI). Workers start with SIGINT blocked, which
  they keep until ``worker_init`` has set it to ignored: a Ctrl-C to the group while a worker's Python is still
  importing printed a KeyboardInterrupt traceback of its own. SIGTERM and SIGHUP end a starting worker silently;
* before the command exits, every process it started and its descendants (workers, a compiler's child process)
  get SIGTERM, and SIGKILL after ``GRACE_SECONDS`` (``end_descendants``). multiprocessing's resource tracker is
  left to end by itself: it ignores both signals and leaves as soon as the last process holding its pipe (the
  command and its workers) is gone, having unlinked what they left;
* the exit code is 128 + the signal's number, as a shell reports a process the signal killed: 130 (SIGINT), 143
  (SIGTERM), 129 (SIGHUP), with one line on stderr (``announce``);
* the process then leaves without the interpreter's exit hooks (``leave``): concurrent.futures joins its pool's
  manager thread at exit, and a thread the signal interrupted can hold a lock that thread waits on, so a cancelled
  job hung there until the runner's SIGKILL (seen once in CI: ``golden update`` alive 30 s after SIGHUP);
* and whatever clean-up still runs ``CLEANUP_SECONDS`` after the signal is cut short the same way, its children
  ended first: every write hlo-audit makes survives a SIGKILL at any point (atomic files, the golden swap), so
  ending now leaves what a runner's SIGKILL would, only minutes sooner.

A signal a shell told the command to ignore (``nohup``: SIGHUP; a background job: SIGINT) stays ignored. One a
library ignored behind Python's back does not: libtpu's start-up sets SIGHUP to ignored in C when it finds it at
its default (Python's ``getsignal`` still says default), so a process that used hlo-audit as a library (the pytest
plugin, ``audit.execute``) to lower a TPU cell no longer ended on a hang-up, and every process it started after
inherited the ignore (in CI: a test worker's ``golden update`` alive 30 s after SIGHUP). ``dispositions_kept``,
around what a target runs, puts back what Python had set.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from multiprocessing import resource_tracker

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
GRACE_SECONDS = 2.0
CLEANUP_SECONDS = 10.0  # from the first signal to the process's end, whatever its clean-up is doing
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
_announced: list[bool] = []  # whether its line is on stderr
_deadline: list[threading.Timer] = []


def announce(stop: KeyboardInterrupt) -> None:
    """The one line a stopped command ends with (``hlo-audit: hung up (SIGHUP)``), said once."""
    if _announced:
        return
    _announced.append(True)
    with contextlib.suppress(OSError, ValueError):  # a closed stderr
        print(f"hlo-audit: {message(stop)}", file=sys.stderr, flush=True)


def _stop(signum: int) -> KeyboardInterrupt:
    return KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum)


_holding: list[bool] = []  # inside ``starting_workers``: the signal is raised where the block ends
_held: list[int] = []


def _handler(signum: int, frame) -> None:
    if _received:  # the first one is being handled: its clean-up must not be cut short
        return
    _received.append(signum)
    timer = threading.Timer(CLEANUP_SECONDS, _end_now, args=(signum,))
    timer.daemon = True
    timer.start()
    _deadline.append(timer)
    if _holding:
        _held.append(signum)
        return
    raise _stop(signum)


@contextlib.contextmanager
def starting_workers() -> Iterator[None]:
    """Around the code that starts worker processes: a signal that comes meanwhile stops the command when the block
    ends, not halfway through a worker's start; and the workers start with SIGINT blocked (the module doc says why).
    multiprocessing's resource tracker is started first: its own start unblocks SIGINT and SIGTERM."""
    resource_tracker.ensure_running()
    _holding.append(True)
    kept = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, kept)
        _holding.pop()
    if _held and not _holding:
        raise _stop(_held.pop())


def _end_now(signum: int) -> None:
    """The clean-up outlived ``CLEANUP_SECONDS``: end as a SIGKILL would, children first, with the command's line."""
    with contextlib.suppress(Exception):
        _end([pid for pid in descendants(os.getpid()) if pid != _resource_tracker_pid()])
    announce(_stop(signum))
    _flush()
    os._exit(128 + signum)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def leave(code: int) -> None:
    """Exit with ``code``; after a signal without the interpreter's exit hooks (the module doc says why)."""
    if _received:
        _flush()
        os._exit(code)
    sys.exit(code)


@contextlib.contextmanager
def ending_on_signals() -> Iterator[None]:
    """Around a command, in the main thread: SIGINT, SIGTERM and SIGHUP stop it as the module doc says, and when one
    did, every process it started is ended before the block is left. Handlers are put back afterwards."""
    _received.clear()
    _announced.clear()
    _held.clear()
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
        for timer in _deadline:  # the block ended: what follows is the caller's (``leave``)
            timer.cancel()
        _deadline.clear()
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextlib.contextmanager
def dispositions_kept() -> Iterator[None]:
    """The three signals' dispositions as Python last set them, put back after the block (the module doc: a
    library that ignores SIGHUP in C as it loads). Only the main thread can set them; elsewhere a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    kept = {signum: signal.getsignal(signum) for signum in SIGNALS}
    try:
        yield
    finally:
        for signum, handler in kept.items():
            if handler is not None:  # None: set from C before Python ran; nothing of Python's to put back
                with contextlib.suppress(ValueError, OSError):
                    signal.signal(signum, handler)


def stop_behind(error: BaseException | None = None) -> KeyboardInterrupt | None:
    """The stop a command must end with, though it was not raised to it, or None: a signal this command received
    whose ``KeyboardInterrupt`` something caught where it was raised (Python ignores one raised in a gc callback, as
    jax's ``_xla_gc_callback`` is, and goes on), or a ``KeyboardInterrupt`` in ``error``'s chain (a library that
    turns it into its own error: jax's pytree equality re-raises it as a ValueError). Whoever turns errors into a
    row, a finding or exit 2 asks first: a stopped command exits 128 + the signal, never 2, and writes no more."""
    if _received:
        return _stop(_received[0])
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, KeyboardInterrupt):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def raise_if_stopped(error: BaseException | None = None) -> None:
    """Raise ``stop_behind(error)`` where there is one (a checkpoint between steps, or the first thing a handler
    that keeps going does)."""
    stop = stop_behind(error)
    if stop is not None:
        raise stop from error


def stopped_exit_code() -> int | None:
    """128 + the number of the signal that stopped the last ``ending_on_signals`` block, None if none did."""
    return 128 + _received[0] if _received else None


def worker_init() -> None:
    """First thing in a worker process: a Ctrl-C reaching the whole process group leaves the worker to the main
    process, which ends it (``abandon_pool``). Ignored before it is unblocked: one that came while the worker's
    Python started (``starting_workers``) is dropped, not raised."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


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
