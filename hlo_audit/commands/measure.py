"""``hlo-audit measure``: a cell's step run for real on whatever this machine has (a TPU, a GPU or the CPU), timed.

The step is the target's own (``target.trace(cell)``: the function and the example arguments it lowers), traced for
this machine's default device; its inputs are made from the arguments' shapes and dtypes (``args_info``): zeros, and
typed PRNG keys for key-typed leaves. What is measured, each as min / median / max over interleaved rounds:

* step time blocked (each call waited for) and queued (calls pipelined, one wait at the end), in ms per step;
* host time per call of the function the user calls: ``nnx.jit``'s wrapper where the target traced one (its graph
  traversal and flatten included: on a TPU that is where dead RNG state costs), else the compiled jax step;
* compile time (lower + compile; an ``nnx.jit`` step's first call: trace, compile and one run);
* memory: the executable's argument + temp bytes (``memory_analysis``) and the runtime's peak where the device
  reports one (``memory_stats``);
* the host-cost figure (``host_cost.HostFigure``): the same caller with a trivial body over scalar stand-ins of the
  arguments, so only the host's per-call work is timed, on any machine; what the ``host_cost`` rule gates. Measure
  judges nothing itself: ``audit.measure`` hands the figures to the gate as `check` does
  (``judging.host_figures.with_measured_figures``), under the config's policy and waivers, and the judged
  ``outcome.Outcome`` is the report's verdict.

A/B: cells that differ only in one axis (``across``, the variant axis ``quant`` by default) are measured together,
round by round in turn (A, B, A, B, ...), and each is compared with the group's first; the recorded figures beside a
cell's golden (``measure --record``) are the other side for a cell measured alone. A difference gets a verdict only
when the two [min, max] ranges do not overlap and the medians differ by at least 1% (``ab_verdicts``); else it is
within noise. Comparing against another git revision is
left to two cells of one config (a variant axis): two source trees in one process would share jax's caches and
flax's global state, and two processes cannot hold one TPU chip at once, so their rounds could not interleave.

This module and what it imports run on the chip machine's stack (Python 3.11, jax 0.10.2, flax 0.12.8).
"""

from __future__ import annotations

import gc
import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from hlo_audit import termination
from hlo_audit.ab_verdicts import Comparison, compare
from hlo_audit.host_cost import HostFigure, Rounds, Spread
from hlo_audit.judging.outcome import Outcome
from hlo_audit.lowering import Unavailable
from hlo_audit.matrix import Cell
from hlo_audit.results import Severity
from hlo_audit.usage import EXIT_DIFFERENCE, EXIT_OK

# The axes A/B can compare across (cells equal in every other one are measured together).
ACROSS = ("quant", "scan", "model", "layers", "quant_mode", "step")
NNX_JIT = "nnx.jit"
JAX_JIT = "jax.jit"


# The most each of those may ask (docs/commands.md): past them a run is a typo that would run until killed (a
# thousand calls of a 30 ms step a round take 30 s; --calls 10000 x --rounds 100 of it, over eight hours), not a
# measurement. (least, most) per ``measure`` option.
ROUNDS_RANGE, WARMUP_RANGE, CALLS_RANGE, HOST_CALLS_RANGE = (1, 100), (0, 1_000), (1, 10_000), (1, 100_000)


@dataclass(frozen=True)
class StepTiming:
    """One cell's step, measured here."""

    cell: str
    caller: str
    leaves: int
    compile_s: float
    blocked_ms: Spread
    queued_ms: Spread
    host_ms: Spread  # time for the call to return (each call of the blocked loop), before the wait
    argument_bytes: int | None
    temp_bytes: int | None
    runtime_peak_bytes: int | None
    device: str

    def to_record(self) -> dict:
        return {"cell": self.cell, "caller": self.caller, "leaves": self.leaves, "compile_s": round(self.compile_s, 3),
                "blocked_ms": self.blocked_ms.to_record(), "queued_ms": self.queued_ms.to_record(),
                "host_ms": self.host_ms.to_record(), "argument_bytes": self.argument_bytes,
                "temp_bytes": self.temp_bytes, "runtime_peak_bytes": self.runtime_peak_bytes, "device": self.device}

    @classmethod
    def from_record(cls, record: dict) -> StepTiming:
        spreads = {k: Spread.from_record(record[k]) for k in ("blocked_ms", "queued_ms", "host_ms")}
        return cls(cell=record["cell"], caller=record["caller"], leaves=int(record["leaves"]),
                   compile_s=float(record["compile_s"]), argument_bytes=record.get("argument_bytes"),
                   temp_bytes=record.get("temp_bytes"), runtime_peak_bytes=record.get("runtime_peak_bytes"),
                   device=record.get("device", ""), **spreads)


