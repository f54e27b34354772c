"""The numbers `hlo-audit report` shows, assembled once from an outcome: every cell against its golden, scan on
beside scan off, depth scaling, and the tidy per cell x dtype x role rows behind all of them (pandas, CSV, JSON,
HTML).

Compiled cells add a fourth view: what XLA's memory and cost analyses say (bytes by kind, flops, bytes
accessed), against the golden's, and for a GPU its launches per step.

These are the tables the seeds built by hand (000's before / after, 001's scan on / scan off, "entry
parameters, of which u32"), and, for steps that close over state, what they bake in as constants. Nothing here
lowers anything that `run` or `check` already lowered: results come through the same plan -> run path, so a
report after a `check` reads only the cache.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass, fields

from hlo_audit.comparison import GATED_LAUNCHES, CellDelta
from hlo_audit.findings import CapturedDelta
from hlo_audit.golden.record import GoldenRecord
from hlo_audit.golden.snapshot import read_snapshot
from hlo_audit.hlo.params import ROLES
from hlo_audit.judging.outcome import Outcome
from hlo_audit.matrix import AXES
from hlo_audit.plan import Plan
from hlo_audit.results import CellResult, FailedCell, LoweredCell
from hlo_audit.scaling import Series
from hlo_audit.usage import EXIT_DIFFERENCE, EXIT_OK

CELL_COLUMNS = ("id", *AXES)
TIDY_COLUMNS = (*CELL_COLUMNS, "dtype", "role", "count", "bytes", "golden_count", "golden_delta")


@dataclass(frozen=True)
class TidyRow:
    """One ok cell x dtype x role: the cell's identity, its parameters and bytes, and the golden's count (None:
    no golden, or one written before per dtype x role counts were recorded)."""

    id: str
    model: str
    scan: str
    quant: str
    quant_mode: str
    layers: int
    step: str
    platform: str
    topology: str
    gpu: str
    cuda_arch: str
    stage: str
    dtype: str
    role: str
    count: int
    bytes: int
    golden_count: int | None
    golden_delta: int | None

    def values(self) -> tuple:
        return astuple(self)


assert tuple(f.name for f in fields(TidyRow)) == TIDY_COLUMNS, "the matrix's axes changed: TidyRow follows them"


@dataclass(frozen=True)
class CellView:
    """One cell with its comparison against its golden (``comparison.CellDelta``, the one the gate judges by; None
    when the cell has no readable golden): every delta below is read off it, never worked out here again."""

    result: CellResult
    golden: GoldenRecord | None  # the golden's record (None: no golden, or one that cannot be read)
    compared: CellDelta | None

    def delta(self, kind: str) -> dict[str, int] | None:
        """``kind`` (by_dtype / by_role) minus the golden's, every key of either side (0 where it held); None without
        a golden."""
        if self.compared is None:
            return None
        moved = getattr(self.compared.params, kind)
        keys = set(getattr(self.compared.golden, kind)) | set(getattr(self.result.summary, kind))
        return {k: moved.get(k, 0) for k in sorted(keys)}

    @property
    def constants_delta(self) -> CapturedDelta | None:
        """Baked-in state against the golden's; None without a golden that records it, or when nothing changed."""
        return self.compared.captured if self.compared is not None else None

    @property
    def golden_knows_constants(self) -> bool:
        return self.golden is not None and self.golden.constants is not None

    @property
    def total_delta(self) -> int | None:
        return self.compared.params.delta if self.compared is not None else None

    def launches_delta(self) -> dict[str, int] | None:
        """A GPU cell's kernels (total, scalar) and collectives per step minus its golden's; None without a golden
        that recorded them."""
        if self.compared is None or self.golden.launches is None or self.result.launches is None:
            return None
        moved = self.compared.launches.delta if self.compared.launches is not None else {}
        return {k: moved.get(k, 0) for k in GATED_LAUNCHES}

    def memory_delta(self) -> dict[str, int] | None:
        """A compiled cell's bytes by kind minus its golden's (a kind the golden lacks: all of it); None without a
        golden that recorded memory."""
        if self.compared is None or self.compared.memory is None:
            return None
        moved = self.compared.memory.delta()
        return {k: moved.get(k, v) for k, v in self.result.memory.items()}


