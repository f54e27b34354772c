"""Policies -> findings: what `hlo-audit check` decides about each cell against its golden.

Each rule is one module of ``rules`` (its spec: name, default action, tolerance, the kinds of change it reads, its
judge, the facts its findings carry), listed once in ``rules.registry.SPECS``; a config's ``[policy]`` sets each
rule's action (``fail``, ``warn`` or ``off``) and tolerance, and a waiver must carry a reason. Each judge is a pure
function of the cell's one comparison with its golden (``comparison.CellDelta``, which the reports and `diff` read too);
the gate applies the registry's judges (``rules.registry.judged``) and the policy and keeps no state. What a cell's
golden wants (none, unreadable, another compiler stack's on a pinned run, its text unusable, parts lacking) is
decided once, in ``golden.health``, and is the ``missing_golden`` rule's finding. The gate makes the findings no judge
of one cell can: a cell that cannot be judged here (``unjudged``), a golden without a cell (``missing_golden``'s
``stale_goldens``), and waivers that waived nothing (``stale_waiver``). A gate may judge a selection of rules
(``Gate.rules``): `measure` judges ``host_cost`` alone, under the same policy and waivers.
Every finding is a typed record (``findings``): its place, rule, severity and the numbers behind it. The gate words
nothing (``report.words`` does); a waiver makes a new finding, of severity waived, that names the waiver.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import replace
from pathlib import Path

from hlo_audit.comparison import CellDelta
from hlo_audit.coverage import Coverage
from hlo_audit.findings import DeadRng, Finding, LoweringFailure, Matches, StaleWaiver, Unjudged
from hlo_audit.golden.snapshot import Golden, GoldenError, read_snapshot
from hlo_audit.judging.outcome import Outcome
from hlo_audit.matrix import Cell, matches_rule
from hlo_audit.plan import Plan, full_matrix_of
from hlo_audit.policy import Policy, Waiver
from hlo_audit.provenance import tree_digest
from hlo_audit.results import CellResult, LoweredCell, Severity, UnavailableCell
from hlo_audit.rules import missing_golden, registry, unreached
from hlo_audit.rules.registry import Rule
from hlo_audit.rules.spec import Context, Subject
from hlo_audit.scaling import Series
from hlo_audit.stack import StackMode, environment_problem, stack_mode, why_pinned


def refused_claim(result: CellResult, stored: Golden | None) -> str | None:
    """Why a cell's golden claims what hlo-audit never writes, naming its file and key (a check refuses it, exit 2,
    locally as on CI); None where it is its cell's. Its keys' own claims (``record.claim_problem``), and its
    environment read against what this stack records for the cell (``stack.environment_problem``)."""
    if stored is None:
        return None
    if stored.invalid:
        return stored.damaged
    if stored.record is None or not isinstance(result, LoweredCell):
        return None
    problem = environment_problem(stored.record.environment, result.environment)
    return None if problem is None else f"{stored.summary or result.cell.id}: not a golden summary: {problem}"


def regenerate_command(config_path: str | None) -> str:
    return "hlo-audit golden update" + (f" --config {config_path}" if config_path else "")


def judged(plan: Plan, results: Sequence[CellResult], regenerate: str, report_stale: bool = True,
           prepare=None, rules: Collection[str] | None = None, coverage: Coverage | None = None) -> Outcome:
    """The plan's outcome judged under its config's policy, against one tree of goldens, whole: judged again when
    a ``golden update`` swapped the tree meanwhile (``golden.snapshot.read_snapshot``). ``prepare(tree, results)``:
    the results completed from that same tree first (``host_figures.with_host_figures``: each file read once).
    ``rules``: the rules judged (None: every rule, as `check` judges; `measure`: ``host_cost``); ``coverage``: what
    the cells reached of the pull request's changed lines (``check --changes``)."""
    # The project's files as the cells were judged on them, by content (what `merge` compares beside the commit).
    project = tree_digest(plan.config.project or Path.cwd(), plan.config.cache_dir, plan.config.golden_dir)

    def judge(tree):
        outcome = replace(Outcome.of(plan, prepare(tree, results) if prepare else results, tree).against(
            tree.digest(), project), coverage=coverage)
        return Gate(plan.config.rules, regenerate, rules=rules).judge(outcome, report_stale)

    return read_snapshot(plan.config.golden_dir, judge)


