"""The gate's rules in one table: each a pure function of what it judges (``Subject``: the cell's result, its
``compare.CellDelta`` against the golden, its depth series where it leads one) and the policy, returning a finding
before the policy's action and waivers are applied, or None.

Adding a rule is one entry in ``RULES`` (and its words in ``report.words``): the gate (``gate.Gate``) applies the
table, turns actions and waivers into new findings, and holds no state of its own. Rules that compare with the
golden run only where a readable golden is there (``needs_golden``); the others (the series' scaling, dead RNG
state) read the result alone.

Direction: a regression is something that got worse or changed in a way a reviewer must judge; an improvement is
only what a user would call one (fewer entry parameters of RNG state, fewer never-drawn streams' increments, less
memory for the same program, fewer host transfers, fewer kernels per step, a donation gained). A program that shrinks
is not an improvement by itself: lost gradient work, a removed collective or a removed transform is a change to
judge, gated like any other until accepted.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hlo_audit import named_rules
from hlo_audit.compare import GATED_INCREMENTS, CellDelta, TextVerdict
from hlo_audit.findings import (CountChange, CountKind, DeadRng, Finding, LaunchScaling, MemoryChange,
                                MissingGolden, NamedChange, RngScaling, TextChange, TextKind)
from hlo_audit.golden.completeness import incomplete
from hlo_audit.golden.snapshot import Golden
from hlo_audit.hlo.changes import ChangeKind
from hlo_audit.host_cost import host_cost as host_cost_change
from hlo_audit.policy import Policy, Rule
from hlo_audit.results import CellResult, Severity
from hlo_audit.scaling import Series, rng_launch_slope, rng_slope

# Roles whose entry parameters, fewer, a user calls an improvement: RNG state the host no longer marshals.
RNG_ROLES = ("rng_key", "rng_count")
# Launch counts that, fewer, are an improvement (a collective fewer is a change to judge: the sharding moved).
FEWER_IS_BETTER_LAUNCHES = ("total", "scalar")


@dataclass(frozen=True)
class Subject:
    """What the rules judge of one ok cell: its result, its golden (readable, or None), the comparison of the two
    (None without a golden), its series where the cell is the series' shallowest (where the series is judged)."""

    result: CellResult
    golden: Golden | None
    delta: CellDelta | None
    leads: Series | None

    @property
    def cell(self) -> str:
        return self.result.cell.id


@dataclass(frozen=True)
class Context:
    """The policy's numbers and the accept command of each cell (its whole depth series: ``gate.Gate.command``)."""

    policy: Policy
    command: Callable[[str], str]


RuleFn = Callable[[Subject, Context], Finding | None]


@dataclass(frozen=True)
class RuleEntry:
    rule: Rule
    judge: RuleFn
    needs_golden: bool = True


# --------------------------------------------------------------------------------------------------------------
# Rules against the golden
# --------------------------------------------------------------------------------------------------------------


def host_cost(subject: Subject, ctx: Context) -> Finding | None:
    """State leaves per call against the figure recorded beside the golden (``host_cost``: the time is the words);
    nothing where either side has no figure."""
    record = subject.golden.record if subject.golden is not None else None
    facts = host_cost_change(record.host if record is not None else None, subject.result.host,
                             ctx.policy.host_cost_tolerance, ctx.command(subject.cell))
    if facts is None:
        return None
    return Finding(subject.cell, Severity.REGRESSION if facts.worse else Severity.IMPROVEMENT, Rule.HOST_COST, facts)


