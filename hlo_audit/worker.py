"""The lowering processes: the only processes where the code under test runs (issue 45, item 4).

The process that judges (the CLI, a library caller, a test) never imports a target: it starts one **base** process
(``python -m hlo_audit.worker``), which imports jax and hlo-audit's lowering side and then waits for jobs, and talks
to it through ``hlo_audit.workers``. For each job the base forks a **target process**, which takes the judging
process's environment, working folder and import path, imports the target (recording what that import read: every
cell's), and forks one **cell process** per cell, ``workers`` at a time. A cell process lowers its cell under the
recorder (``hlo_audit.cache``), writes its lowering, what it read and the versions it ran with as JSON to a file of
the job's folder, and ends. Forked, not spawned: a cell costs milliseconds to start, and what one cell's lowering
loaded or memoized (a config module read once through ``functools.cache``) is never another cell's unrecorded input:
each cell process starts from the target process's state, whose reads every cell's record holds.

Nothing a lowering process sends is a verdict, and nothing is pickled back: the judging process reads JSON, rebuilds
the lowering and analyses it itself. A target that calls ``sys.exit``, raises any ``BaseException``, or ends its
process (``os._exit``, a signal) fails its cell, named; it never ends or passes the check. The base forks before jax
starts a backend (importing jax starts none; the process holds one idle OpenBLAS thread, which is fork-safe).

Events on the channel (the base's standard output, one JSON object a line, each under 4 KB so lines from the target
process and the base never interleave): ``{"started": n}``, ``{"cell": n, "ended": how}`` (the result file's name is
the job's), ``{"target_failed": message}``, ``{"job_ended": how}``.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import sys
import time
import warnings
from pathlib import Path

# What every target needs, imported once in the base so that no job pays for it.
from hlo_audit import host, streams, termination

# The variables the base's start-up (importing jax) set: kept in every job's environment (``cache.reads``).
_STARTUP: dict[str, str] = {}


def _ends_with_its_parent() -> None:
    """This process is killed when the one that started it ends (Linux's PR_SET_PDEATHSIG): a base, target or cell
    process never outlives whoever waits for it, however that one ended."""
    try:
        import ctypes  # noqa: PLC0415

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: the judging process ends them itself (workers._Base.end)


def _how_ended(status: int) -> str:
    """A ``waitpid`` status in words: ``exit status 0``, ``killed by SIGKILL``."""
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        return f"killed by {name}"
    return f"exit status {os.waitstatus_to_exitcode(status)}"


def _send(channel: int, event: dict) -> None:
    line = (json.dumps(event) + "\n").encode()
    os.write(channel, line[:4000] if len(line) > 4000 else line)


def _warned(caught: list[warnings.WarningMessage]) -> list[str]:
    """Each warning the lowering raised once, in the order first raised, as ``warning_text`` shortens it."""
    from hlo_audit.results import warning_text  # noqa: PLC0415

    return list(dict.fromkeys(warning_text(w.message) for w in caught))


def _lower_cell(target, cell) -> dict:
    """One cell lowered under the recorder, as the JSON the judging process reads (``workers.read_result``)."""
    from hlo_audit.cache import reads_after, recording_environment  # noqa: PLC0415
    from hlo_audit.lowering import CellConfigError, TargetError, Unavailable, one_line, where_raised  # noqa: PLC0415

    started = time.perf_counter()
    caught: list[warnings.WarningMessage] = []
    try:
        with host.prints_to_stderr(), termination.dispositions_kept():
            target.check_available(cell)
            with recording_environment() as window, warnings.catch_warnings(record=True) as caught:
                lowering = target.lower(cell)
        seconds = time.perf_counter() - started
        reads = reads_after(window, frozenset(getattr(target, "code_under_test", ())))
        return {"status": "ok", "text": lowering.text, "meta": lowering.meta(), "seconds": seconds,
                "reads": reads.to_record(), "versions": dict(target.versions(cell)), "warnings": _warned(caught)}
    except Unavailable as exc:
        return {"status": "unavailable", "message": one_line(exc)}
    except BaseException as exc:  # noqa: BLE001 (a cell's failure is data; sys.exit and the like fail the cell too)
        detail = one_line(exc)
        if isinstance(exc, (SystemExit, KeyboardInterrupt, GeneratorExit)) or not isinstance(exc, Exception):
            said = "" if detail == type(exc).__name__ else detail
            detail = (f"the code under test raised {type(exc).__name__}({said}) while lowering ({where_raised(exc)}): "
                      f"a target may not end the check")
        elif not isinstance(exc, (CellConfigError, TargetError)):
            detail = f"{type(exc).__name__}: {detail} ({where_raised(exc)})"
        return {"status": "failed", "message": detail, "config_refused": isinstance(exc, CellConfigError),
                "warnings": _warned(caught)}


def _write_result(folder: Path, index: int, result: dict) -> None:
    path = folder / f"{index}.json"
    partial = folder / f".{index}.json.partial"
    with open(partial, "w", encoding="utf-8") as handle:
        json.dump(result, handle)
    os.replace(partial, path)


def _host_cell(target, cell, rounds) -> dict:
    """One cell's host figure (``measure.host_figure``: the step's host work per call), measured in its own process."""
    from hlo_audit.commands.measure import host_figure, traced_step  # noqa: PLC0415
    from hlo_audit.lowering import one_line  # noqa: PLC0415

    try:
        with host.prints_to_stderr(), termination.dispositions_kept():
            return {"status": "ok", "host": host_figure(traced_step(target, cell), rounds).to_record()}
    except BaseException as exc:  # noqa: BLE001 (not measurable now: the rule compares nothing)
        return {"status": "failed", "message": one_line(exc)}


def _cell_process(target, cell, job: dict, index: int) -> None:
    """In a forked cell process: lower (or measure), write the result, end (never returns)."""
    code = 0
    try:
        done = _lower_cell(target, cell) if job["op"] == "lower" else _host_cell(target, cell, job["rounds"])
        _write_result(Path(job["folder"]), index, done)
    except BaseException:  # noqa: BLE001 (no result file: the target process says how this process ended)
        code = 70
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _build_target(job: dict):
    """The job's target, imported under the process-wide recorder (what its import read is every cell's)."""
    from hlo_audit.cache import importing_target, warm  # noqa: PLC0415
    from hlo_audit.targets import get_target  # noqa: PLC0415

    with importing_target(), termination.dispositions_kept():
        target = get_target(job["target"], job.get("models"))
        preload = getattr(target, "preload", None)
        if preload is not None and job["op"] != "describe":
            preload()  # the stack every cell imports (MaxText's modules): once here, not once per cell
    if job["op"] == "lower":
        warm(frozenset(getattr(target, "code_under_test", ())))
    return target


def _target_process(job: dict, channel: int) -> None:
    """In the forked target process: the judging process's environment, import the target, fork the cells."""
    from hlo_audit.lowering import one_line  # noqa: PLC0415

    _take_environment(job)
    try:
        target = _build_target(job)
    except BaseException as exc:  # noqa: BLE001 (an import that fails or exits: every cell of the job fails)
        from hlo_audit.lowering import where_raised  # noqa: PLC0415

        named = one_line(exc)
        if not isinstance(exc, Exception):
            named = f"the target's import raised {type(exc).__name__} ({where_raised(exc)})"
        _send(channel, {"target_failed": named[:2000]})  # an event is one line under 4 KB (module doc)
        return
    if job["op"] == "describe":
        _describe(target, job, channel)
        return
    _fork_cells(target, job, channel)