@dataclass(frozen=True)
class ScanPair:
    """The same model, quantization and depth scanned and unrolled (seed 001's table); a side not lowered is None."""

    label: str  # the cells' id without its scan part: llama3-8b/int8/L2, llama3-8b/none/L4/tpu-v6e-4/compiled
    on: LoweredCell | None
    off: LoweredCell | None

    @property
    def cell(self):
        """Either side's cell (they differ only in scan)."""
        return (self.on or self.off).cell

    @property
    def gap(self) -> int | None:
        """Entry parameters unrolled minus scanned, when both sides were lowered."""
        return None if self.on is None or self.off is None else self.off.entry_params - self.on.entry_params


@dataclass(frozen=True)
class MatrixView:
    cells: list[CellView]
    scan_pairs: list[ScanPair]
    series: list[Series]
    tidy_columns = TIDY_COLUMNS

    @property
    def tidy_rows(self) -> list[TidyRow]:
        """One row per ok cell x dtype x role (``tidy_rows``): the CSV, JSON and pandas views."""
        return tidy_rows(self.cells)

    @property
    def results(self) -> list[CellResult]:
        return [v.result for v in self.cells]

    @property
    def exit_code(self) -> int:
        """`report`'s exit code: a cell that failed (an unavailable one is not a failure)."""
        return EXIT_DIFFERENCE if any(isinstance(r, FailedCell) for r in self.results) else EXIT_OK

    @property
    def lowered(self) -> list[CellView]:
        return [v for v in self.cells if isinstance(v.result, LoweredCell)]

    @property
    def with_memory(self) -> list[CellView]:
        """Cells with XLA's memory analysis (stages optimized and compiled)."""
        return [v for v in self.lowered if v.result.memory is not None]

    @property
    def baking(self) -> list[CellView]:
        """Lowered cells whose program holds state as constants: captured arrays, large constants, literal keys."""
        return [v for v in self.lowered if v.result.constants is not None and v.result.constants.bakes_state]

    @property
    def dtypes(self) -> list[str]:
        """The dtype columns: every dtype some lowered cell has."""
        return sorted({k for v in self.lowered for k in v.result.summary.by_dtype})

    @property
    def roles(self) -> list[str]:
        """The role columns, in ROLES order: every role some lowered cell has."""
        return [r for r in ROLES if any(r in v.result.summary.by_role for v in self.lowered)]


def tidy_rows(views: list[CellView]) -> list[TidyRow]:
    """One row per ok cell x dtype x role (pairs only the golden has appear with count 0).

    ``golden_delta`` is count minus the golden's count of that dtype and role; None when the cell has no golden
    or its golden predates per dtype x role counts (``hlo-audit golden update`` records them).
    """
    rows = []
    for view in views:
        r = view.result
        if not isinstance(r, LoweredCell):
            continue
        current = r.by_dtype_role()
        old = view.golden.joint_counts if view.golden is not None else None
        keys = sorted(set(current) | set(old or {}), key=lambda k: (-current.get(k, (0, 0))[0], k))
        identity = r.cell.record()
        for dtype, role in keys:
            count, size = current.get((dtype, role), (0, 0))
            golden_count = None if old is None else old.get((dtype, role), 0)
            rows.append(TidyRow(**{k: identity[k] for k in CELL_COLUMNS}, dtype=dtype, role=role, count=count,
                                bytes=size, golden_count=golden_count,
                                golden_delta=None if golden_count is None else count - golden_count))
    return rows


def scan_pairs(results: list[CellResult]) -> list[ScanPair]:
    """Pairs of lowered cells by (model, quant, depth, platform, stage); a side not lowered is None."""
    sides: dict[tuple, dict[bool, LoweredCell]] = {}
    for r in results:
        if not isinstance(r, LoweredCell):
            continue
        c = r.cell
        sides.setdefault(c.key_without("scan"), {})[c.scan] = r
    pairs = [ScanPair(label=next(iter(v.values())).cell.id_without_scan, on=v.get(True), off=v.get(False))
             for v in sides.values()]
    return sorted(pairs, key=lambda pair: pair.label)


def matrix_view_of(plan: Plan, results: list[CellResult]) -> MatrixView:
    """The report of a plan's results, against one tree of goldens read whole (``golden.snapshot.read_snapshot``)."""
    return read_snapshot(plan.config.golden_dir, lambda tree: matrix_view(Outcome.of(plan, results, tree)))


def matrix_view(outcome: Outcome) -> MatrixView:
    """The report of an outcome: each result with its golden (None: no golden, or one that cannot be read), the
    scan pairs and the depth series."""
    results = list(outcome.results)
    views = []
    for r in results:
        stored = outcome.goldens.golden(r.cell.id)
        views.append(CellView(r, stored.record if stored is not None else None, outcome.delta(r)))
    return MatrixView(cells=views, scan_pairs=scan_pairs(results), series=list(outcome.series))
