"""Policies -> findings: what `hlo-audit check` decides about each cell against its golden.

Rules (each ``fail``, ``warn`` or ``off`` in the config's ``[policy]``; a waiver must carry a reason):

* ``count``: a ratchet. More entry parameters of any dtype or role than the golden is a regression; fewer
  is an improvement that asks to tighten the golden. State captured as constants counts the same way, in
  arrays and bytes per dtype: a step that starts baking state into its program fails like one that grows
  its entry parameters (``hlo_audit.hlo.constants``). So do RNG counter increments per step (dead, drawn or
  unknown, from the RNG analysis): each is a kernel on a GPU, and seed 000's 672 dead ones came with no new
  parameter where streams were shared. A finding lists the path patterns that grew, shrank or were renamed
  (with their roles), the streams whose increments grew, and the series' per-layer slopes against the golden's: a
  slope steeper than the golden's is growth, a regression (never an improvement), and every finding's accept
  command names the cell's whole depth series, since each depth's golden holds the series' slopes.
  A GPU cell's launches per step count the same way:
  more kernels (in all, or scalar ones) or collectives per step than the golden is a regression, and the
  finding says which launches came, and what they read (``+42 scalar kernels loop_add_fusion, each reading
  state.model.decoder.layers_*.*.to_nnx__rngs.*.count``).
* ``rng_scaling``: in an unrolled (scan off) series, RNG parameters must not grow with depth. That growth
  is the seed-000 bug: per-layer RNG state the host marshals every step.
* ``launch_scaling``: in an unrolled series of GPU cells, the kernels that read RNG state must not grow with
  depth either: each is a launch in the step's dependency chain (seed 000 measured 673 such counter kernels per
  step on 8xH100 as 8% of step time), and a stream shared across layers adds them without a parameter.
* ``hlo_text``: the normalized module must equal the golden's when the compiler stack the golden records (jax,
  jaxlib, libtpu, CUDA, TE, platform, stage: ``stack.is_compiler``) equals this run's; otherwise, on a local run,
  the difference is advisory and the counts and the named rules still gate. On a pinned run (CI,
  ``stack.stack_mode``) a golden of another stack is a ``missing_golden`` regression and nothing is relaxed. The
  code under test's versions (maxtext, flax, a user's library) never relax anything. A difference carries `diff`'s
  verdict and kinds: one that is RNG state only,
  dropped, is an improvement to accept (a fix like seed 001's), not a regression; one that only renames entry
  parameters (``renamed-only``) is an advisory listing the renames, which ``golden update`` records.
* The named rules (``named_rules``; each ``fail`` by default): ``donation``, ``host_transfer``, ``precision``,
  ``program_size`` (a ratchet within ``program_size_tolerance``) and ``kernels`` (kernel bodies by content), read
  from the structural diff of the cell's text against the golden's (run once, where they differ) and the golden
  record's kernel digests. They gate whether or not ``hlo_text`` is advisory.
* ``missing_golden``: a cell without a golden fails; a golden without a cell is reported as stale.
* ``unjudged``: a cell with a golden that is unavailable here fails unless a waiver with a reason accepts it.
* ``dead_rng`` (default ``warn``): RNG streams the step carries but never draws from (``hlo-audit rng``): each
  costs two entry parameters per step and a counter increment per call. A ``dead_rng`` waiver may name a
  ``pattern`` (a glob over stream patterns) to accept known dead state and still catch new dead streams.
* ``stale_waiver`` (default ``warn``): a waiver that waived nothing although every cell it covers was judged: the
  fix landed, and a waiver left behind would hide the regression coming back.
* ``memory`` (default ``warn``): a ratchet on a compiled cell's memory analysis, as ``count`` is on entry
  parameters: argument, output, temp or generated-code bytes above the golden's by more than
  ``memory_tolerance`` (a fraction, default 2%) is a regression; below it by as much, an improvement that asks
  to tighten the golden. Alias bytes are not gated here: more of them means less memory, and fewer is a lost
  donation (the ``donation`` rule), whose smaller temp buffers are no improvement.

Each rule is a pure function of the cell's one comparison with its golden (``compare.CellDelta``, which the reports
and `diff` read too) in one table (``rules.RULES``); the gate applies the table and the policy and keeps no state.
Every finding is a typed record (``findings``): its place, rule, severity and the numbers behind it. The gate words
nothing (``report.words`` does); a waiver makes a new finding, of severity waived, that names the waiver.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from hlo_audit.compare import CellDelta
from hlo_audit.findings import Finding, LoweringFailure, Matches, MissingGolden, StaleGolden, StaleWaiver, Unjudged
from hlo_audit.golden.snapshot import Golden, GoldenError, read_snapshot
from hlo_audit.matrix import Cell, matches_rule
from hlo_audit.outcome import Outcome
from hlo_audit.plan import Plan, full_matrix_of
from hlo_audit.policy import Action, Policy, Rule
from hlo_audit.results import CellResult, Severity, Status
from hlo_audit.rules import RULES, Context, Subject, used_waivers
from hlo_audit.scaling import Series
from hlo_audit.stack import StackMode, stack_mode, why_pinned


def regenerate_command(config_path: str | None) -> str:
    return "hlo-audit golden update" + (f" --config {config_path}" if config_path else "")


def judged(plan: Plan, results: Sequence[CellResult], regenerate: str, report_stale: bool = True,
           prepare=None) -> Outcome:
    """The plan's outcome judged under its config's policy, against one tree of goldens, whole: judged again when
    a ``golden update`` swapped the tree meanwhile (``golden.snapshot.read_snapshot``). ``prepare(tree, results)``:
    the results completed from that same tree first (``measure.with_host_figures``: each file read once)."""
    def judge(tree):
        outcome = Outcome.of(plan, prepare(tree, results) if prepare else results, tree)
        # The shard's record names the goldens it was judged against (the whole tree: what `merge` compares).
        outcome = replace(outcome, shard=outcome.shard.against(tree.digest()) if outcome.shard else None)
        return Gate(plan.config.rules, regenerate).judge(outcome, report_stale)

    return read_snapshot(plan.config.golden_dir, judge)


class Gate:
    """Applies the rules' table (``rules.RULES``) under a policy: what each rule found, then the policy's action and
    the waivers, each making a new finding. Holds nothing between cells: the waivers used are read off the findings
    (``rules.used_waivers``)."""

    def __init__(self, policy: Policy, regenerate: str, pinned_by: str | None = ""):
        self.policy = policy
        self.regenerate = regenerate  # "hlo-audit golden update" (+ --config when not the default)
        # What made this run's stack pinned (``CI=true``; ``stack.stack_mode``, read here once), None for a local
        # run: pinned, a golden of another compiler stack fails and relaxes nothing.
        if pinned_by == "":
            pinned_by = why_pinned() if stack_mode() is StackMode.PINNED else None
        self.pinned_by = pinned_by

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
        """The outcome with every finding about it and each cell's comparison with its golden (``compare.CellDelta``,
        built once: the formats read it): each cell against its golden (its text where it keeps one), the goldens
        without a cell (``report_stale``: one shard of a sharded run reports them) and waivers left over."""
        context = Context(self.policy, self.command_for(series_ids(outcome.plan)))
        findings: list[Finding] = []
        used: set[int] = set()
        deltas: dict[str, CellDelta] = {}
        for r in outcome.results:
            stored = outcome.goldens.golden(r.cell.id)
            if stored is not None and stored.invalid:  # a claim hlo-audit never writes: refused, not judged
                raise GoldenError(f"{stored.damaged}; rewrite it with: {context.command(r.cell.id)}")
            delta = CellDelta.for_cell(r, stored, outcome.leads(r), r.cell.id in outcome.plan.owners,
                                       pinned=self.pinned_by is not None)
            if delta is not None:
                deltas[r.cell.id] = delta
            kept, found = self.judge_cell(r, stored, delta, outcome.leads(r), context)
            findings.extend(kept)
            used |= used_waivers(kept) | used_waivers(found)
        plan = outcome.plan
        matrix = plan.full_matrix if plan.full_matrix is not None else full_matrix_of(plan)
        if report_stale:
            findings.extend(stale(outcome.goldens.stored_ids(), {c.id for c in matrix}))
        findings.extend(stale_waivers(self.policy, used, outcome.results, matrix))
        return outcome.judged(findings, deltas)

    def _apply(self, finding: Finding | None, cell: Cell) -> Finding | None:
        """Policy and waivers turn a would-be regression into a warning, a waived finding, or nothing: by the rule the
        finding is of (a text rule's damaged golden is a missing golden's)."""
        if finding is None:
            return None
        action = self.policy.action(finding.rule)
        if action is Action.OFF:
            return None
        if finding.severity is Severity.REGRESSION:
            waiver = self.policy.waiver(finding.rule, cell)
            if waiver is not None:
                return finding.waived(waiver)
            if action is Action.WARN:
                return finding.warned()
        return finding

    def check(self, result: CellResult, golden: Golden | None, delta: CellDelta | None, leads: Series | None,
              context: Context | None = None) -> list[Finding]:
        """Every finding about one cell: the rules' table applied to it (``rules.RULES``)."""
        return self.judge_cell(result, golden, delta, leads, context)[0]

    def judge_cell(self, result: CellResult, golden: Golden | None, delta: CellDelta | None, leads: Series | None,
                   context: Context | None = None) -> tuple[list[Finding], list[Finding]]:
        """The cell's findings after the policy, and before it (what the rules found: waivers a rule matched count as
        used whatever the policy's action)."""
        cid = result.cell.id
        context = context or Context(self.policy, self.command)
        if result.status is not Status.OK:
            return self._not_lowered(result, golden)
        found: list[Finding] = []
        if delta is None:  # a golden that cannot be read gates nothing: as if missing, said why
            found.append(Finding(cid, Severity.REGRESSION, Rule.MISSING_GOLDEN,
                                 MissingGolden(golden.damaged if golden else None, context.command(cid))))
        elif delta.pinned and delta.stack_moved:  # CI's stack is pinned: another stack's golden is a mistake
            found.append(Finding(cid, Severity.REGRESSION, Rule.MISSING_GOLDEN, MissingGolden(
                str(golden.summary or cid), context.command(cid), stack=delta.stack_moved, pinned_by=self.pinned_by)))
        subject = Subject(result, golden, delta, leads)
        found += [f for entry in RULES if delta is not None or not entry.needs_golden
                  if (f := entry.judge(subject, context)) is not None]
        kept = [f for f in (self._apply(f, result.cell) for f in found) if f is not None]
        return kept or [Finding(cid, Severity.OK, Rule.ALL, Matches())], found


    def _not_lowered(self, result: CellResult, golden: Golden | None) -> tuple[list[Finding], list[Finding]]:
        """A cell that did not lower: an error fails; an unavailable one with a golden is a cell the check cannot
        judge (``unjudged``: it fails unless a waiver with a reason accepts it), one without a golden is said."""
        cid = result.cell.id
        if result.status is Status.UNAVAILABLE and golden is not None:
            found = [Finding(cid, Severity.REGRESSION, Rule.UNJUDGED, Unjudged(
                str(result.status), result.message, str(golden.summary or golden.cell_id)))]
            kept = [f for f in (self._apply(f, result.cell) for f in found) if f is not None]
            return kept or [Finding(cid, Severity.UNAVAILABLE, Rule.LOWERING, LoweringFailure(result.message))], found
        severity = Severity.UNAVAILABLE if result.status is Status.UNAVAILABLE else Severity.ERROR
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
    regression coming back. Policy ``stale_waiver`` (default warn) says what that is."""
    action = policy.action(Rule.STALE_WAIVER, Action.WARN)
    if action is Action.OFF:
        return []
    judged_ids = {r.cell.id for r in judged if r.ok}
    findings = []
    for waiver in policy.waivers:
        covered = [c.id for c in matrix if matches_rule(c, waiver.match)]
        if waiver.index in used or not set(covered) <= judged_ids or (waiver.built_in and not covered):
            continue  # a built-in waiver for cells this config's matrix leaves out is no one's to drop
        findings.append(Finding(waiver.source, Severity.REGRESSION if action is Action.FAIL else Severity.ADVISORY,
                                Rule.STALE_WAIVER, StaleWaiver(waiver, len(covered))))
    return findings


def stale(golden_ids: Sequence[str], matrix_ids: set[str]) -> list[Finding]:
    return [Finding(cid, Severity.STALE, Rule.MISSING_GOLDEN, StaleGolden()) for cid in golden_ids
            if cid not in matrix_ids]