@dataclass(frozen=True)
class CellMeasurement:
    cell: str
    timing: StepTiming | None
    host: HostFigure | None
    golden_host: HostFigure | None = None  # the figure recorded beside the golden (None: none recorded)
    problem: str = ""  # why it could not be measured here (unavailable, failed)
    # The golden's entry parameters, where the cell has a readable golden (None: none).
    golden_params: int | None = None
    # What the golden records of its call's leaves (its ``call_leaves``, else its figure's), what the host_cost rule
    # compares; None: no golden, or one that records none (``golden update`` writes it).
    golden_leaves: int | None = None


@dataclass(frozen=True)
class MeasureReport:
    device: str
    rounds: Rounds
    cells: tuple[CellMeasurement, ...]
    comparisons: tuple[Comparison, ...] = ()
    # The gate's outcome of the cells whose golden records a host figure, judged as `check` judges them (the host_cost
    # rule under the config's policy and waivers: ``audit.measure``); None where no cell has one.
    outcome: Outcome | None = None
    recorded: tuple[str, ...] = ()  # the goldens `--record` wrote
    notes: tuple[str, ...] = field(default=())

    @property
    def findings(self) -> tuple:
        """What the gate found of the measured cells (``findings.Finding``; "matches its golden" left out)."""
        return () if self.outcome is None else tuple(f for f in self.outcome.findings if f.severity is not Severity.OK)

    @property
    def exit_code(self) -> int:
        """`measure`'s exit code: a difference when a cell could not be measured, or its outcome fails (the host_cost
        rule found more state leaves per call than a golden's recorded figure, its action fail and no waiver)."""
        failed = any(row.problem for row in self.cells) or (self.outcome is not None and self.outcome.exit_code)
        return EXIT_DIFFERENCE if failed else EXIT_OK


# --------------------------------------------------------------------------------------------------------------
# The step: the target's traced function, its inputs made from their shapes
# --------------------------------------------------------------------------------------------------------------


@dataclass
class Step:
    """A cell's traced step, runnable here: jax's ``Traced``, and flax's ``nnx.jit`` wrapper when it made it."""

    cell: Cell
    traced: object  # jax.stages.Traced
    wrapper: object | None  # flax.nnx JitWrapped: what the user calls

    @property
    def caller(self) -> str:
        return NNX_JIT if self.wrapper is not None else JAX_JIT

    @property
    def leaves(self) -> int:
        import jax  # noqa: PLC0415

        return len(jax.tree.leaves(self.traced.args_info))


def traced_step(target, cell: Cell) -> Step:
    """The target's own step for ``cell`` (``target.trace``), traced for this machine's default device."""
    import jax  # noqa: PLC0415

    trace = getattr(target, "trace", None)
    if trace is None:
        raise Unavailable(f"measure: target {target.name!r} cannot hand over its step to run (only callable and nnx "
                          "targets do)")
    produced = trace(cell)
    wrapper = getattr(produced, "jit_wrapped", None)
    traced = getattr(produced, "traced", produced)
    if not isinstance(traced, jax.stages.Traced):
        raise Unavailable(f"measure: {cell.id}: the target returned {type(produced).__name__}, not a traced step "
                          "(jax.jit(f).trace(...) or nnx.jit(f).trace(...))")
    return Step(cell, traced, wrapper)


def _array(shape: tuple[int, ...], dtype):
    """Zeros of ``shape`` and ``dtype``; a typed PRNG key array for a key dtype (``jax.random.key``'s impl)."""
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415

    if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        impl = getattr(dtype, "_impl", None)
        base = jax.random.key(0, impl=impl) if impl is not None else jax.random.key(0)
        count = math.prod(shape)
        return jax.random.split(base, count).reshape(shape) if shape else base
    return jnp.zeros(shape, dtype)


def inputs(step: Step, scalar: bool = False):
    """(args, kwargs) of jax's traced function: arrays of each argument's shape and dtype (``scalar``: each leaf a
    0-d stand-in of its dtype, for timing the host's per-call work alone)."""
    import jax  # noqa: PLC0415

    leaves, tree = jax.tree.flatten(step.traced.args_info)
    return jax.tree.unflatten(tree, [_array(() if scalar else tuple(a.shape), a.dtype) for a in leaves])