def _fork_cells(target, job: dict, channel: int) -> None:
    pending = list(enumerate(job["cells"]))
    running: dict[int, int] = {}  # pid -> index
    while pending or running:
        while pending and len(running) < max(1, job["workers"]):
            index, cell = pending.pop(0)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _ends_with_its_parent()
                os.close(channel)
                _cell_process(target, cell, job, index)
            running[pid] = index
            _send(channel, {"started": index})
        pid, status = os.wait()
        if pid in running:
            _send(channel, {"cell": running.pop(pid), "ended": _how_ended(status)})


def _describe(target, job: dict, channel: int) -> None:
    """What only the target's import can tell the plan (``resolve``): its function's declared axes, models' depths."""
    function = getattr(target, "function", None)
    answer: dict = {}
    for axis in ("scan", "quant"):
        declared = getattr(function, axis, None)
        answer[axis] = None if declared is None or callable(declared) else _plain(declared)
    depths = {}
    for model in job.get("depth_of", ()):
        try:
            depths[model] = {"layers": _plain(target.full_depth(model))}
        except Exception as exc:  # noqa: BLE001 (the config's to report, by model)
            from hlo_audit.lowering import one_line  # noqa: PLC0415

            depths[model] = {"error": one_line(exc)}
    answer["full_depth"] = depths
    answer["nnx"] = {model: _resolved_nnx(spec) for model, spec in (job.get("resolve_nnx") or {}).items()}
    _write_result(Path(job["folder"]), 0, answer)
    _send(channel, {"described": True})


def _resolved_nnx(spec) -> dict:
    """An nnx model's description checked against its library (``targets.nnx.resolve``), or the key it fails at."""
    from hlo_audit.targets import nnx, nnx_spec  # noqa: PLC0415

    try:
        return {"resolved": json.loads(nnx_spec.to_json(nnx.resolve(spec)))}
    except nnx_spec.SpecError as exc:
        return {"error": str(exc), "key": exc.key}