def count(subject: Subject, ctx: Context) -> Finding | None:
    """The ratchet: entry parameters by dtype and role, state captured as constants, the counter increments per step
    of RNG streams never drawn from (carried, or unknown: each a kernel launch on a GPU), a GPU cell's launches, and
    the series' slopes. A drawn stream's increments are reported, not gated: they move with the draws (seed 001's
    one shared stream is advanced per draw, 42 -> 54 at L2, while its GPU kernels fall 663 -> 600)."""
    d = subject.delta
    patterns, captured, increments, launches, slopes = d.patterns, d.captured, d.increments, d.launches, d.slopes
    if not (d.params.counts_moved or patterns or captured or increments or launches or slopes):
        return None
    more = (d.params.grew or (captured is not None and captured.baked_more)
            or (increments is not None and any(increments.by_verdict.get(v, 0) > 0 for v in GATED_INCREMENTS))
            or (launches is not None and any(v > 0 for v in launches.delta.values()))
            or (slopes is not None and slopes.grew))
    fewer_increments = increments is not None and any(v < 0 for v in increments.by_verdict.values())
    shrank = d.params.counts_moved or captured or fewer_increments or launches or slopes
    kind = CountKind.GREW if more else CountKind.SHRANK if shrank else CountKind.MOVED
    if kind is CountKind.SHRANK and not _better_only(d):
        kind = CountKind.CHANGED
    severity = {CountKind.GREW: Severity.REGRESSION, CountKind.MOVED: Severity.ADVISORY,
                CountKind.SHRANK: Severity.IMPROVEMENT, CountKind.CHANGED: Severity.REGRESSION}[kind]
    return Finding(subject.cell, severity, Rule.COUNT, CountChange(
        kind=kind, golden_params=d.params.golden, now_params=d.params.now, by_dtype=d.params.by_dtype,
        by_role=d.params.by_role, groups=d.params.groups, patterns=patterns, captured=captured,
        increments=increments, launches=launches, slopes=slopes, command=ctx.command(subject.cell)))


def _better_only(d: CellDelta) -> bool:
    """Whether everything that shrank is what a user calls an improvement (module doc): RNG state's parameters only,
    fewer kernels (not collectives), fewer constants baked in, fewer increments."""
    if any(n < 0 for role, n in d.params.by_role.items() if role not in RNG_ROLES):
        return False
    return d.launches is None or all(k in FEWER_IS_BETTER_LAUNCHES for k in d.launches.delta)


def _named(judge: Callable[[CellDelta, Context], NamedChange | None]) -> RuleFn:
    """A named rule (``named_rules``: the kinds of change the structural account names) as a finding: a regression
    where ``worse``, else an improvement."""
    def rule(subject: Subject, ctx: Context) -> Finding | None:
        facts = judge(subject.delta, ctx)
        if facts is None:
            return None
        severity = (Severity.ADVISORY if facts.environment else  # ops and values' shapes, the stack moved
                    Severity.REGRESSION if facts.worse else Severity.IMPROVEMENT)
        return Finding(subject.cell, severity, facts.rule, facts)
    return rule


def donation(d: CellDelta, ctx: Context) -> NamedChange | None:
    return named_rules.donation(d.structural, d.golden.memory, d.result.memory, ctx.policy.memory_tolerance,
                                ctx.command(d.cell))


def host_transfer(d: CellDelta, ctx: Context) -> NamedChange | None:
    return named_rules.host_transfer(d.structural, ctx.command(d.cell))


def precision(d: CellDelta, ctx: Context) -> NamedChange | None:
    return named_rules.precision(d.structural, ctx.command(d.cell))


def program_size(d: CellDelta, ctx: Context) -> NamedChange | None:
    return named_rules.program_size(d.structural, ctx.policy.program_size_tolerance, ctx.command(d.cell),
                                    d.closed_calls_moved)


def loops(d: CellDelta, ctx: Context) -> NamedChange | None:
    return named_rules.loops(d.structural, ctx.command(d.cell), d.closed_calls_moved)


def remat(d: CellDelta, ctx: Context) -> NamedChange | None:
    return named_rules.remat(d.structural, ctx.command(d.cell))


def gradient(d: CellDelta, ctx: Context) -> NamedChange | None:
    return named_rules.gradient(d.structural, ctx.command(d.cell))


def conditional(d: CellDelta, ctx: Context) -> NamedChange | None:
    return named_rules.conditional(d.structural, ctx.command(d.cell))


def kernels(d: CellDelta, ctx: Context) -> NamedChange | None:
    golden, now = d.kernels
    return named_rules.kernels(d.structural, golden, now, ctx.command(d.cell))


def sharding(d: CellDelta, ctx: Context) -> NamedChange | None:
    return named_rules.sharding(d.structural, ctx.command(d.cell))


def collectives(d: CellDelta, ctx: Context) -> NamedChange | None:
    return named_rules.collectives(d.structural, ctx.command(d.cell))


def shapes(d: CellDelta, ctx: Context) -> NamedChange | None:
    return named_rules.shapes(d.structural, ctx.command(d.cell), d.environment)


def rng_keys(d: CellDelta, ctx: Context) -> NamedChange | None:
    return named_rules.rng_keys(d.structural, ctx.command(d.cell))