def user_arguments(step: Step, pure_args, pure_kwargs):
    """What the user passes to the ``nnx.jit`` wrapper, rebuilt from jax-level arguments: the graph nodes (modules,
    optimizers) merged back from their states, shared references kept (flax's own ``from_tree``)."""
    from flax.nnx import extract  # noqa: PLC0415

    def is_states(x) -> bool:
        return isinstance(x, extract.NodeStates)

    def merge(ctx, path, prefix, leaf):
        return ctx.unflatten(leaf.graphdef, *leaf.states) if is_states(leaf) else leaf

    return extract.from_tree((pure_args, pure_kwargs), merge_fn=merge, is_inner=False, is_leaf=is_states,
                             is_node_leaf=is_states)


def _donated(step: Step) -> tuple[int, ...]:
    """Positional arguments jax donates (any leaf of them)."""
    import jax  # noqa: PLC0415

    args, _ = step.traced.args_info
    return tuple(i for i, a in enumerate(args) if any(leaf.donated for leaf in jax.tree.leaves(a)))


def _chain_plan(step: Step, args: tuple, out) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """Where each donated argument's next value is in the step's output: (argument, index path into the output),
    found once by structure and shapes (a train step returns its new state as it took it), so each later call only
    indexes. Raises Unavailable when a donated argument has no such output."""
    import jax  # noqa: PLC0415

    def signature(tree):
        leaves, treedef = jax.tree.flatten(tree)
        return treedef, tuple((tuple(x.shape), str(x.dtype)) for x in leaves)

    candidates = [((), out)]
    if isinstance(out, (tuple, list)):
        candidates += [((k,), item) for k, item in enumerate(out)]
        candidates += [((k, j), inner) for k, item in enumerate(out) if isinstance(item, (tuple, list))
                       for j, inner in enumerate(item)]
    by_signature: dict = {}
    for path, candidate in candidates:
        by_signature.setdefault(signature(candidate), path)
    plan = []
    for i in _donated(step):
        path = by_signature.get(signature(args[i]))
        if path is None:
            raise Unavailable(f"measure: {step.cell.id}: the step donates argument {i} and returns nothing of its "
                              "structure, so steps cannot follow each other")
        plan.append((i, path))
    return tuple(plan)


def _chained(args: tuple, out, plan: tuple[tuple[int, tuple[int, ...]], ...]) -> tuple:
    """The next call's arguments: ``args`` with each donated one taken from ``out`` where ``plan`` says."""
    chained = list(args)
    for i, path in plan:
        value = out
        for k in path:
            value = value[k]
        chained[i] = value
    return tuple(chained)


# --------------------------------------------------------------------------------------------------------------
# Running it
# --------------------------------------------------------------------------------------------------------------


class Runner:
    """One cell's step ready to call: ``call()`` runs one step and returns what to wait on."""

    def __init__(self, step: Step):
        import jax  # noqa: PLC0415

        self.step = step
        started = time.perf_counter()
        pure_args, pure_kwargs = inputs(step)
        if step.wrapper is not None:
            self.user_args, self.user_kwargs = user_arguments(step, pure_args, pure_kwargs)
            jax.block_until_ready(step.wrapper(*self.user_args, **self.user_kwargs))  # trace, compile, one run
            self.compiled = step.traced.lower().compile()  # jax's cache: the executable the call compiled
        else:
            self.compiled = step.traced.lower().compile()
            self.kwargs = pure_kwargs
            out = self.compiled(*pure_args, **pure_kwargs)
            self.plan = _chain_plan(step, pure_args, out)
            self.args = _chained(pure_args, out, self.plan)
            jax.block_until_ready(out)
        self.compile_s = time.perf_counter() - started

    def call(self):
        if self.step.wrapper is not None:
            return self.step.wrapper(*self.user_args, **self.user_kwargs)
        out = self.compiled(*self.args, **self.kwargs)
        self.args = _chained(self.args, out, self.plan)
        return out

    def memory(self) -> tuple[int | None, int | None]:
        try:
            stats = self.compiled.memory_analysis()
        except Exception:  # noqa: BLE001 (a backend without the analysis)
            return None, None
        if stats is None:
            return None, None
        return stats.argument_size_in_bytes, stats.temp_size_in_bytes

    def compiled_text(self) -> str:
        return self.compiled.as_text()


@dataclass
class _Samples:
    blocked: list[float] = field(default_factory=list)
    queued: list[float] = field(default_factory=list)
    host: list[float] = field(default_factory=list)