def _plain(value):
    """A value as JSON carries it (what is not plain data becomes its repr: the judging process refuses it)."""
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)
    return value


class _Stack:
    """A built-in target's library (MaxText's modules, ~5-10 s to import) imported once in the base, under the
    process-wide recorder, so every job's target process forks with it loaded and every cell's record holds what its
    import read. Before each job it must still be what that job would import: every file it loaded or opened
    unchanged (``stat``), every variable its import read at the value the job's environment has. Otherwise the
    base is stale: it says so and ends, and the judging process starts another (``workers``)."""

    def __init__(self) -> None:
        self.loaded: set[str] = set()  # target specs whose stack is imported here
        self.files: dict[str, list] = {}

    def prepare(self, job: dict) -> bool:
        """Import the job's target's stack if it has one and it is not here yet; False where what is here is stale."""
        from hlo_audit.cache import importing_target, reads  # noqa: PLC0415
        from hlo_audit.targets import BUILTIN, get_target  # noqa: PLC0415

        if self.loaded and not self._holds(job, reads):
            return False
        if job["target"] not in BUILTIN or job["target"] in self.loaded or job["op"] == "describe":
            return True
        before = set(sys.modules)
        _take_environment(job)
        with importing_target(), termination.dispositions_kept():
            preload = getattr(get_target(job["target"], job.get("models")), "preload", None)
            if preload is not None:
                preload()
        self.loaded.add(job["target"])
        self.files.update({path: _stamp(path) for path in reads.imported_files(set(sys.modules) - before)})
        return True

    def _holds(self, job: dict, reads) -> bool:
        return reads.imports_hold_in(job["environ"]) and all(
            _stamp(path) == stamp for path, stamp in self.files.items())


def _stamp(path: str) -> list:
    """The cache's stamp of a file (``reads.stamp``: size, mtime, ctime, inode); [] where it is gone."""
    from hlo_audit.cache.reads import stamp  # noqa: PLC0415

    try:
        return stamp(os.stat(path))
    except OSError:
        return []


def _take_environment(job: dict) -> None:
    """The judging process's environment, working folder and import path, and what this process's start set."""
    os.environ.clear()
    os.environ.update(job["environ"])
    for name, value in _STARTUP.items():  # what this process's jax import set holds for it, as it did before the fork
        os.environ.setdefault(name, value)
    if job["cwd"] is not None:
        os.chdir(job["cwd"])
    sys.path[:] = job["sys_path"]


# Libraries most targets import (NNX models, their optimizers), imported once in the base when installed, so a job's
# target process does not import them again (their versions key every cell: jax's and flax's are the primary key's).
_LIBRARIES = ("flax.nnx", "optax")


def _preload_libraries() -> None:
    import importlib  # noqa: PLC0415
    import importlib.util  # noqa: PLC0415

    for name in _LIBRARIES:
        try:
            if importlib.util.find_spec(name.partition(".")[0]) is not None:
                importlib.import_module(name)
        except Exception:  # noqa: BLE001 (a library that cannot import here: the target's import says so itself)
            continue


def serve(requests, channel: int) -> None:
    """The base's loop: one job at a time, each in a target process of its own, until the judging process goes."""
    stack = _Stack()
    for line in requests:
        job = pickle.loads(bytes.fromhex(line.strip()))  # from the judging process only (its own pipe)
        try:
            fresh = stack.prepare(job)
        except BaseException:  # noqa: BLE001 (its import failed: the target process says how, again)
            fresh = not stack.loaded
            stack.files["<an import that failed>"] = ["failed"]  # what it left half-imported: stale next job
        if not fresh:
            _send(channel, {"stale": True})
            return
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _ends_with_its_parent()
            code = 0
            try:
                _target_process(job, channel)
            except BaseException:  # noqa: BLE001 (said as the job's end)
                code = 70
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        _send(channel, {"job_ended": _how_ended(status)})


def main() -> None:
    channel = os.dup(1)
    os.dup2(2, 1)  # whatever anything prints here (a library, C, the code under test) goes to stderr
    sys.stdout = sys.stderr
    streams.whole_lines(sys.stderr)
    _ends_with_its_parent()
    termination.worker_init()  # SIGINT ignored, then unblocked: the judging process ends this one and its children
    host.setup_own_process()
    before = dict(os.environ)
    import jax  # noqa: F401,PLC0415 (imported once here: every job forks with it loaded)

    import hlo_audit.cache.reads  # noqa: PLC0415
    import hlo_audit.targets.callable  # noqa: PLC0415

    _preload_libraries()

    started = {name: value for name, value in os.environ.items() if before.get(name) != value}
    hlo_audit.cache.reads.SET_AT_STARTUP.update(started)
    _STARTUP.update(started)

    _send(channel, {"ready": os.getpid()})
    serve(sys.stdin, channel)


if __name__ == "__main__":
    main()
