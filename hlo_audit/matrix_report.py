"""The numbers `hlo-audit report` shows, assembled once: every cell against its golden, scan on beside scan off,
depth scaling, and the tidy per cell x dtype x role rows behind all of them (pandas, CSV, JSON, HTML).

Compiled cells add a fourth view: what XLA's memory and cost analyses say (bytes by kind, flops, bytes
accessed), against the golden's, and for a GPU its launches per step.

These are the tables the seeds built by hand (000's before / after, 001's scan on / scan off, "entry
parameters, of which u32"), and, for steps that close over state, what they bake in as constants. Nothing here
lowers anything that `run` or `check` already lowered: results come
through the same plan -> execute path, so a report after a `check` reads only the cache (``audit.report``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from hlo_audit.hlo.constants import golden_summary
from hlo_audit.hlo.diff import captured_delta
from hlo_audit.hlo.params import ROLES
from hlo_audit.matrix import AXES
from hlo_audit.results import CellResult
from hlo_audit.scaling import Series

CELL_COLUMNS = ("id", *AXES)
TIDY_COLUMNS = (*CELL_COLUMNS, "dtype", "role", "count", "bytes", "golden_count", "golden_delta")


@dataclass(frozen=True)
class CellView:
    """One cell with its golden's counts: ``golden`` is None when the cell has no golden."""

    result: CellResult
    golden: dict | None  # the golden summary record

    def delta(self, kind: str) -> dict[str, int] | None:
        """``kind`` (by_dtype / by_role) minus the golden's, every key of either side; None without a golden."""
        if self.golden is None or not self.result.summary:
            return None
        old, new = self.golden[kind], self.result.summary[kind]
        return {k: new.get(k, 0) - old.get(k, 0) for k in sorted(set(old) | set(new))}

    @property
    def constants_delta(self) -> dict | None:
        """Baked-in state against the golden's (``diff.captured_delta``); None without a golden that records it,
        or when nothing changed."""
        if self.golden is None or "constants" not in self.golden or self.result.constants is None:
            return None
        return captured_delta(self.golden["constants"], golden_summary(self.result.constants))

    @property
    def total_delta(self) -> int | None:
        if self.golden is None or not self.result.summary:
            return None
        return self.result.entry_params - self.golden["entry_params"]

    def launches_delta(self) -> dict[str, int] | None:
        """A GPU cell's kernels (total, scalar) and collectives per step minus its golden's; None without a golden
        that recorded them."""
        old, new = (self.golden or {}).get("launches"), self.result.launches
        if old is None or new is None:
            return None
        return {k: new[k] - old.get(k, 0) for k in ("total", "scalar", "collectives")}

    def memory_delta(self) -> dict[str, int] | None:
        """A compiled cell's bytes by kind minus its golden's; None without a golden that recorded memory."""
        old, new = (self.golden or {}).get("memory"), self.result.memory
        if old is None or new is None:
            return None
        return {k: new[k] - old.get(k, 0) for k in new}


@dataclass(frozen=True)
class ScanPair:
    """The same model, quantization and depth scanned and unrolled (seed 001's table); a side not lowered is None."""

    label: str  # the cells' id without its scan part: llama3-8b/int8/L2, llama3-8b/none/L4/tpu-v6e-4/compiled
    on: CellResult | None
    off: CellResult | None

    @property
    def cell(self):
        """Either side's cell (they differ only in scan)."""
        return (self.on or self.off).cell

    @property
    def gap(self) -> int | None:
        """Entry parameters unrolled minus scanned, when both sides were lowered."""
        return None if self.on is None or self.off is None else self.off.entry_params - self.on.entry_params


@dataclass(frozen=True)
class MatrixReport:
    cells: list[CellView]
    scan_pairs: list[ScanPair]
    series: list[Series]
    tidy_columns = TIDY_COLUMNS

    @property
    def tidy_rows(self) -> list[dict]:
        """One row per ok cell x dtype x role (``tidy_rows``): the CSV, JSON and pandas views."""
        return tidy_rows(self.cells)

    @property
    def results(self) -> list[CellResult]:
        return [v.result for v in self.cells]

    @property
    def lowered(self) -> list[CellView]:
        return [v for v in self.cells if v.result.summary]

    @property
    def with_memory(self) -> list[CellView]:
        """Cells with XLA's memory analysis (stages optimized and compiled)."""
        return [v for v in self.cells if v.result.memory is not None]

    @property
    def baking(self) -> list[CellView]:
        """Lowered cells whose program holds state as constants: captured arrays, large constants, literal keys."""
        def bakes(c: dict | None) -> bool:
            return bool(c and ((c["captured"] or {}).get("arrays") or c["large"] or c["literal_keys"]))

        return [v for v in self.lowered if bakes(v.result.constants)]

    @property
    def dtypes(self) -> list[str]:
        """The dtype columns: every dtype some lowered cell has."""
        return sorted({k for v in self.lowered for k in v.result.summary["by_dtype"]})

    @property
    def roles(self) -> list[str]:
        """The role columns, in ROLES order: every role some lowered cell has."""
        return [r for r in ROLES if any(r in v.result.summary["by_role"] for v in self.lowered)]


def golden_joint_counts(record: dict | None) -> dict[tuple[str, str], int] | None:
    """The golden's (dtype, role) counts; None for goldens written before they were recorded."""
    if record is None or "by_dtype_role" not in record:
        return None
    return {tuple(key.split(":", 1)): n for key, n in record["by_dtype_role"].items()}


def tidy_rows(views: list[CellView]) -> list[dict]:
    """One row per ok cell x dtype x role (pairs only the golden has appear with count 0).

    ``golden_delta`` is count minus the golden's count of that dtype and role; None when the cell has no golden
    or its golden predates per dtype x role counts (``hlo-audit golden update`` records them).
    """
    rows = []
    for view in views:
        r = view.result
        if r.status != "ok":
            continue
        current = r.by_dtype_role()
        old = golden_joint_counts(view.golden)
        keys = sorted(set(current) | set(old or {}), key=lambda k: (-current.get(k, (0, 0))[0], k))
        c = r.cell
        for dtype, role in keys:
            count, size = current.get((dtype, role), (0, 0))
            golden_count = None if old is None else old.get((dtype, role), 0)
            identity = c.record()
            rows.append({**{k: identity[k] for k in CELL_COLUMNS}, "dtype": dtype, "role": role, "count": count,
                         "bytes": size, "golden_count": golden_count,
                         "golden_delta": None if golden_count is None else count - golden_count})
    return rows


def scan_pairs(results: list[CellResult]) -> list[ScanPair]:
    """Pairs of lowered cells by (model, quant, depth, platform, stage); a side not lowered is None."""
    sides: dict[tuple, dict[bool, CellResult]] = {}
    for r in results:
        if not r.summary:
            continue
        c = r.cell
        sides.setdefault(c.key_without("scan"), {})[c.scan] = r
    pairs = [ScanPair(label=next(iter(v.values())).cell.id_without_scan, on=v.get(True), off=v.get(False))
             for v in sides.values()]
    return sorted(pairs, key=lambda pair: pair.label)


def build(results: list[CellResult], series: list[Series], goldens: Mapping[str, dict | None]) -> MatrixReport:
    """The report of ``results``, their depth series and each cell's golden summary record (None: no golden)."""
    views = [CellView(r, goldens.get(r.cell.id)) for r in results]
    return MatrixReport(cells=views, scan_pairs=scan_pairs(results), series=series)