def _round(runner: Runner, rounds: Rounds, samples: _Samples) -> None:
    """One round: warm-up, then ``calls`` blocked (each waited for) and ``calls`` queued (one wait at the end)."""
    import jax  # noqa: PLC0415

    for _ in range(rounds.warmup):
        jax.block_until_ready(runner.call())
    blocked, host = [], []
    for _ in range(rounds.calls):
        started = time.perf_counter()
        out = runner.call()
        returned = time.perf_counter()
        jax.block_until_ready(out)
        blocked.append(time.perf_counter() - started)
        host.append(returned - started)
    started = time.perf_counter()
    for _ in range(rounds.calls):
        out = runner.call()
    jax.block_until_ready(out)
    samples.queued.append((time.perf_counter() - started) / rounds.calls * 1e3)
    samples.blocked.append(statistics.median(blocked) * 1e3)
    samples.host.append(statistics.median(host) * 1e3)


def device_name() -> str:
    import jax  # noqa: PLC0415

    device = jax.devices()[0]
    return f"{device.platform}: {device.device_kind}"


def machine() -> str:
    """The host the figures were timed on: processor, cores and the backend that ran the calls."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            model = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), model)
    except OSError:
        pass
    return f"{model} x{os.cpu_count()}, {device_name()}"


def _peak_bytes() -> int | None:
    import jax  # noqa: PLC0415

    try:
        stats = jax.devices()[0].memory_stats()
    except Exception:  # noqa: BLE001 (a backend without them)
        return None
    return (stats or {}).get("peak_bytes_in_use")


def time_group(steps: Sequence[Step], rounds: Rounds,
               save_text: Callable[[str, str], None] | None = None) -> list[StepTiming]:
    """The steps of one group, compiled one after another, then timed round by round in turn (A, B, A, B...)."""
    runners = [Runner(step) for step in steps]
    if save_text is not None:
        for runner in runners:
            save_text(runner.step.cell.id, runner.compiled_text())
    samples = [_Samples() for _ in runners]
    for _ in range(rounds.rounds):
        for runner, sample in zip(runners, samples):
            _round(runner, rounds, sample)
    timings = []
    for runner, sample in zip(runners, samples):
        argument, temp = runner.memory()
        timings.append(StepTiming(
            cell=runner.step.cell.id, caller=runner.step.caller, leaves=runner.step.leaves,
            compile_s=runner.compile_s, blocked_ms=Spread.of(sample.blocked), queued_ms=Spread.of(sample.queued),
            host_ms=Spread.of(sample.host), argument_bytes=argument, temp_bytes=temp,
            runtime_peak_bytes=_peak_bytes(), device=device_name()))
    del runners
    gc.collect()
    return timings


# --------------------------------------------------------------------------------------------------------------
# The host figure: the caller's per-call work alone, with a trivial body over scalar stand-ins
# --------------------------------------------------------------------------------------------------------------


def _touch(*args, **kwargs):
    """A body that does nothing: what is timed around it is the caller's own work."""
    return None


def _identity(*args, **kwargs):
    return args, kwargs


def host_figure(step: Step, rounds: Rounds) -> HostFigure:
    """Host microseconds per call of the step's caller (``nnx.jit`` with the user's graph nodes, or ``jax.jit``)
    with a trivial body over 0-d stand-ins of every argument leaf, donated as the step donates: flatten (nnx.jit:
    its graph traversal and bookkeeping), dispatch of every leaf, and what comes back. Needs no accelerator and no
    memory for the model: what it times depends on the number of leaves and the graph, not their sizes."""
    import jax  # noqa: PLC0415

    pure_args, pure_kwargs = inputs(step, scalar=True)
    donated = _donated(step)
    if step.wrapper is not None:
        from flax import nnx  # noqa: PLC0415

        args, kwargs = user_arguments(step, pure_args, pure_kwargs)
        twin = nnx.jit(_touch, donate_argnums=donated)

        def call():
            return twin(*args, **kwargs)
    else:
        twin = jax.jit(_identity, donate_argnums=donated)
        state = {"args": pure_args}

        def call():
            out_args, _ = twin(*state["args"], **pure_kwargs)
            state["args"] = out_args
            return out_args
    jax.block_until_ready(call())  # compile
    per_round = []
    for _ in range(rounds.rounds):
        jax.block_until_ready(call())
        started = time.perf_counter()
        for _ in range(rounds.host_calls):
            out = call()
        jax.block_until_ready(out)
        per_round.append((time.perf_counter() - started) / rounds.host_calls * 1e6)
    return HostFigure(caller=step.caller, leaves=step.leaves, per_call_us=Spread.of(per_round), machine=machine())


# --------------------------------------------------------------------------------------------------------------
# A against B (each metric's verdict: ``ab_verdicts``)
# --------------------------------------------------------------------------------------------------------------


