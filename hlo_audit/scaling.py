"""Depth scaling: entry parameters, and a GPU step's kernel launches, as a line in the layer count.

Lower a series (same cell, different depths) at two or more depths and fit, per dtype and per role,
``count = intercept + slope * layers``. A scanned model should have slope 0 everywhere (the layer body is
traced once); an unrolled one pays its per-layer state in the slope. The fit projects to the model's real
depth, which is cheaper than lowering llama3-8b's 32 layers, and a test holds it to the real lowering.

GPU cells (stages optimized and compiled for a named GPU) also fit their launches per step (``launches``:
total, scalar, collectives and those that read RNG state): seed 000's leak is +21 scalar counter kernels per layer
of llama3-8b on an H100, +672 at 32 layers. ``launch_groups`` says which launches reading RNG state the deepest cell has
that the shallowest has not (``hlo.launch_groups.group_delta``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from hlo_audit.hlo.launch_groups import LaunchGroup, group_delta
from hlo_audit.matrix import Cell
from hlo_audit.results import CellResult, LoweredCell

# The launch counts a GPU series fits (keys of a result's ``launches`` record).
LAUNCH_COUNTS = ("total", "scalar", "collectives", "reading_rng")
RNG_ROLES = ("rng_key", "rng_count")


@dataclass(frozen=True)
class Line:
    slope: float
    intercept: float
    exact: bool  # every measured depth lies on the line

    def at(self, layers: int) -> float:
        return self.intercept + self.slope * layers


@dataclass(frozen=True)
class Projection:
    """A series' counts at one depth (the model's full depth by default), rounded: counts are integers."""

    layers: int
    entry_params: int
    by_dtype: Mapping[str, int]  # dtypes whose count is not 0
    by_role: Mapping[str, int]
    launches: Mapping[str, int] | None = None  # GPU series: launches per step by LAUNCH_COUNTS key

    def to_record(self) -> dict:
        record = {"layers": self.layers, "entry_params": self.entry_params, "by_dtype": dict(self.by_dtype),
                  "by_role": dict(self.by_role)}
        if self.launches is not None:
            record["launches"] = dict(self.launches)
        return record


@dataclass(frozen=True)
class Series:
    cell: Cell  # the shallowest measured cell of the series
    depths: tuple[int, ...]
    total: Line
    by_dtype: dict[str, Line]
    by_role: dict[str, Line]
    full_depth: int | None
    # GPU cells: launches per step by LAUNCH_COUNTS key, and what the deepest cell launches beyond the shallowest
    # of the launches that read RNG state.
    launches: dict[str, Line] | None = None
    launch_groups: tuple[LaunchGroup, ...] = ()
    # RNG parameters per layer by path pattern, where they grow with depth (what an RNG-scaling finding names).
    rng_patterns: Mapping[str, float] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return self.cell.series_id()

    def projection(self, layers: int | None = None) -> Projection | None:
        """Counts at ``layers`` (default: the model's full depth); None when the depth is not known."""
        depth = layers if layers is not None else self.full_depth
        if depth is None:
            return None
        return Projection(
            layers=depth, entry_params=round(self.total.at(depth)),
            by_dtype={k: round(v.at(depth)) for k, v in self.by_dtype.items() if round(v.at(depth))},
            by_role={k: round(v.at(depth)) for k, v in self.by_role.items() if round(v.at(depth))},
            launches={k: round(v.at(depth)) for k, v in self.launches.items()} if self.launches else None)

    def projected(self, layers: int | None = None) -> dict:
        """The projection's record, as the scaling JSON prints it (``{}`` when the depth is not known)."""
        projection = self.projection(layers)
        return projection.to_record() if projection is not None else {}


def fit_line(points: list[tuple[int, int]]) -> Line:
    """Least squares through (layers, count) points; exact when every point is on the line."""
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    var = sum((x - mean_x) ** 2 for x, _ in points)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / var if var else 0.0
    intercept = mean_y - slope * mean_x
    exact = all(abs(intercept + slope * x - y) < 1e-9 for x, y in points)
    return Line(slope=_tidy(slope), intercept=_tidy(intercept), exact=exact)


def _tidy(value: float) -> float | int:
    """Parameter counts are integers: print 27, not 27.0 (goldens and JSON stay readable)."""
    value = round(value, 6)
    return int(value) if value.is_integer() else value


def rng_pattern_growth(shallow: LoweredCell, deep: LoweredCell) -> dict[str, float]:
    """RNG parameters per layer by path pattern, from the shallowest depth to the deepest, where they grow (largest
    first); empty when either side holds no parameters (a depth read back from its golden)."""
    if not shallow.params or not deep.params or deep.cell.layers == shallow.cell.layers:
        return {}

    def rng(result: LoweredCell) -> dict[str, int]:
        return {p: sum(n for role, n in roles.items() if role in RNG_ROLES)
                for p, roles in result.groups_by_role().items()}

    before, after = rng(shallow), rng(deep)
    layers = deep.cell.layers - shallow.cell.layers
    grown = {p: _tidy((n - before.get(p, 0)) / layers) for p, n in after.items() if n > before.get(p, 0)}
    return dict(sorted(grown.items(), key=lambda kv: (-kv[1], kv[0])))


def fit_series(results: Iterable[CellResult], full_depth: Callable[[str], int | None] | None = None) -> list[Series]:
    """One Series per group of ok cells that differ only in depth and cover two or more depths."""
    groups: dict[tuple, dict[int, LoweredCell]] = defaultdict(dict)
    for r in results:
        if isinstance(r, LoweredCell):
            groups[r.cell.series][r.cell.layers] = r
    series = []
    for by_depth in groups.values():
        if len(by_depth) < 2:
            continue
        depths = tuple(sorted(by_depth))
        rows = [by_depth[d] for d in depths]

        def line(kind: str | None, name: str | None = None) -> Line:
            if kind is None:
                return fit_line([(d, r.entry_params) for d, r in zip(depths, rows)])
            return fit_line([(d, r.count(kind, name)) for d, r in zip(depths, rows)])

        dtypes = sorted({k for r in rows for k in r.summary.by_dtype})
        roles = sorted({k for r in rows for k in r.summary.by_role})
        model = rows[0].cell.model
        launched = all(r.launches for r in rows)
        series.append(Series(
            cell=rows[0].cell, depths=depths, total=line(None),
            by_dtype={k: line("by_dtype", k) for k in dtypes}, by_role={k: line("by_role", k) for k in roles},
            full_depth=_safe_depth(full_depth, model),
            launches={k: fit_line([(d, getattr(r.launches, k)) for d, r in zip(depths, rows)])
                      for k in LAUNCH_COUNTS} if launched else None,
            launch_groups=tuple(group_delta(rows[0].launches.groups, rows[-1].launches.groups, reading=RNG_ROLES))
            if launched else (),
            rng_patterns=rng_pattern_growth(rows[0], rows[-1]),
        ))
    return sorted(series, key=lambda s: s.id)


def _safe_depth(full_depth, model: str) -> int | None:
    if full_depth is None:
        return None
    try:
        return full_depth(model)
    except Exception:  # noqa: BLE001 (a target that cannot say: no projection, not a failure)
        return None


def rng_launch_slope(series: Series) -> float:
    """Launches per step that read RNG state, per layer (0 where the series has no launches)."""
    return series.launches["reading_rng"].slope if series.launches else 0


def rng_slope(series: Series) -> float:
    flat = Line(0, 0, True)
    return series.by_role.get("rng_key", flat).slope + series.by_role.get("rng_count", flat).slope
