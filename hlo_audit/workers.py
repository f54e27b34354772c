"""The judging process's side of the lowering processes (``hlo_audit.worker``): start the base once, hand it jobs,
read back what each cell's process wrote, as data.

One base per judging process, kept between runs (a test session's commands, a library caller's calls share it: a
job costs a fork, not a Python and a jax import), started again when the environment jax starts with differs from
the one it was started in. A run that is stopped (Ctrl-C, the consumer gone) ends the base and everything below it;
the next run starts another.
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from hlo_audit import preflight, termination
from hlo_audit.files import current_directory
from hlo_audit.matrix import Cell
from hlo_audit.targets import BUILTIN

# What the base's jax read when it started: a run with other values starts another base.
_STARTUP_PREFIXES = ("JAX_", "XLA_", "LIBTPU_", "TPU_", "TF_", "CUDA", "NVIDIA", "PYTHON", "LD_", "OPENBLAS", "OMP_")
# The folder hlo_audit is imported from here: the base imports the same one.
_PACKAGE_PARENT = str(Path(__file__).resolve().parent.parent)


class WorkerError(preflight.EnvironmentProblem):
    """The lowering processes could not be started or stopped answering; one line, exit 2."""


@dataclass(frozen=True)
class Started:
    cell: Cell


@dataclass(frozen=True)
class Ended:
    """A cell's process ended: ``result`` is what it wrote (None: nothing, and ``how`` says how it ended)."""

    cell: Cell
    result: dict | None
    how: str


@dataclass(frozen=True)
class TargetFailed:
    """The target could not be imported (or its import ended its process): every cell of the job fails with this."""

    message: str


def _startup_environment() -> dict[str, str]:
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(_STARTUP_PREFIXES)}


