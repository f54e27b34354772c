"""One command's outcome, built once: the plan, every cell's result, the depth series, the goldens (one snapshot of
the store), which cells keep the golden text, and, once the gate has judged it, the findings with everything every
format prints about them (each cell's verdict, the counts, what a human must read).

``check``, ``golden update``, ``report``, ``merge`` and the pytest plugin all read an ``Outcome``; none of them
groups cells into series, loads a golden or decides an owner or a verdict again. Built as jax builds its stages:
``Outcome.of`` (results in), then ``gate.Gate.judge`` returns the judged one (``judged``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property

from hlo_audit.findings import Finding, worst
from hlo_audit.golden.store import Snapshot
from hlo_audit.plan import Plan, Shard
from hlo_audit.policy import Rule
from hlo_audit.results import CellResult, Severity
from hlo_audit.scaling import Series, fit_series

# Advisories that hold for most cells of a real model (MaxText carries dead RNG state in every cell today):
# reports fold them into one line unless asked for every finding.
FOLDED_ADVISORIES = frozenset({Rule.DEAD_RNG})
# What a human need not read one by one in the summary view: a cell that matches its golden (the "ok"
# placeholder), one this host cannot lower (listed in a line per reason), a waived finding (its waiver says why).
QUIET_SEVERITIES = frozenset({Severity.OK, Severity.UNAVAILABLE, Severity.WAIVED})


@dataclass(frozen=True)
class CheckSummary:
    """The numbers every format of a check prints, decided once (``Outcome.summary``).

    ``cells``: the cells checked (stale goldens are not cells: they are counted apart). Each cell has one verdict,
    its worst finding once advisories are folded (``FOLDED_ADVISORIES``: dead RNG state, which has its own column
    and line); ``cells_by_verdict`` counts cells and sums to ``cells``. ``findings_by_severity`` counts findings
    (what the gate said, several per cell at most), the "matches its golden" placeholders left out; ``folded``
    of the advisories among them are folded into one line.
    """

    passed: bool
    exit_code: int
    cells: int
    cells_by_verdict: Mapping[Severity, int]
    findings_by_severity: Mapping[Severity, int]
    folded: int
    stale_goldens: int


def severity_counts(findings: Sequence[Finding]) -> dict[Severity, int]:
    counts: dict[Severity, int] = {}
    for f in findings:
        counts[f.severity] = counts.get(f.severity, 0) + 1
    return dict(sorted(counts.items()))


def _in_severity_order(counts: Mapping[Severity, int]) -> dict[Severity, int]:
    """Least severe first (``ok`` before ``regression``), as every format prints them; zero counts left out."""
    return {k: counts[k] for k in sorted(counts, key=lambda s: s.rank) if counts[k]}


def fold_advisories(findings: Sequence[Finding]) -> tuple[list[Finding], list[Finding]]:
    """(findings to list one by one, folded advisories)."""
    folded = [f for f in findings if f.severity is Severity.ADVISORY and f.rule in FOLDED_ADVISORIES]
    return [f for f in findings if f not in folded], folded


@dataclass(frozen=True)
class SeriesRow:
    """A depth series' cells that lowered, shallowest first: one row of the check's summary table."""

    results: tuple[CellResult, ...]

    @property
    def label(self) -> str:
        return self.results[0].cell.series_id([r.cell.layers for r in self.results])

    @property
    def cell_ids(self) -> list[str]:
        return [r.cell.id for r in self.results]


@dataclass(frozen=True)
class Outcome:
    plan: Plan | None  # None: merged shards
    results: tuple[CellResult, ...]
    goldens: Snapshot | None = None  # None: merged shards (their goldens were the shards')
    findings: tuple[Finding, ...] = ()
    shard: Shard | None = None  # which shard of which selection this is
    judged_: bool = field(default=False, repr=False)

    @classmethod
    def of(cls, plan: Plan, results: Sequence[CellResult], goldens: Snapshot | None = None) -> Outcome:
        """The outcome of running ``plan``: its results with its golden store (read when first needed)."""
        return cls(plan=plan, results=tuple(results),
                   goldens=goldens if goldens is not None else Snapshot(plan.config.golden_dir), shard=plan.shard)

    @classmethod
    def merged(cls, results: Sequence[CellResult], findings: Sequence[Finding], shard: Shard) -> Outcome:
        """Shards' outcomes as one: their results and findings as each shard judged them."""
        return cls(plan=None, results=tuple(results), findings=tuple(findings), shard=shard, judged_=True)

    def judged(self, findings: Sequence[Finding]) -> Outcome:
        return replace(self, findings=tuple(findings), judged_=True)

    # -- the series and the golden text, decided once ---------------------------------------------------------

    @cached_property
    def series(self) -> list[Series]:
        """The depth series fitted on this run's results (two or more depths that lowered)."""
        return fit_series(self.results, self.plan.full_depth if self.plan is not None else None)

    @cached_property
    def _series_by_key(self) -> dict[tuple, Series]:
        return {s.cell.series: s for s in self.series}

    def series_of(self, result: CellResult) -> Series | None:
        return self._series_by_key.get(result.cell.series)

    def leads(self, result: CellResult) -> Series | None:
        """The cell's series when the cell is its shallowest: where what is the series' is reported, once."""
        series = self.series_of(result)
        return series if series is not None and series.cell == result.cell else None

    @cached_property
    def slopes_by_cell(self) -> dict[str, float]:
        """Each planned cell's series' entry parameters per layer (cells of a series of one depth have none)."""
        cells = self.plan.cells if self.plan is not None else [r.cell for r in self.results]
        return {c.id: self._series_by_key[c.series].total.slope for c in cells if c.series in self._series_by_key}

    @cached_property
    def owners(self) -> frozenset[str]:
        """The cells whose golden keeps the canonical text (``Plan.text_owners``), for the gate and golden update."""
        return self.plan.text_owners([r.cell for r in self.results])

    @cached_property
    def recorded_series(self) -> dict[tuple, Series]:
        """The series a golden records: this run's results with the stored goldens of the depths it did not lower
        (``--only id=<one depth>``, or a depth that failed), so a partial run keeps a series' slopes."""
        lowered = {r.cell.id for r in self.results if r.ok}
        touched = {r.cell.series for r in self.results if r.ok}
        others = []
        for cell in self.plan.matrix:
            if cell.series in touched and cell.id not in lowered:
                stored = self.goldens.golden(cell.id)
                if stored is not None and stored.record is not None:
                    others.append(stored.record.as_result(cell))
        return {s.cell.series: s for s in fit_series([*self.results, *others], self.plan.full_depth)}

    @cached_property
    def rows(self) -> list[SeriesRow]:
        """The cells that lowered by depth series, in the order the results came (a merged outcome: shard by
        shard), each shallowest first; a series of one depth is a row of one cell."""
        grouped: dict[tuple, list[CellResult]] = {}
        for r in self.results:
            if r.ok:
                grouped.setdefault(r.cell.series, []).append(r)
        return [SeriesRow(tuple(sorted(rows, key=lambda r: r.cell.layers))) for rows in grouped.values()]

    # -- the judged outcome: what every format prints, decided here once --------------------------------------

    @property
    def failing(self) -> list[Finding]:
        return [f for f in self.findings if f.failing]

    @property
    def exit_code(self) -> int:
        return 1 if self.failing else 0

    @property
    def passed(self) -> bool:
        return not self.exit_code

    def listed_and_folded(self, verbose: bool = False) -> tuple[list[Finding], list[Finding]]:
        """(findings to list one by one, folded advisories); ``verbose`` folds nothing."""
        return (list(self.findings), []) if verbose else fold_advisories(self.findings)

    @cached_property
    def folded(self) -> list[Finding]:
        return fold_advisories(self.findings)[1]

    @property
    def folded_dead_params(self) -> int:
        return sum(f.dead_params for f in self.folded)

    @cached_property
    def cell_ids(self) -> list[str]:
        """The cells checked, in the order they ran (a merged outcome: shard by shard)."""
        return list(dict.fromkeys(r.cell.id for r in self.results))

    @cached_property
    def verdicts(self) -> dict[str, Severity]:
        """Each checked cell's verdict: its worst finding once advisories are folded (a cell whose only findings
        were folded is ok). The same with or without ``--verbose``, which lists more and decides nothing."""
        listed = fold_advisories(self.findings)[0]
        by_cell: dict[str, list[Finding]] = {cid: [] for cid in self.cell_ids}
        for f in listed:
            if f.cell in by_cell:
                by_cell[f.cell].append(f)
        return {cid: worst(fs) for cid, fs in by_cell.items()}

    @cached_property
    def stale_goldens(self) -> list[str]:
        """Goldens without a cell in the matrix (not cells: no verdict, counted apart)."""
        checked = set(self.cell_ids)
        return sorted({f.cell for f in self.findings if f.severity is Severity.STALE and f.cell not in checked})

    @cached_property
    def summary(self) -> CheckSummary:
        cells_by_verdict: dict[Severity, int] = {}
        for verdict in self.verdicts.values():
            cells_by_verdict[verdict] = cells_by_verdict.get(verdict, 0) + 1
        return CheckSummary(
            passed=self.passed, exit_code=self.exit_code, cells=len(self.cell_ids),
            cells_by_verdict=_in_severity_order(cells_by_verdict),
            findings_by_severity=_in_severity_order(severity_counts(
                [f for f in self.findings if f.severity is not Severity.OK])),
            folded=len(self.folded), stale_goldens=len(self.stale_goldens))

    def attention(self, verbose: bool = False) -> list[Finding]:
        """The findings a human must read, one by one: every finding that is not quiet (``QUIET_SEVERITIES``) and
        not folded; ``verbose``: every finding."""
        if verbose:
            return list(self.findings)
        return [f for f in fold_advisories(self.findings)[0] if f.severity not in QUIET_SEVERITIES]

    def of_severity(self, severity: Severity) -> list[Finding]:
        return [f for f in self.findings if f.severity == severity]

    @property
    def finding_counts(self) -> dict[Severity, int]:
        """Every finding by severity, the placeholders included: JSON's ``summary`` (schema v1)."""
        return severity_counts(self.findings)

    def series_verdict(self, row: SeriesRow) -> Severity:
        """The worst verdict of a series' cells (its row)."""
        return max((self.verdicts.get(c, Severity.OK) for c in row.cell_ids), key=lambda s: s.rank,
                   default=Severity.OK)