class Gate:
    """Applies the registry's judges (``rules.registry.judged``) under a policy: what each rule found, then the
    policy's action and the waivers, each making a new finding. Holds nothing between cells: the waivers used are read
    off the findings (``used_waivers``)."""

    def __init__(self, policy: Policy, regenerate: str, pinned_by: str | None = "",
                 rules: Collection[str] | None = None):
        self.policy = policy
        self.regenerate = regenerate  # "hlo-audit golden update" (+ --config when not the default)
        # The rules this gate judges, those it makes itself included (missing_golden, unjudged, stale_waiver); None:
        # every rule (`check`). `measure` judges what it measured, host_cost, under the same policy and waivers: a
        # cell without a golden, or another stack's, is no failure of a measurement.
        self.rules = frozenset(rules) if rules is not None else None
        # What made this run's stack pinned (``CI=true``; ``stack.stack_mode``, read here once), None for a local
        # run: pinned, a golden of another compiler stack fails and relaxes nothing.
        if pinned_by == "":
            pinned_by = why_pinned() if stack_mode() is StackMode.PINNED else None
        self.pinned_by = pinned_by

    def judges(self, rule: str) -> bool:
        return self.rules is None or rule in self.rules

    def command_for(self, series: dict[str, tuple[str, ...]]):
        """The golden update that accepts what is found at a cell: its whole depth series, since each depth's golden
        holds the series' slopes, and a golden of one depth refreshed alone would hold a slope made of its new count
        and the other depths' old ones (issue 26: the printed command then looped)."""
        def command(cell_id: str) -> str:
            ids = series.get(cell_id, (cell_id,))
            return f"{self.regenerate} --only {','.join(f'id={i}' for i in ids)}"
        return command

    def command(self, cell_id: str) -> str:
        return self.command_for({})(cell_id)

    def judge(self, outcome: Outcome, report_stale: bool = True) -> Outcome:
        """The outcome with every finding about it and each cell's comparison with its golden (``comparison.CellDelta``,
        built once: the formats read it): each cell against its golden (its text where it keeps one), the goldens
        without a cell (``report_stale``: one shard of a sharded run reports them) and waivers left over."""
        context = registry.context(self.policy, self.command_for(series_ids(outcome.plan)), self.pinned_by)
        findings: list[Finding] = []
        used: set[int] = set()
        deltas: dict[str, CellDelta] = {}
        for r in outcome.results:
            stored = outcome.goldens.golden(r.cell.id)
            refused = refused_claim(r, stored)
            if refused is not None:  # a claim hlo-audit never writes: refused, not judged
                raise GoldenError(f"{refused}; rewrite it with: {context.command(r.cell.id)}")
            delta = outcome.delta(r, texts=True, pinned=self.pinned_by is not None)
            if delta is not None:
                deltas[r.cell.id] = delta
            kept, found = self.judge_cell(r, stored, delta, outcome.leads(r), context)
            findings.extend(kept)
            used |= used_waivers(kept) | used_waivers(found)
        plan = outcome.plan
        matrix = plan.full_matrix if plan.full_matrix is not None else full_matrix_of(plan)
        if report_stale and self.judges(Rule.MISSING_GOLDEN):
            findings.extend(missing_golden.stale_goldens(outcome.goldens.stored_ids(), {c.id for c in matrix}))
        if self.judges(Rule.STALE_WAIVER):
            findings.extend(stale_waivers(self.policy, used, outcome.results, matrix))
        if outcome.coverage is not None and self.judges(Rule.UNREACHED):
            # The policy it is judged by goes with the record: `merge` judges the shards' union by it.
            outcome = replace(outcome, coverage=replace(
                outcome.coverage, action=self.policy.action(Rule.UNREACHED, registry.spec_of(Rule.UNREACHED).action),
                waivers=tuple(w for w in self.policy.waivers if w.rule == Rule.UNREACHED)))
            findings.extend(unreached_findings(self.policy, outcome.coverage))
        return outcome.judged(findings, deltas)

    def _apply(self, finding: Finding, cell: Cell) -> Finding | None:
        """Policy and waivers turn a would-be regression into a warning, a waived finding, or nothing
        (``registry.applied``: by the rule the finding is of, its spec's default where the config names none)."""
        return registry.applied(self.policy, finding, cell)

    def judge_cell(self, result: CellResult, golden: Golden | None, delta: CellDelta | None, leads: Series | None,
                   context: Context | None = None) -> tuple[list[Finding], list[Finding]]:
        """The cell's findings after the policy, and before it (what the rules found: waivers a rule matched count as
        used whatever the policy's action)."""
        cid = result.cell.id
        context = context or registry.context(self.policy, self.command, self.pinned_by)
        if not isinstance(result, LoweredCell):
            return self._not_lowered(result, golden)
        found = registry.judge(Subject(result, golden, delta, leads), context, self.rules)
        kept = [f for f in (self._apply(f, result.cell) for f in found) if f is not None]
        return kept or [Finding(cid, Severity.OK, Rule.ALL, Matches())], found

    def _not_lowered(self, result: CellResult, golden: Golden | None) -> tuple[list[Finding], list[Finding]]:
        """A cell that did not lower: an error fails; an unavailable one with a golden is a cell the check cannot
        judge (``unjudged``: it fails unless a waiver with a reason accepts it), one without a golden is said."""
        cid = result.cell.id
        if isinstance(result, UnavailableCell) and golden is not None and self.judges(Rule.UNJUDGED):
            found = [Finding(cid, Severity.REGRESSION, Rule.UNJUDGED, Unjudged(
                str(result.status), result.message, str(golden.summary or golden.cell_id)))]
            kept = [f for f in (self._apply(f, result.cell) for f in found) if f is not None]
            return kept or [Finding(cid, Severity.UNAVAILABLE, Rule.LOWERING, LoweringFailure(result.message))], found
        severity = Severity.UNAVAILABLE if isinstance(result, UnavailableCell) else Severity.ERROR
        failed = [Finding(cid, severity, Rule.LOWERING, LoweringFailure(result.message))]
        return failed, failed