class _Base:
    def __init__(self) -> None:
        self.environment = _startup_environment()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([_PACKAGE_PARENT, *filter(None, [env.get("PYTHONPATH")])])
        try:
            # Started with SIGINT blocked (``termination.starting_workers``): a Ctrl-C to the whole group while its
            # Python starts is the command's to handle, never a traceback of the base's (``worker.main``).
            with termination.starting_workers():
                self.process = subprocess.Popen(
                    [sys.executable, "-m", "hlo_audit.worker"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                    env=env, cwd=_PACKAGE_PARENT, bufsize=0)
        except OSError as exc:
            raise WorkerError(f"cannot start a lowering process ({sys.executable}): {exc.strerror or exc}") from None
        self.lines = self._lines()
        ready = next(self.lines, None)
        if not ready or "ready" not in ready:
            self.end()
            raise WorkerError(f"the lowering process ({sys.executable} -m hlo_audit.worker) did not start: see its "
                              f"error above")

    def _lines(self) -> Iterator[dict]:
        for raw in self.process.stdout:
            try:
                event = json.loads(raw)
            except ValueError:
                continue  # a line no lowering process of ours wrote whole: never a verdict, skipped
            if isinstance(event, dict):
                yield event

    def submit(self, job: dict) -> None:
        try:
            self.process.stdin.write(pickle.dumps(job).hex().encode() + b"\n")
            self.process.stdin.flush()
        except OSError as exc:
            raise WorkerError(f"the lowering process stopped taking jobs: {exc.strerror or exc}") from None

    def peek_stale(self) -> bool:
        """Whether the base's first answer to a job is that its imported stack is stale (it then ends), else that
        answer is kept for the job's reader."""
        first = next(self.lines, None)
        if first is None or first.get("stale"):
            return True
        self.lines = itertools.chain([first], self.lines)
        return False

    def alive(self) -> bool:
        return self.process.poll() is None

    def end(self) -> None:
        """The base and every process below it (the target's, the cells'), at once: nothing of theirs is kept."""
        for pid in [*termination.descendants(self.process.pid), self.process.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for stream in (self.process.stdin, self.process.stdout):
            try:
                stream.close()
            except OSError:
                pass
        self.process.wait()


# The bases, by the stack they hold: a built-in target's (MaxText's modules, imported once: ``worker._Stack``) apart
# from the plain one every other job forks from, so that no other target's cells run with MaxText loaded.
_bases: dict[str, _Base] = {}


def _kind(target: str, op: str) -> str:
    return target if target in BUILTIN and op != "describe" else "plain"


def _the_base(kind: str) -> _Base:
    base = _bases.get(kind)
    if base is not None and (not base.alive() or base.environment != _startup_environment()):
        _forget(kind)
        base = None
    if base is None:
        preflight.check_jax_variables()  # a JAX_* value jax refuses: one line here, not a base that cannot start
        base = _bases[kind] = _Base()
    return base


def _forget(kind: str) -> None:
    base = _bases.pop(kind, None)
    if base is not None:
        base.end()


@atexit.register
def _end_bases() -> None:
    for kind in list(_bases):
        _forget(kind)


def _job(op: str, target: str, folder: str, **fields) -> dict:
    here = current_directory()  # None: the working folder was removed (the job keeps the base's)
    return {"op": op, "target": target, "folder": folder, "environ": dict(os.environ),
            "cwd": str(here) if here is not None else None, "sys_path": list(sys.path), **fields}


def _events(op: str, target: str, **fields) -> Iterator[tuple[dict, Path]]:
    """One job of the lowering processes: each event the base sends (``worker``'s module doc) with the job's folder,
    up to and including ``job_ended``. A job stopped midway (a signal, the consumer gone, the base gone) ends the
    base and everything below it; the folder is removed either way."""
    kind = _kind(target, op)
    folder = Path(tempfile.mkdtemp(prefix=f"hlo-audit-{op}-"))
    finished = False
    try:
        base = _submitted(kind, _job(op, target, str(folder), **fields))
        for event in base.lines:
            finished = "job_ended" in event
            yield event, folder
            if finished:
                return
        raise WorkerError(f"the lowering process ended during a {op} job (see its error above)")
    finally:
        if not finished:
            _forget(kind)
        shutil.rmtree(folder, ignore_errors=True)


def lower(target: str, cells: list[Cell], workers: int, rounds=None) -> Iterator[object]:
    """Lower ``cells`` of one target in the lowering processes: ``Started`` as each cell's process starts, ``Ended``
    as each ends (in the order they end), or one ``TargetFailed``. ``rounds``: measure each cell's host figure
    instead. A cell whose process the job never reported ended is ``Ended`` without a result: failed, never lost."""
    op = "lower" if rounds is None else "host"
    reported, failed = set(), False
    for event, folder in _events(op, target, cells=cells, workers=workers, rounds=rounds):
        if "started" in event and _index(event["started"], cells) is not None:
            yield Started(cells[event["started"]])
        elif "cell" in event and (index := _index(event["cell"], cells)) is not None and index not in reported:
            reported.add(index)
            yield Ended(cells[index], _read(folder / f"{index}.json"), str(event.get("ended", "")))
        elif "target_failed" in event and not failed:
            failed = True
            yield TargetFailed(str(event["target_failed"]))
        elif "job_ended" in event and not failed:
            how = f"the job's target process: {event['job_ended']}"
            yield from (Ended(cell, None, how) for n, cell in enumerate(cells) if n not in reported)


def host_figures(cells: list[Cell], rounds) -> dict[str, dict]:
    """Each cell's host figure record (``HostFigure.to_record``), measured in its own process, one at a time (a
    timing shares the machine with nothing of ours); a cell not measurable there is left out."""
    figures: dict[str, dict] = {}
    for target in dict.fromkeys(cell.target for cell in cells):
        mine = [cell for cell in cells if cell.target == target]
        for event in lower(target, mine, 1, rounds=rounds):
            if isinstance(event, Ended) and event.result and event.result.get("status") == "ok":
                figures[event.cell.id] = event.result.get("host")
    return figures


def describe(target: str, depth_of: list[str], models=None, resolve_nnx=None) -> dict | str:
    """What the target's import tells the plan (``worker._describe``), or the one line why it cannot be imported."""
    failed = None
    for event, folder in _events("describe", target, depth_of=depth_of, models=models, resolve_nnx=resolve_nnx):
        if "target_failed" in event:
            failed = str(event["target_failed"])
        elif "job_ended" in event:
            answer = _read(folder / "0.json")
            if failed is not None:
                return failed
            return answer if answer is not None else f"importing the target ended its process ({event['job_ended']})"
    raise WorkerError("the lowering process ended while importing the target (see its error above)")


def _submitted(kind: str, job: dict) -> _Base:
    """``job`` handed to the base of its kind, or to a new one where that one's imported stack is stale for it (a
    file it imported changed, a variable its import read differs): the base says so first, before any event."""
    base = _the_base(kind)
    base.submit(job)
    if base.peek_stale():
        _forget(kind)
        base = _the_base(kind)
        base.submit(job)
    return base


def _index(value, cells: list) -> int | None:
    return value if isinstance(value, int) and 0 <= value < len(cells) else None


def _read(path: Path) -> dict | None:
    try:
        with open(path, encoding="utf-8") as handle:
            value = json.load(handle)
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) else None
