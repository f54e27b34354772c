"""What a command that runs cells says while they run, on stderr.

On a terminal: a transient progress bar (rich), gone when the command prints its table. Anywhere else (a CI log,
a pipe, a file): one line per finished cell, and a heartbeat line while a slow cell runs, so a log that has been
quiet for minutes still says what it is waiting for:

    hlo-audit: cell 3/12 mlp/scan-off/none/L2 lowered 1.4 s
    hlo-audit: cell 4/12 mlp/scan-on/none/L2 cached 0.0 s
    hlo-audit: cell 5/12 mlp/scan-on/int8/L2 failed to lower 0.8 s
    hlo-audit: running 1m30s: 8 of 12 cells done; in flight: llama3-8b/scan-off/int8/L32 (1m02s)

A cell's line says what is known when it finishes (lowered, cached, unavailable, failed to lower), never "ok": the
gate has not judged it yet. ``check`` then says the verdict of each cell the gate did not pass (``judged_shown``):

    hlo-audit: cell mlp/scan-off/none/L2 judged regression

Lines are never wrapped or cut, and every value in them comes from input through ``escape.visible``.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from hlo_audit.plan import Plan
from hlo_audit.report.escape import visible
from hlo_audit.results import CellResult, FailedCell, LoweredCell, Severity, UnavailableCell
from hlo_audit.run import execute

HEARTBEAT_SECONDS = 30.0  # `HLO_AUDIT_HEARTBEAT` (seconds) overrides it
IN_FLIGHT_SHOWN = 4  # cells named in a heartbeat line; the rest are counted


def heartbeat_seconds() -> float:
    value = os.environ.get("HLO_AUDIT_HEARTBEAT", "")
    try:
        seconds = float(value)
    except ValueError:
        return HEARTBEAT_SECONDS
    return seconds if seconds > 0 else HEARTBEAT_SECONDS


def duration(seconds: float) -> str:
    """``0.4 s``, ``42 s``, ``3m05s``, ``1h02m``."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


class CellLog:
    """Lines for a log: ``finished(result)`` prints one per cell, ``started(cell)`` marks a cell in flight; a
    thread prints a heartbeat every ``interval`` seconds while cells are in flight and none has finished since
    the last line."""

    def __init__(self, stream, total: int, interval: float, clock: Callable[[], float] = time.monotonic):
        self._stream, self._total, self._interval, self._clock = stream, total, interval, clock
        self._lock = threading.Lock()
        self._done = 0
        self._started_at = clock()
        self._last_line = self._started_at
        self._in_flight: dict[str, float] = {}  # cell id -> when it started
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="hlo-audit-heartbeat", daemon=True)

    def __enter__(self) -> CellLog:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _write(self, line: str) -> None:
        """One whole line (called with the lock held)."""
        try:
            self._stream.write(f"hlo-audit: {line}\n")
            self._stream.flush()
        except (OSError, ValueError):  # a closed or broken stderr must not stop the run
            pass
        self._last_line = self._clock()

    def started(self, cell) -> None:
        with self._lock:
            self._in_flight[cell.id] = self._clock()

    def finished(self, result) -> None:
        with self._lock:
            self._done += 1
            now = self._clock()
            since = self._in_flight.pop(result.cell.id, None)
            # This run's time for the cell, from when its lowering began (an unavailable or failed cell has no
            # lowering time of its own); a cached cell never began one.
            seconds = (now - since if since is not None else
                       result.lower_seconds if isinstance(result, LoweredCell) and not result.cached else 0.0)
            why = f" (re-lowered: {visible(result.relowered_because)})" if result.relowered_because else ""
            self._write(f"cell {self._done}/{self._total} {visible(result.cell.id)} {finish_word(result)} "
                        f"{duration(seconds)}{why}")

    def judged(self, cell_id: str, verdict: Severity) -> None:
        with self._lock:
            self._write(f"cell {visible(cell_id)} judged {verdict}")

    def heartbeat(self) -> None:
        """The heartbeat line, now (the thread calls this)."""
        with self._lock:
            now = self._clock()
            flight = sorted(self._in_flight.items(), key=lambda kv: kv[1])
            named = ", ".join(f"{visible(cid)} ({duration(now - since)})" for cid, since in flight[:IN_FLIGHT_SHOWN])
            more = f" and {len(flight) - IN_FLIGHT_SHOWN} more" if len(flight) > IN_FLIGHT_SHOWN else ""
            waiting = f"in flight: {named}{more}" if flight else "preparing"
            cells = "cell" if self._total == 1 else "cells"
            self._write(f"running {duration(now - self._started_at)}: {self._done} of {self._total} {cells} done; "
                        f"{waiting}")

    def _beat(self) -> None:
        while not self._stop.wait(self._interval / 4):
            with self._lock:
                quiet = self._clock() - self._last_line
            if quiet >= self._interval and self._done < self._total:
                self.heartbeat()


def finish_word(result: CellResult) -> str:
    """What a cell's line says of how it finished: what the run knows before the gate judges it."""
    if isinstance(result, FailedCell):
        return "failed to lower"
    if isinstance(result, UnavailableCell):
        return "unavailable"
    return "cached" if isinstance(result, LoweredCell) and result.cached else "lowered"


def judged_shown(outcome, stream=None) -> None:
    """In a log (not on a terminal, where the table follows at once): a line per checked cell the gate did not
    pass, with its verdict, so a log that said a cell lowered also says how it was judged."""
    stream = stream or sys.stderr
    if stream.isatty():
        return
    log = CellLog(stream, len(outcome.cell_ids), heartbeat_seconds())  # its heartbeat thread is never started
    for cell_id in outcome.cell_ids:
        verdict = outcome.verdicts.get(cell_id, Severity.OK)
        if verdict is not Severity.OK:
            log.judged(cell_id, verdict)


class _Bar:
    def __init__(self, bar: Progress, task):
        self._bar, self._task = bar, task

    def started(self, cell) -> None:
        self._bar.update(self._task, description=visible(cell.id))

    def finished(self, result) -> None:
        self._bar.update(self._task, advance=1, description=visible(result.cell.id))


class _Silent:
    def started(self, cell) -> None:
        pass

    def finished(self, result) -> None:
        pass


@contextlib.contextmanager
def cell_progress(total: int, stream=None) -> Iterator:
    """What to say while ``total`` cells run: a progress bar when ``stream`` (stderr) is a terminal, log lines
    otherwise, nothing for no cells. Yields an object with ``started(cell)`` and ``finished(result)``."""
    stream = stream or sys.stderr
    if total == 0:
        yield _Silent()
        return
    if stream.isatty():
        console = Console(file=stream, no_color="NO_COLOR" in os.environ, highlight=False)
        bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                       console=console, transient=True)
        with bar:
            yield _Bar(bar, bar.add_task("lowering", total=total))
        return
    with CellLog(stream, total, heartbeat_seconds()) as log:
        yield log


def run_shown(plan: Plan, jobs: int = 1, use_cache: bool = True, refresh: bool = False) -> list[CellResult]:
    """Run the plan's cells, saying so on stderr: a progress bar on a terminal, a line per cell (and a heartbeat
    while a slow one runs) in a log. The results in the plan's order."""
    with cell_progress(len(plan.cells)) as shown:
        results = []
        for result in execute(plan, jobs=jobs, use_cache=use_cache, refresh=refresh, started=shown.started):
            results.append(result)
            shown.finished(result)
    order = {c.id: i for i, c in enumerate(plan.cells)}
    return sorted(results, key=lambda r: order[r.cell.id])
