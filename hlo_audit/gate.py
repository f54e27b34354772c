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
* ``hlo_text``: the normalized module must equal the golden's when the environment fingerprint (jax, jaxlib,
  flax, maxtext, platform, stage) equals the golden's; otherwise the difference is advisory and the counts
  and the named rules still gate. A difference carries `diff`'s verdict and kinds: one that is RNG state only,
  dropped, is an improvement to accept (a fix like seed 001's), not a regression; one that only renames entry
  parameters (``renamed-only``) is an advisory listing the renames, which ``golden update`` records.
* The named rules (``named_rules``; each ``fail`` by default): ``donation``, ``host_transfer``, ``precision``,
  ``program_size`` (a ratchet within ``program_size_tolerance``) and ``kernels`` (kernel bodies by content), read
  from the structural diff of the cell's text against the golden's (run once, where they differ) and the golden
  record's kernel digests. They gate whether or not ``hlo_text`` is advisory.
* ``missing_golden``: a cell without a golden fails; a golden without a cell is reported as stale.
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

Every finding is a typed record (``findings``): its place, rule, severity and the numbers behind it. The gate words
nothing (``report.words`` does); a waiver makes a new finding, of severity waived, that names the waiver.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence

from hlo_audit.analysed import Launches, RngSummary
from hlo_audit.findings import (CapturedDelta, CountChange, CountKind, DeadRng, EnvironmentChange, Finding,
                                IncrementChange, LaunchChange, LaunchScaling, LoweringFailure, Matches, MemoryChange,
                                MissingGolden, PatternChanges, PatternMove, PatternRename, PatternRetype, RngScaling,
                                SlopeChange, StaleGolden, StaleWaiver, TextChange, TextKind)
from hlo_audit.golden.record import GoldenLaunches, GoldenRecord, Increments, Slopes
from hlo_audit.golden.snapshot import Golden, read_snapshot
from hlo_audit import named_rules
from hlo_audit.hlo.changes import ChangeKind
from hlo_audit.hlo.diff import captured_delta, count_delta
from hlo_audit.hlo.launch_groups import group_delta
from hlo_audit.lowering import MEMORY_KINDS
from hlo_audit.matrix import Cell, matches_rule
from hlo_audit.named_rules import Structural
from hlo_audit.outcome import Outcome
from hlo_audit.plan import Plan, full_matrix_of
from hlo_audit.policy import Action, Policy, Rule
from hlo_audit.results import CellResult, Severity, Status
from hlo_audit.scaling import Series, rng_launch_slope, rng_slope

GATED_MEMORY = tuple(kind.key for kind in MEMORY_KINDS if kind.gated)
# The verdicts of RNG streams whose counter increments per step the count ratchet fails on (Gate._count).
GATED_INCREMENTS = ("carried", "unknown")
# The launch counts the ratchet holds a GPU cell to.
GATED_LAUNCHES = ("total", "scalar", "collectives")
TEXT_DIFF_LINES = 40


def regenerate_command(config_path: str | None) -> str:
    return "hlo-audit golden update" + (f" --config {config_path}" if config_path else "")


def judged(plan: Plan, results: Sequence[CellResult], regenerate: str, report_stale: bool = True) -> Outcome:
    """The plan's outcome judged under its config's policy, against one tree of goldens, whole: judged again when
    a ``golden update`` swapped the tree meanwhile (``golden.snapshot.read_snapshot``)."""
    return read_snapshot(plan.config.golden_dir, lambda tree: Gate(plan.config.rules, regenerate).judge(
        Outcome.of(plan, results, tree), report_stale))


class Gate:
    def __init__(self, policy: Policy, regenerate: str):
        self.policy = policy
        self.regenerate = regenerate  # "hlo-audit golden update" (+ --config when not the default)
        self.used: set[int] = set()  # the waivers that waived something (``stale_waivers`` reports the others)
        self.series_ids: Mapping[str, tuple[str, ...]] = {}  # cell id -> its depth series' ids (set by ``judge``)

    def command(self, cell_id: str) -> str:
        """The golden update that accepts what is found at ``cell_id``: its whole depth series, since each depth's
        golden holds the series' slopes, and a golden of one depth refreshed alone would hold a slope made of its new
        count and the other depths' old ones (issue 26: the printed command then looped)."""
        ids = self.series_ids.get(cell_id, (cell_id,))
        return f"{self.regenerate} --only {','.join(f'id={i}' for i in ids)}"

    def judge(self, outcome: Outcome, report_stale: bool = True) -> Outcome:
        """The outcome with every finding about it: each cell against its golden (its text where it keeps one), the
        goldens without a cell (``report_stale``: one shard of a sharded run reports them) and waivers left over."""
        findings: list[Finding] = []
        self.series_ids = series_ids(outcome.plan)
        for r in outcome.results:
            stored = outcome.goldens.golden(r.cell.id)
            compared = stored is not None and (stored.hlo is not None or stored.text_problem is not None)
            text = r.canonical_text() if r.ok and r.cell.id in outcome.plan.owners and compared else None
            findings.extend(self.check(r, stored, outcome.leads(r), text))
        plan = outcome.plan
        matrix = plan.full_matrix if plan.full_matrix is not None else full_matrix_of(plan)
        if report_stale:
            findings.extend(stale(outcome.goldens.stored_ids(), {c.id for c in matrix}))
        findings.extend(stale_waivers(self, outcome.results, matrix))
        return outcome.judged(findings)

    def _apply(self, rule: str, result: CellResult, finding: Finding | None) -> Finding | None:
        """Policy and waivers turn a would-be regression into a warning, a waived finding, or nothing."""
        action = self.policy.action(rule)
        if action is Action.OFF or finding is None:
            return None
        if finding.severity is Severity.REGRESSION:
            waiver = self.policy.waiver(rule, result.cell)
            if waiver is not None:
                self.used.add(waiver.index)
                return finding.waived(waiver)
            if action is Action.WARN:
                return finding.warned()
        return finding

    def check(self, result: CellResult, golden: Golden | None, leads: Series | None,
              normalized: str | None) -> list[Finding]:
        """Every finding about one cell. ``leads``: its series when the cell is the series' shallowest (where the
        series' findings go); ``normalized``: its canonical text where it is compared with the golden's."""
        cid = result.cell.id
        if result.status is not Status.OK:
            severity = Severity.UNAVAILABLE if result.status is Status.UNAVAILABLE else Severity.ERROR
            return [Finding(cid, severity, Rule.LOWERING, LoweringFailure(result.message))]
        found: list[Finding | None] = []
        if golden is None or golden.damaged:  # a golden that cannot be read gates nothing: as if missing, said why
            found.append(self._apply(Rule.MISSING_GOLDEN, result, Finding(
                cid, Severity.REGRESSION, Rule.MISSING_GOLDEN,
                MissingGolden(golden.damaged if golden else None, self.command(cid)))))
        else:
            problem = self._text_problem(result, golden, normalized)
            # The structural diff, once, where the texts differ: the count rule (dtypes moved per pattern), the
            # named rules and the text rule read it.
            structural = (Structural.of(golden.hlo, normalized, result.places)
                          if problem is None and golden.hlo is not None and normalized is not None
                          and golden.hlo != normalized else None)
            found.append(self._apply(Rule.COUNT, result, self._count(result, golden.record, leads, structural)))
            named = self._named(result, golden.record, structural)
            found.extend(self._apply(rule, result, finding) for rule, finding in named.items())
            found.append(self._apply(Rule.MISSING_GOLDEN, result, problem) if problem else
                         self._apply(Rule.HLO_TEXT, result, self._text(result, golden, normalized, structural)))
            donation = named.get(Rule.DONATION)
            lost = donation is not None and donation.severity is Severity.REGRESSION
            found.append(self._apply(Rule.MEMORY, result, self._memory(result, golden.record, lost)))
        found.append(self._apply(Rule.RNG_SCALING, result, rng_scaling(result, leads)))
        found.append(self._apply(Rule.LAUNCH_SCALING, result, launch_scaling(result, leads)))
        found.append(self._apply(Rule.DEAD_RNG, result, self._dead_rng(result)))
        kept = [f for f in found if f is not None]
        return kept or [Finding(cid, Severity.OK, Rule.ALL, Matches())]

    def _count(self, result: CellResult, old: GoldenRecord, leads: Series | None,
               structural: Structural | None) -> Finding | None:
        """The ratchet: entry parameters by dtype and role, state captured as constants, and the counter
        increments per step of RNG streams never drawn from (carried, or unknown): each a kernel launch on a GPU,
        seed 000's 672 with no parameter added where streams were shared. A drawn stream's increments are
        reported, not gated: they move with the draws (seed 001's one shared stream is advanced per draw, 42 -> 54
        at L2, while its GPU kernels fall 663 -> 600), and the text rule and a GPU cell's launches judge that
        change, not this proxy. Each change names its path patterns; a dtype that moved within a pattern is read off
        the structural diff of the golden's text and the cell's (the records count dtypes per cell, not per
        pattern)."""
        new = result.summary
        by_dtype, by_role = count_delta(old.by_dtype, new.by_dtype), count_delta(old.by_role, new.by_role)
        dtypes = dtype_moves(structural) if by_dtype and structural is not None else {}
        patterns = pattern_changes(old.groups, new.groups, old.groups_by_role or {}, result.groups_by_role(),
                                   dtypes)
        # A golden written before captured state was recorded ratchets entry parameters only.
        captured = (CapturedDelta.of(captured_delta(old.constants, result.constants.golden_summary()))
                    if old.constants is not None and result.constants is not None else None)
        increments = increment_changes(old.rng_increments, result.rng)
        launches = launch_changes(old.launches, result.launches)
        slopes = slope_changes(old.slopes, leads)
        more = (any(v > 0 for v in (*by_dtype.values(), *by_role.values())) or (captured and captured.baked_more)
                or (increments and any(increments.by_verdict.get(v, 0) > 0 for v in GATED_INCREMENTS))
                or (launches and any(v > 0 for v in launches.delta.values()))
                or (slopes and slopes.grew))
        if not (by_dtype or by_role or patterns or captured or increments or launches or slopes):
            return None
        fewer_increments = increments is not None and any(v < 0 for v in increments.by_verdict.values())
        kind = (CountKind.GREW if more else CountKind.MOVED if not (
            by_dtype or by_role or captured or fewer_increments or launches or slopes) else CountKind.SHRANK)
        severity = {CountKind.GREW: Severity.REGRESSION, CountKind.MOVED: Severity.ADVISORY,
                    CountKind.SHRANK: Severity.IMPROVEMENT}[kind]
        return Finding(result.cell.id, severity, Rule.COUNT, CountChange(
            kind=kind, golden_params=old.entry_params, now_params=new.entry_params, by_dtype=by_dtype,
            by_role=by_role, groups=count_delta(old.groups, new.groups), patterns=patterns, captured=captured,
            increments=increments, launches=launches, slopes=slopes, command=self.command(result.cell.id)))

    def _text_problem(self, result: CellResult, golden: Golden, normalized: str | None) -> Finding | None:
        """A cell whose text is compared (``normalized`` given) and whose golden text is missing, not UTF-8 or, when
        it differs, not a module: a finding, so a deleted or damaged text never turns the text rule off."""
        if normalized is None:
            return None
        why = golden.text_problem or (golden.text_parse_problem() if golden.hlo != normalized else None)
        if why is None:
            return None
        cid = result.cell.id
        return Finding(cid, Severity.REGRESSION, Rule.MISSING_GOLDEN, MissingGolden(why, self.command(cid)))

    def _named(self, result: CellResult, golden: GoldenRecord, structural: Structural | None) -> dict[str, Finding]:
        """The named rules' findings (``named_rules``), before policy: each a regression or an improvement."""
        cid, command = result.cell.id, self.command(result.cell.id)
        moved = named_rules.environment_moved(golden.environment, result.environment)
        facts = (named_rules.donation(structural, golden.memory, result.memory, self.policy.memory_tolerance, command),
                 named_rules.host_transfer(structural, command), named_rules.precision(structural, command),
                 named_rules.program_size(structural, self.policy.program_size_tolerance, command),
                 named_rules.kernels(structural, golden.kernels, result.kernels_by_name, command),
                 named_rules.sharding(structural, command),
                 named_rules.collectives(structural, command),
                 named_rules.shapes(structural, command, moved),
                 named_rules.ops(structural, command, moved))
        return {f.rule: Finding(cid, Severity.ADVISORY if f.environment else
                                Severity.REGRESSION if f.worse else Severity.IMPROVEMENT, f.rule, f)
                for f in facts if f is not None}

    def _text(self, result: CellResult, golden: Golden, normalized: str | None,
              structural: Structural | None) -> Finding | None:
        """The canonical text against the golden's, judged by `diff`'s verdict: a text that differs only by RNG
        state it dropped is an improvement to accept, not a regression; one whose entry parameters are renamed and
        whose program is the same (renamed-only) an advisory listing the renames; under another environment than
        the golden's, advisory (the counts and the named rules still gate)."""
        if structural is None or normalized is None:
            return None
        diff = list(difflib.unified_diff(golden.hlo.splitlines(), normalized.splitlines(), "golden", "now",
                                         lineterm="", n=0))
        changed = sum(1 for line in diff if line[:1] in "+-" and line[:3] not in ("+++", "---"))
        verdict, rng = structural.diff.verdict, structural.rng_params
        moved = environment_changes(golden.environment, result.environment)
        kind = (TextKind.MOVED if moved else TextKind.RNG_DROPPED if verdict == "rng-state-only" and rng < 0
                else TextKind.RENAMED if verdict == "renamed-only" else TextKind.CHANGED)
        severity = {TextKind.MOVED: Severity.ADVISORY, TextKind.RNG_DROPPED: Severity.IMPROVEMENT,
                    TextKind.RENAMED: Severity.ADVISORY, TextKind.CHANGED: Severity.REGRESSION}[kind]
        renames = structural.named(ChangeKind.RENAME) if verdict == "renamed-only" else ()
        return Finding(result.cell.id, severity, Rule.HLO_TEXT, TextChange(
            kind=kind, changed_lines=changed, diff=tuple(diff[:TEXT_DIFF_LINES]), verdict=verdict,
            changes=tuple(structural.diff.changes), rng_params=rng, environment=moved,
            command=self.command(result.cell.id), renames=renames,
            params=(*structural.diff.params_added, *structural.diff.params_removed)))

    def _memory(self, result: CellResult, golden: GoldenRecord, lost_donation: bool = False) -> Finding | None:
        """Compiled memory beyond ``memory_tolerance`` of the golden's, by gated kind: up a regression, down an
        improvement, except where the step lost its donation (``lost_donation``): then less temp memory is the
        donation's cost moved, not a gain, and the donation finding reports it."""
        old, new = golden.memory, result.memory
        if old is None or new is None:
            return None
        tolerance = self.policy.memory_tolerance
        changed = {k: (old[k], new[k]) for k in GATED_MEMORY
                   if k in old and k in new and abs(new[k] - old[k]) > tolerance * old[k]}
        if not changed:
            return None
        grew = any(b > a for a, b in changed.values())
        if lost_donation and not grew:
            return None
        return Finding(result.cell.id, Severity.REGRESSION if grew else Severity.IMPROVEMENT, Rule.MEMORY,
                       MemoryChange(changed, tolerance, grew, self.command(result.cell.id)))

    def _dead_rng(self, result: CellResult) -> Finding | None:
        """Carried streams, by pattern; patterns a waiver names are set apart, and alone they make a waived finding."""
        rng: RngSummary | None = result.rng
        if rng is None or not rng.carried:
            return None
        dead = rng.dead_patterns
        waived = {p.pattern: w for p in dead
                  if (w := self.policy.pattern_waiver(Rule.DEAD_RNG, result.cell, p.pattern))}
        self.used.update(w.index for w in waived.values())
        open_ = [p for p in dead if p.pattern not in waived]
        shown = open_ or dead
        facts = DeadRng(cell=result.cell.id, streams=sum(p.carried for p in shown),
                        params=sum(p.dead_params for p in shown), increments=sum(p.dead_increments for p in shown),
                        patterns=tuple(p.pattern for p in shown), largest=shown[0].pattern,
                        largest_streams=shown[0].carried, waived_patterns=waived)
        finding = Finding(result.cell.id, Severity.REGRESSION, Rule.DEAD_RNG, facts)
        return finding if open_ else finding.waived(*{w.index: w for w in waived.values()}.values())



def series_ids(plan: Plan | None) -> dict[str, tuple[str, ...]]:
    """Each cell of the plan's matrix (and run) -> the ids of its depth series there, shallowest first."""
    if plan is None:
        return {}
    members: dict[tuple, dict[int, str]] = {}
    for cell in (*plan.matrix, *plan.cells):
        members.setdefault(cell.series, {})[cell.layers] = cell.id
    return {cid: tuple(ids[d] for d in sorted(ids)) for ids in members.values() for cid in ids.values()}


def stale_waivers(gate: Gate, judged: Sequence[CellResult], matrix: Sequence[Cell]) -> list[Finding]:
    """Waivers that waived nothing, although every cell of the matrix they cover was judged here: a fix landed (or
    the waiver never matched), and a waiver left behind would hide the regression coming back. Policy
    ``stale_waiver`` (default warn) says what that is."""
    action = gate.policy.action(Rule.STALE_WAIVER, Action.WARN)
    if action is Action.OFF:
        return []
    judged_ids = {r.cell.id for r in judged if r.ok}
    findings = []
    for waiver in gate.policy.waivers:
        covered = [c.id for c in matrix if matches_rule(c, waiver.match)]
        if waiver.index in gate.used or not set(covered) <= judged_ids or (waiver.built_in and not covered):
            continue  # a built-in waiver for cells this config's matrix leaves out is no one's to drop
        findings.append(Finding(waiver.source, Severity.REGRESSION if action is Action.FAIL else Severity.ADVISORY,
                                Rule.STALE_WAIVER, StaleWaiver(waiver, len(covered))))
    return findings


def stale(golden_ids: Sequence[str], matrix_ids: set[str]) -> list[Finding]:
    return [Finding(cid, Severity.STALE, Rule.MISSING_GOLDEN, StaleGolden()) for cid in golden_ids
            if cid not in matrix_ids]


def rng_scaling(result: CellResult, leads: Series | None) -> Finding | None:
    """RNG parameters that grow with depth in an unrolled series; reported once, on its shallowest cell."""
    if result.cell.scan or leads is None:
        return None
    slope = rng_slope(leads)
    if slope <= 0:
        return None
    by_role = {k: leads.by_role[k].slope for k in ("rng_key", "rng_count") if k in leads.by_role}
    return Finding(result.cell.id, Severity.REGRESSION, Rule.RNG_SCALING,
                   RngScaling(slope, by_role, leads.depths, leads.rng_patterns))


def launch_scaling(result: CellResult, leads: Series | None) -> Finding | None:
    """Kernels that read RNG state, per layer of an unrolled GPU series; reported once, on its shallowest cell."""
    if result.cell.scan or leads is None:
        return None
    slope = rng_launch_slope(leads)
    if slope <= 0:
        return None
    per_layer = {k: leads.launches[k].slope for k in ("total", "scalar") if leads.launches[k].slope}
    return Finding(result.cell.id, Severity.REGRESSION, Rule.LAUNCH_SCALING,
                   LaunchScaling(slope, per_layer, leads.depths, leads.launch_groups))


# --------------------------------------------------------------------------------------------------------------
# What changed against the golden, as numbers
# --------------------------------------------------------------------------------------------------------------


def pattern_changes(old: Mapping[str, int], new: Mapping[str, int], old_roles: Mapping[str, Mapping[str, int]],
                    new_roles: Mapping[str, Mapping[str, int]],
                    dtypes: Mapping[str, Mapping[str, int]] | None = None) -> PatternChanges:
    """Path patterns that grew, shrank, or were renamed (one gone and one new with the same count and roles:
    ``self_attention.rngs.*`` -> ``attention_op.rngs.*``), each with the roles of its change, and those retyped:
    the same count, other roles (from the records) or dtypes (``dtypes``: ``dtype_moves`` of the texts' structural
    diff, when given: the records keep no dtypes per pattern)."""
    delta = count_delta(old, new)

    def roles(pattern: str) -> dict[str, int]:
        return count_delta(old_roles.get(pattern, {}), new_roles.get(pattern, {}))

    gone = [p for p, d in delta.items() if d < 0 and p not in new]
    arrived = [p for p, d in delta.items() if d > 0 and p not in old]
    renamed = []
    for before in gone:
        signature = {r: -n for r, n in roles(before).items()}
        after = next((p for p in arrived if delta[p] == -delta[before] and (not signature or roles(p) == signature)),
                     None)
        if after is not None:
            arrived.remove(after)
            renamed.append(PatternRename(before, after, delta[after], roles(after)))
    moved = {r.before for r in renamed} | {r.after for r in renamed}
    return PatternChanges(
        grown=tuple(PatternMove(p, d, roles(p)) for p, d in delta.items() if d > 0 and p not in moved),
        shrunk=tuple(PatternMove(p, d, roles(p)) for p, d in delta.items() if d < 0 and p not in moved),
        renamed=tuple(renamed), retyped=retyped_patterns(old, new, roles if old_roles and new_roles else None,
                                                         dtypes or {}))


def retyped_patterns(old: Mapping[str, int], new: Mapping[str, int], roles,
                     dtypes: Mapping[str, Mapping[str, int]]) -> tuple[PatternRetype, ...]:
    """Patterns whose parameter count held while their roles (``roles(pattern)``: the records' delta; None when
    either side keeps no roles per pattern) or dtypes (``dtypes``) moved:
    ``state.model.layers.*.pre_ffw_norm.scale: bf16 +6, f32 -6``."""
    moved_roles = roles or (lambda pattern: {})
    held = [p for p in sorted({*old, *new, *dtypes}) if old.get(p, 0) == new.get(p, 0)]
    return tuple(PatternRetype(p, dtypes.get(p, {}), moved_roles(p)) for p in held
                 if dtypes.get(p) or moved_roles(p))


def dtype_moves(structural: Structural) -> dict[str, dict[str, int]]:
    """Per path pattern, its entry parameters' dtype deltas between the golden's text and the cell's (the structural
    diff's parameters added and removed), where the pattern's count held (a pattern that grew or shrank is named as
    such)."""
    grouped: dict[str, dict[str, int]] = {}
    for g in (*structural.diff.params_added, *structural.diff.params_removed):
        dtypes = grouped.setdefault(g.pattern, {})
        dtypes[g.dtype] = dtypes.get(g.dtype, 0) + g.count
    return {p: {d: n for d, n in sorted(ds.items()) if n} for p, ds in sorted(grouped.items())
            if any(ds.values()) and not sum(ds.values())}


def increment_changes(old: Increments | None, rng: RngSummary | None) -> IncrementChange | None:
    """RNG counter increments per step against the golden's, by verdict and by stream pattern (with the paths of the
    streams whose increments grew); None when the golden predates the record or nothing changed."""
    if old is None or rng is None:
        return None
    now_by_verdict = {verdict: rng.increments(verdict) for verdict in ("drawn", "carried", "unknown")}
    by_verdict = count_delta(old.by_verdict, now_by_verdict)
    if not by_verdict:
        return None
    by_pattern = count_delta(old.by_pattern, {p.pattern: p.increments for p in rng.patterns})
    paths = {p.pattern: tuple(sorted({path for paths in p.paths.values() for path in paths}))
             for p in rng.patterns if by_pattern.get(p.pattern, 0) > 0}
    return IncrementChange(golden=sum(old.by_verdict.values()), now=sum(now_by_verdict.values()),
                           by_verdict=by_verdict, by_pattern=by_pattern, paths=paths)


def launch_changes(old: GoldenLaunches | Launches | None, new: Launches | None) -> LaunchChange | None:
    """A GPU cell's launches per step against the golden's (``GoldenLaunches``; or two programs' ``Launches``):
    kernels in all, scalar ones and collectives, with the launch groups that came and went (``hlo.launch_groups.
    group_delta``); None when either side has none (a golden written before they were kept, a cell that is not a
    GPU's) or no gated count moved."""
    if old is None or new is None:
        return None
    counts = {k: (getattr(old, k) or 0, getattr(new, k) or 0) for k in GATED_LAUNCHES}
    delta = {k: b - a for k, (a, b) in counts.items() if a != b}
    if not delta:
        return None
    groups = group_delta(old.groups or {}, new.groups or {})
    return LaunchChange(golden={k: a for k, (a, _) in counts.items()}, now={k: b for k, (_, b) in counts.items()},
                        delta=delta, groups=tuple(groups))


def launch_comparison(old: Launches | None, new: Launches | None) -> LaunchChange | None:
    """Two GPU programs' launches per step side by side (`diff`), None unless both have them."""
    if old is None or new is None:
        return None
    return launch_changes(old, new) or LaunchChange(golden={k: getattr(old, k) for k in GATED_LAUNCHES},
                                                    now={k: getattr(new, k) for k in GATED_LAUNCHES}, delta={},
                                                    groups=())


def slope_changes(old: Slopes | None, series: Series | None) -> SlopeChange | None:
    """The series' entry parameters and RNG parameters per layer against the golden's (reported on the series'
    shallowest cell, where the golden keeps its slopes); None when either side has no slopes or nothing moved."""
    if old is None or series is None:
        return None
    moved = {}
    if old.total != series.total.slope:
        moved["params_per_layer"] = (old.total, series.total.slope)
    if old.rng_per_layer != rng_slope(series):
        moved["rng_per_layer"] = (old.rng_per_layer, rng_slope(series))
    if old.launches is not None and series.launches:
        for key, word in (("total", "kernels_per_layer"), ("reading_rng", "rng_kernels_per_layer")):
            if old.launches.get(key, 0) != series.launches[key].slope:
                moved[word] = (old.launches.get(key, 0), series.launches[key].slope)
    return SlopeChange(moved) if moved else None


def environment_changes(then: Mapping[str, str | None], now: Mapping[str, str | None]) -> tuple[EnvironmentChange, ...]:
    """Every key whose value differs, both ways (a key only the golden has, or only this run has, too)."""
    keys = sorted(k for k in {*then, *now} if then.get(k) != now.get(k))
    return tuple(EnvironmentChange(k, then.get(k), now.get(k)) for k in keys)