def groups(cells: Sequence[Cell], across: str) -> list[list[Cell]]:
    """Cells that differ only in ``across``, in the order given (each group's first is its baseline)."""
    grouped: dict[tuple, list[Cell]] = {}
    for cell in cells:
        grouped.setdefault(cell.key_without(across), []).append(cell)
    return list(grouped.values())


# --------------------------------------------------------------------------------------------------------------
# A plan's cells measured; figures recorded beside their goldens
# --------------------------------------------------------------------------------------------------------------


def _golden(golden_dir, cell_id: str):
    from hlo_audit.golden.snapshot import load  # noqa: PLC0415

    stored = load(golden_dir, cell_id)
    return stored.record if stored is not None else None


def _step(cell: Cell) -> Step:
    from hlo_audit.targets import get_target  # noqa: PLC0415

    return traced_step(get_target(cell.target), cell)


def measure_cells(cells: Sequence[Cell], golden_dir, rounds: Rounds, across: str = "quant", timing: bool = True,
                  save_text: Callable[[str, str], None] | None = None,
                  measured: Callable[[CellMeasurement], None] | None = None) -> MeasureReport:
    """Every cell's host figure, and (``timing``) its step timed here, group by group (cells that differ only in
    ``across``); each compared with its group's first, or with its golden's recorded timing when it is alone. A
    cell that cannot be built or run here is a row saying why; the others still run. ``measured(row)`` is called as
    each group's rows are done (a long run on a chip shows what it has so far). Judges nothing (module doc)."""
    from hlo_audit.preflight import check_backend  # noqa: PLC0415

    check_backend("measure")  # no device to run on is the environment's: one line, not a failing row per cell
    rows_done, comparisons = [], []
    for group in groups(cells, across):
        steps, rows = [], {}
        for cell in group:
            golden = _golden(golden_dir, cell.id)
            row = CellMeasurement(cell.id, None, None, golden.host if golden else None,
                                  golden_params=golden.entry_params if golden else None,
                                  golden_leaves=golden.leaves_per_call if golden else None)
            try:
                step = _step(cell)
                figure = host_figure(step, rounds)
            except Exception as exc:  # noqa: BLE001 (a cell's failure is its row)
                termination.raise_if_stopped(exc)  # a Ctrl-C a library wrapped is no cell's failure
                rows[cell.id] = replace(row, problem=_why(exc))
                continue
            steps.append(step)
            rows[cell.id] = replace(row, host=figure)
        timings = _timed(steps, rounds, save_text, rows) if timing and steps else []
        for t in timings:
            rows[t.cell] = replace(rows[t.cell], timing=t)
        rows_done.extend(rows[c.id] for c in group)
        for c in group:
            (measured or (lambda row: None))(rows[c.id])
        comparisons.extend(_comparisons(timings, golden_dir))
        del steps
        gc.collect()
        termination.raise_if_stopped()  # a stop something swallowed (a gc callback's) ends it between groups
    return MeasureReport(device=device_name(), rounds=rounds, cells=tuple(rows_done), comparisons=tuple(comparisons))


def _timed(steps: list[Step], rounds: Rounds, save_text, rows: dict[str, CellMeasurement]) -> list[StepTiming]:
    from hlo_audit.files import OutputError  # noqa: PLC0415

    try:
        return time_group(steps, rounds, save_text)
    except OutputError:  # --save-compiled cannot be written: the user's to fix (one line, exit 2), not a cell's
        raise
    except Exception as exc:  # noqa: BLE001 (out of memory, a step that cannot chain: the group's rows say so)
        termination.raise_if_stopped(exc)
        why = _why(exc)
        for step in steps:
            row = rows[step.cell.id]
            rows[step.cell.id] = replace(row, timing=None, problem=why)
        return []


def _comparisons(timings: list[StepTiming], golden_dir) -> list[Comparison]:
    if len(timings) > 1:
        return [compare(timings[0], t) for t in timings[1:]]
    found = []
    for t in timings:
        golden = _golden(golden_dir, t.cell)
        if golden is not None and golden.measured is not None:
            found.append(compare(StepTiming.from_record(golden.measured), t, recorded=True))
    return found


def _why(exc: BaseException) -> str:
    from hlo_audit.lowering import one_line  # noqa: PLC0415

    return one_line(exc) if isinstance(exc, Unavailable) else f"{type(exc).__name__}: {one_line(exc)}"


def judgeable(report: MeasureReport) -> dict[str, HostFigure]:
    """The host figures measured of the cells that have a golden: the host_cost rule compares the leaves each
    side's lowering counts, and words the time with the golden's figure where it records one; a cell without a
    golden need not be lowered to be judged."""
    return {row.cell: row.host for row in report.cells if row.host is not None and row.golden_params is not None}