def series_ids(plan: Plan | None) -> dict[str, tuple[str, ...]]:
    """Each cell of the plan's matrix (and run) -> the ids of its depth series there, shallowest first."""
    if plan is None:
        return {}
    members: dict[tuple, dict[int, str]] = {}
    for cell in (*plan.matrix, *plan.cells):
        members.setdefault(cell.series, {})[cell.layers] = cell.id
    return {cid: tuple(ids[d] for d in sorted(ids)) for ids in members.values() for cid in ids.values()}


def stale_waivers(policy: Policy, used: set[int], judged: Sequence[CellResult],
                  matrix: Sequence[Cell]) -> list[Finding]:
    """Waivers that waived nothing (``used``: the indexes of those that did), although every cell of the matrix they
    cover was judged here: a fix landed (or the waiver never matched), and a waiver left behind would hide the
    regression coming back. Policy ``stale_waiver`` (default warn) says what that is (``registry.applied``)."""
    judged_ids = {r.cell.id for r in judged if r.ok}
    findings = []
    for waiver in policy.waivers:
        if waiver.path is not None:
            continue  # a path no cell needs to reach stays so whatever one pull request changed
        covered = [c.id for c in matrix if matches_rule(c, waiver.match)]
        if waiver.index in used or not set(covered) <= judged_ids or (waiver.built_in and not covered):
            continue  # a built-in waiver for cells this config's matrix leaves out is no one's to drop
        found = Finding(waiver.source, Severity.REGRESSION, Rule.STALE_WAIVER, StaleWaiver(waiver, len(covered)))
        if (kept := registry.applied(policy, found, None)) is not None:
            findings.append(kept)
    return findings


def unreached_findings(policy: Policy, coverage: Coverage) -> list[Finding]:
    """The changed lines of model code no cell reached (``rules.unreached``), as the policy has them: the runs of a
    path a waiver names, waived by it (one finding per waiver), the others one finding under the rule's action."""
    if not coverage.cells:
        return []  # no cell's reach is known (none lowered): nothing is claimed unreached
    by_waiver: dict[int, list] = {}
    waivers: dict[int, Waiver] = {}
    kept = []
    for run in coverage.unreached_runs:
        waiver = policy.path_waiver(Rule.UNREACHED, run.path)
        if waiver is None:
            kept.append(run)
        else:
            by_waiver.setdefault(waiver.index, []).append(run)
            waivers[waiver.index] = waiver
    findings = [Finding(unreached.PLACE, Severity.REGRESSION, Rule.UNREACHED,
                        unreached.Unreached(tuple(runs), len(coverage.cells))).waived(waivers[index])
                for index, runs in by_waiver.items()]
    if kept:
        found = Finding(unreached.PLACE, Severity.REGRESSION, Rule.UNREACHED,
                        unreached.Unreached(tuple(kept), len(coverage.cells)))
        if (applied := registry.applied(policy, found, None)) is not None:
            findings.append(applied)
    return findings


def used_waivers(findings: Sequence[Finding]) -> set[int]:
    """The indexes of the waivers that waived something among ``findings``: a waived finding's, and the patterns a
    dead-RNG finding set apart."""
    used = {w.index for f in findings for w in f.waivers}
    used.update(w.index for f in findings if isinstance(f.facts, DeadRng) for w in f.facts.waived_patterns.values())
    return used