def ops(d: CellDelta, ctx: Context) -> NamedChange | None:
    return named_rules.ops(d.structural, ctx.command(d.cell), d.environment)


def constants(d: CellDelta, ctx: Context) -> NamedChange | None:
    return named_rules.constants(d.structural, ctx.command(d.cell), d.environment)


def hlo_text(subject: Subject, ctx: Context) -> Finding | None:
    """The canonical text against the golden's, judged by `diff`'s verdict: a text that differs only by RNG state it
    dropped is an improvement to accept, not a regression; one whose entry parameters are renamed and whose program
    is the same (renamed-only) an advisory listing the renames; under another environment than the golden's,
    advisory (the counts and the named rules still gate). A golden text that is missing, not UTF-8 or (where it
    differs) not a module is a missing golden: a deleted or damaged text never turns the text rule off."""
    problem = _text_problem(subject, ctx)
    if problem is not None:
        return problem
    d = subject.delta
    verdict = d.text
    if verdict in (TextVerdict.NOT_COMPARED, TextVerdict.SAME):
        return None
    structural = d.structural
    kind = (TextKind.MOVED if d.environment else TextKind.RNG_DROPPED if verdict is TextVerdict.RNG_DROPPED
            else TextKind.RENAMED if verdict is TextVerdict.RENAMED else TextKind.CHANGED)
    severity = {TextKind.MOVED: Severity.ADVISORY, TextKind.RNG_DROPPED: Severity.IMPROVEMENT,
                TextKind.RENAMED: Severity.ADVISORY, TextKind.CHANGED: Severity.REGRESSION}[kind]
    changed, diff = d.text_lines
    renames = structural.named(ChangeKind.RENAME) if verdict is TextVerdict.RENAMED else ()
    return Finding(subject.cell, severity, Rule.HLO_TEXT, TextChange(
        kind=kind, changed_lines=changed, diff=diff, verdict=structural.diff.verdict,
        changes=tuple(structural.diff.changes), rng_params=structural.rng_params, environment=d.environment,
        command=ctx.command(subject.cell), renames=renames,
        params=(*structural.diff.params_added, *structural.diff.params_removed)))


def _text_problem(subject: Subject, ctx: Context) -> Finding | None:
    """A compared cell whose golden text is missing, not UTF-8 or, when it differs, not a module."""
    why = subject.delta.text_problem
    if why is None:
        return None
    return Finding(subject.cell, Severity.REGRESSION, Rule.MISSING_GOLDEN,
                   MissingGolden(why, ctx.command(subject.cell)))


def golden_parts(subject: Subject, ctx: Context) -> Finding | None:
    """A golden that lacks a part the rules compare for the cell (an older format's, or damaged): named, with the
    golden update that writes it, never a pass (``golden.completeness``, issue 34)."""
    return incomplete(subject.golden, subject.result, subject.leads, ctx.command(subject.cell))


def memory(subject: Subject, ctx: Context) -> Finding | None:
    """Compiled memory beyond ``memory_tolerance`` of the golden's, by gated kind: up a regression, down an
    improvement for the same program (a changed program with less memory is a change to judge: lost gradient work
    needs less memory too), except where the step lost its donation: then less temp memory is the donation's cost
    moved, not a gain, and the donation finding reports it."""
    d = subject.delta
    if d.memory is None:
        return None
    tolerance = ctx.policy.memory_tolerance
    changed = d.memory.beyond(tolerance)
    if not changed:
        return None
    grew = any(b > a for a, b in changed.values())
    if not grew:
        lost = donation(d, ctx)
        if lost is not None and lost.worse:
            return None
    program_changed = not grew and d.text is TextVerdict.CHANGED
    return Finding(subject.cell, Severity.REGRESSION if grew or program_changed else Severity.IMPROVEMENT,
                   Rule.MEMORY, MemoryChange(changed, tolerance, grew, ctx.command(subject.cell), program_changed))


# --------------------------------------------------------------------------------------------------------------
# Rules of the cell alone
# --------------------------------------------------------------------------------------------------------------


def _unrolled_growth(subject: Subject, slope_of: Callable[[Series], float]) -> tuple[Series, float] | None:
    """The cell's series and its slope where the cell leads an unrolled series whose ``slope_of`` grows with depth:
    what the scaling rules report, once, on the series' shallowest cell."""
    leads = subject.leads
    if subject.result.cell.scan or leads is None:
        return None
    slope = slope_of(leads)
    return (leads, slope) if slope > 0 else None


