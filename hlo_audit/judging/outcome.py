"""One command's outcome, built once: the plan, every cell's result, the depth series, the goldens (one snapshot of
the store), and, once the gate has judged it, the findings with everything every format prints about them (each
cell's verdict, the counts, what a human must read, the series' rows), decided when it is judged.

``check``, ``golden update``, ``report``, ``merge`` and the pytest plugin all read an ``Outcome``; none of them
groups cells into series, loads a golden or decides an owner, a count or a verdict again: formatters read its
fields. Built as jax builds its stages: ``Outcome.of`` (results in), then ``gate.Gate.judge`` returns the judged
one (``judged``); shards' judged outcomes come back as one (``merged``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property

from hlo_audit.comparison import CellDelta
from hlo_audit.coverage import Coverage
from hlo_audit.findings import Accept, Finding, worst
from hlo_audit.golden.snapshot import Snapshot
from hlo_audit.hlo.locations import placed_by_change
from hlo_audit.plan import Plan, Shard
from hlo_audit.results import CellResult, FailedCell, LoweredCell, Severity
from hlo_audit.rules import registry
from hlo_audit.scaling import Series, fit_series
from hlo_audit.usage import EXIT_DIFFERENCE, EXIT_OK

# What a human need not read one by one in the summary view: a cell that matches its golden (the "ok"
# placeholder), one this host cannot lower (listed in a line per reason), a waived finding (its waiver says why).
QUIET_SEVERITIES = frozenset({Severity.OK, Severity.UNAVAILABLE, Severity.WAIVED})


@dataclass(frozen=True)
class CheckSummary:
    """The numbers every format of a check prints, decided once (``Outcome.summary``).

    ``cells``: the cells checked (stale goldens are not cells: they are counted apart). Each cell has one verdict,
    its worst finding once advisories are folded (a spec's ``folds``: dead RNG state, which has its own column
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


@dataclass(frozen=True)
class SeriesRow:
    """A depth series' cells that lowered, shallowest first, with the worst verdict among them: one row of the
    check's summary table."""

    label: str  # llama3-8b/scan-off/int8/L2,4
    results: tuple[LoweredCell, ...]
    verdict: Severity


@dataclass(frozen=True)
class Outcome:
    plan: Plan | None  # None: merged shards
    results: tuple[CellResult, ...]
    goldens: Snapshot | None = None  # None: merged shards (their goldens were the shards')
    shard: Shard | None = None  # which shard of which selection this is
    # The digest of the project tree it judged (``provenance.tree_digest``: what `merge` compares beside the commit);
    # "" where none was taken (an outcome built by hand).
    tree: str = ""
    findings: tuple[Finding, ...] = ()
    # Each cell's comparison with its golden, built once by the gate (``comparison.CellDelta``): every number a format
    # prints about a cell's difference is read here. Empty for merged shards (their findings carry the words).
    deltas: Mapping[str, CellDelta] = field(default_factory=dict)
    # Decided when judged (``judged``), read by every format: each cell's verdict, the numbers, what a human must
    # read one by one (``attention``; ``findings`` with --verbose), the folded advisories, the series' rows.
    cell_ids: tuple[str, ...] = ()  # the cells checked, in the order they ran (merged: shard by shard)
    verdicts: Mapping[str, Severity] = field(default_factory=dict)
    summary: CheckSummary | None = None
    finding_counts: Mapping[Severity, int] = field(default_factory=dict)  # JSON's `summary`: every finding
    by_severity: Mapping[Severity, tuple[Finding, ...]] = field(default_factory=dict)
    attention: tuple[Finding, ...] = ()
    folded: tuple[Finding, ...] = ()
    folded_dead_params: int = 0
    stale_goldens: tuple[str, ...] = ()  # goldens without a cell in the matrix (not cells: counted apart)
    # What the cells reached of the pull request's changed lines (``check --changes``), None where none were given.
    coverage: Coverage | None = None
    rows: tuple[SeriesRow, ...] = ()
    # The one golden update that accepts every failing cell listed (``findings.Accept``), None when none can be.
    accept: Accept | None = None
    exit_code: int = 0
    passed: bool = True

    @classmethod
    def of(cls, plan: Plan, results: Sequence[CellResult], goldens: Snapshot | None = None) -> Outcome:
        """The outcome of running ``plan``: its results with its golden store (read when first needed)."""
        return cls(plan=plan, results=tuple(results),
                   goldens=goldens if goldens is not None else Snapshot(plan.config.golden_dir), shard=plan.shard)

    @classmethod
    def merged(cls, results: Sequence[CellResult], findings: Sequence[Finding], shard: Shard | None,
               tree: str = "", coverage: Coverage | None = None) -> Outcome:
        """Shards' outcomes as one: their results and findings as each shard judged them (``tree``: the tree they
        all judged; ``coverage``: what their cells reached of the change, together)."""
        return cls(plan=None, results=tuple(results), shard=shard, tree=tree, coverage=coverage).judged(findings)

    def against(self, goldens: str, tree: str = "") -> Outcome:
        """This outcome with its shard's record naming the goldens it is judged against (the digest of the whole
        golden tree) and the project tree it judged (``provenance.tree_digest``): what `merge` compares; the judge
        as it is where the record has none (built by hand)."""
        if self.shard is None or self.shard.judge is None:
            return replace(self, tree=tree)
        return replace(self, shard=replace(self.shard, judge=replace(self.shard.judge, goldens=goldens)), tree=tree)

    def judged(self, findings: Sequence[Finding], deltas: Mapping[str, CellDelta] | None = None) -> Outcome:
        """This outcome with the gate's findings (and its comparisons with the goldens), and everything the formats
        print about them decided now."""
        findings = tuple(findings)
        cell_ids = tuple(dict.fromkeys(r.cell.id for r in self.results))
        listed = [f for f in findings if not _folds(f)]
        folded = tuple(f for f in findings if _folds(f))
        verdicts = _verdicts(cell_ids, listed)
        stale = tuple(sorted({f.cell for f in findings if f.severity is Severity.STALE and f.cell not in verdicts}))
        exit_code = 1 if any(f.failing for f in findings) else 0
        by_verdict: dict[Severity, int] = {}
        for verdict in verdicts.values():
            by_verdict[verdict] = by_verdict.get(verdict, 0) + 1
        summary = CheckSummary(
            passed=not exit_code, exit_code=exit_code, cells=len(cell_ids), cells_by_verdict=_in_order(by_verdict),
            findings_by_severity=_in_order(_counts([f for f in findings if f.severity is not Severity.OK])),
            folded=len(folded), stale_goldens=len(stale))
        return replace(
            self, findings=findings, deltas=dict(deltas or {}), cell_ids=cell_ids, verdicts=verdicts, summary=summary,
            finding_counts=_counts(findings), by_severity=_by_severity(findings),
            attention=tuple(f for f in listed if f.severity not in QUIET_SEVERITIES), folded=folded,
            folded_dead_params=sum(f.dead_params for f in folded), stale_goldens=stale,
            rows=_rows(self.results, verdicts), accept=Accept.of(findings), exit_code=exit_code,
            passed=not exit_code)

    # -- each cell's comparison with its golden, built here only ---------------------------------------------

    @cached_property
    def _compared(self) -> dict[tuple[str, bool, bool], CellDelta | None]:
        return {}

    def delta(self, result: CellResult, texts: bool = False, pinned: bool = False) -> CellDelta | None:
        """The cell's comparison with its golden (``comparison.CellDelta``; None: the cell did not lower, or has no
        readable golden), built here and nowhere else, once per cell: once judged, the one the gate judged by
        (``deltas``); before, built now and kept. ``texts``: the cell's canonical text is compared with its golden's
        where the plan says the cell owns it (the gate, `explain`; `report` reads counts only and never pays for a
        text); ``pinned``: the run's compiler stack is pinned (the gate's, ``comparison.CellDelta.environment``)."""
        if self.summary is not None or self.goldens is None:
            return self.deltas.get(result.cell.id)
        key = (result.cell.id, texts, pinned)
        if key not in self._compared:
            owns_text = texts and self.plan is not None and result.cell.id in self.plan.owners
            changed = self.coverage.changed_frames if self.coverage is not None else frozenset()
            if changed and isinstance(result, LoweredCell) and result.places:
                # Where the pull request's changed lines are known, a change is placed at the one its stacks pass.
                result = replace(result, places=placed_by_change(result.places, changed))
            configs = self.coverage.config_reached(result.cell.id) if self.coverage is not None else ()
            self._compared[key] = CellDelta.for_cell(result, self.goldens.golden(result.cell.id), self.leads(result),
                                                     owns_text, pinned, changed, configs)
        return self._compared[key]

    # -- the series, decided once ----------------------------------------------------------------------------

    @cached_property
    def series(self) -> list[Series]:
        """The depth series fitted on this run's results (two or more depths that lowered)."""
        return fit_series(self.results, self.plan.full_depth if self.plan is not None else None)

    @cached_property
    def _series_by_key(self) -> dict[tuple, Series]:
        return {s.cell.series: s for s in self.series}

    def leads(self, result: CellResult) -> Series | None:
        """The cell's series when the cell is its shallowest: where what is the series' is reported, once."""
        series = self._series_by_key.get(result.cell.series)
        return series if series is not None and series.cell == result.cell else None

    @cached_property
    def slopes_by_cell(self) -> dict[str, float]:
        """Each planned cell's series' entry parameters per layer (cells of a series of one depth have none)."""
        return {c.id: self._series_by_key[c.series].total.slope for c in self.plan.cells
                if c.series in self._series_by_key}

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


@dataclass(frozen=True)
class Lowered:
    """What `run` and `scaling` print and exit by (no golden is read): every cell's result, each planned cell's
    series' slope per layer, the depth series fitted (``Outcome.series``)."""

    results: list[CellResult]
    slopes: Mapping[str, float]
    series: list[Series]

    @classmethod
    def of(cls, outcome: Outcome) -> Lowered:
        return cls(list(outcome.results), outcome.slopes_by_cell, outcome.series)

    @property
    def failed(self) -> bool:
        """A cell failed (an unavailable one is not a failure)."""
        return any(isinstance(r, FailedCell) for r in self.results)

    @property
    def exit_code(self) -> int:
        return EXIT_DIFFERENCE if self.failed else EXIT_OK


def _folds(finding: Finding) -> bool:
    return finding.severity is Severity.ADVISORY and finding.rule in registry.folded()


def _verdicts(cell_ids: Sequence[str], listed: Sequence[Finding]) -> dict[str, Severity]:
    """Each checked cell's verdict: its worst finding once advisories are folded (a cell whose only findings were
    folded is ok). The same with or without ``--verbose``, which lists more and decides nothing."""
    by_cell: dict[str, list[Finding]] = {cid: [] for cid in cell_ids}
    for f in listed:
        if f.cell in by_cell:
            by_cell[f.cell].append(f)
    return {cid: worst(fs) for cid, fs in by_cell.items()}


def _counts(findings: Sequence[Finding]) -> dict[Severity, int]:
    counts: dict[Severity, int] = {}
    for f in findings:
        counts[f.severity] = counts.get(f.severity, 0) + 1
    return dict(sorted(counts.items()))


def _in_order(counts: Mapping[Severity, int]) -> dict[Severity, int]:
    """Least severe first (``ok`` before ``regression``), as every format prints them; zero counts left out."""
    return {k: counts[k] for k in sorted(counts, key=lambda s: s.rank) if counts[k]}


def _by_severity(findings: Sequence[Finding]) -> dict[Severity, tuple[Finding, ...]]:
    grouped: dict[Severity, list[Finding]] = {}
    for f in findings:
        grouped.setdefault(f.severity, []).append(f)
    return {s: tuple(fs) for s, fs in grouped.items()}


def _rows(results: Sequence[CellResult], verdicts: Mapping[str, Severity]) -> tuple[SeriesRow, ...]:
    """The cells that lowered by depth series, in the order the results came, each shallowest first; a series of
    one depth is a row of one cell."""
    grouped: dict[tuple, list[LoweredCell]] = {}
    for r in results:
        if isinstance(r, LoweredCell):
            grouped.setdefault(r.cell.series, []).append(r)
    rows = []
    for members in grouped.values():
        members.sort(key=lambda r: r.cell.layers)
        verdict = max((verdicts.get(r.cell.id, Severity.OK) for r in members), key=lambda s: s.rank)
        rows.append(SeriesRow(members[0].cell.series_id([r.cell.layers for r in members]), tuple(members), verdict))
    return tuple(rows)