def rng_scaling(subject: Subject, ctx: Context) -> Finding | None:
    """RNG parameters that grow with depth in an unrolled series."""
    grown = _unrolled_growth(subject, rng_slope)
    if grown is None:
        return None
    leads, slope = grown
    by_role = {k: leads.by_role[k].slope for k in RNG_ROLES if k in leads.by_role}
    return Finding(subject.cell, Severity.REGRESSION, Rule.RNG_SCALING,
                   RngScaling(slope, by_role, leads.depths, leads.rng_patterns))


def launch_scaling(subject: Subject, ctx: Context) -> Finding | None:
    """Kernels that read RNG state, per layer of an unrolled GPU series."""
    grown = _unrolled_growth(subject, rng_launch_slope)
    if grown is None:
        return None
    leads, slope = grown
    per_layer = {k: leads.launches[k].slope for k in ("total", "scalar") if leads.launches[k].slope}
    return Finding(subject.cell, Severity.REGRESSION, Rule.LAUNCH_SCALING,
                   LaunchScaling(slope, per_layer, leads.depths, leads.launch_groups))


def dead_rng(subject: Subject, ctx: Context) -> Finding | None:
    """Carried streams, by pattern; patterns a waiver names are set apart, and alone they make a waived finding."""
    result = subject.result
    rng = result.rng
    if rng is None or not rng.carried:
        return None
    dead = rng.dead_patterns
    waived = {p.pattern: w for p in dead
              if (w := ctx.policy.pattern_waiver(Rule.DEAD_RNG, result.cell, p.pattern))}
    open_ = [p for p in dead if p.pattern not in waived]
    shown = open_ or dead
    facts = DeadRng(cell=result.cell.id, streams=sum(p.carried for p in shown),
                    params=sum(p.dead_params for p in shown), increments=sum(p.dead_increments for p in shown),
                    patterns=tuple(p.pattern for p in shown), largest=shown[0].pattern,
                    largest_streams=shown[0].carried, waived_patterns=waived)
    finding = Finding(result.cell.id, Severity.REGRESSION, Rule.DEAD_RNG, facts)
    return finding if open_ else finding.waived(*{w.index: w for w in waived.values()}.values())


# The table, in the order findings are listed for a cell.
RULES: tuple[RuleEntry, ...] = (
    RuleEntry(Rule.COUNT, count),
    RuleEntry(Rule.DONATION, _named(donation)),
    RuleEntry(Rule.HOST_TRANSFER, _named(host_transfer)),
    RuleEntry(Rule.RNG_KEYS, _named(rng_keys)),
    RuleEntry(Rule.PRECISION, _named(precision)),
    RuleEntry(Rule.CONSTANTS, _named(constants)),
    RuleEntry(Rule.PROGRAM_SIZE, _named(program_size)),
    RuleEntry(Rule.KERNELS, _named(kernels)),
    RuleEntry(Rule.LOOPS, _named(loops)),
    RuleEntry(Rule.REMAT, _named(remat)),
    RuleEntry(Rule.CONDITIONAL, _named(conditional)),
    RuleEntry(Rule.GRADIENT, _named(gradient)),
    RuleEntry(Rule.SHARDING, _named(sharding)),
    RuleEntry(Rule.COLLECTIVES, _named(collectives)),
    RuleEntry(Rule.SHAPES, _named(shapes)),
    RuleEntry(Rule.OPS, _named(ops)),
    RuleEntry(Rule.HLO_TEXT, hlo_text),
    RuleEntry(Rule.MISSING_GOLDEN, golden_parts),
    RuleEntry(Rule.MEMORY, memory),
    RuleEntry(Rule.HOST_COST, host_cost),
    RuleEntry(Rule.RNG_SCALING, rng_scaling, needs_golden=False),
    RuleEntry(Rule.LAUNCH_SCALING, launch_scaling, needs_golden=False),
    RuleEntry(Rule.DEAD_RNG, dead_rng, needs_golden=False),
)


def used_waivers(findings: Sequence[Finding]) -> set[int]:
    """The indexes of the waivers that waived something among ``findings``: a waived finding's, and the patterns a
    dead-RNG finding set apart."""
    used = {w.index for f in findings for w in f.waivers}
    used.update(w.index for f in findings if isinstance(f.facts, DeadRng) for w in f.facts.waived_patterns.values())
    return used
