"""``count``: a ratchet. More entry parameters of any dtype or role than the golden is a regression; fewer is an
improvement that asks to tighten the golden. State captured as constants counts the same way, in arrays and bytes per
dtype: a step that starts baking state into its program fails like one that grows its entry parameters
(``hlo.constants``). So do RNG counter increments per step of streams never drawn from: each is a kernel on a GPU,
and seed 000's 672 dead ones came with no new parameter where streams were shared. A finding lists the path patterns
that grew, shrank or were renamed (with their roles), the streams whose increments grew, and the series' per-layer
slopes against the golden's: a slope steeper than the golden's is growth, a regression (never an improvement), and
every finding's accept command names the cell's whole depth series, since each depth's golden holds the series'
slopes. A GPU cell's launches per step count the same way: more kernels (in all, or scalar ones) or collectives per
step than the golden is a regression, and the finding says which launches came and what they read."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hlo_audit.findings import CountChange, CountKind, Finding, GoldenPart
from hlo_audit.policy import Action
from hlo_audit.results import Severity
from hlo_audit.rules.spec import Context, RuleSpec, Subject

if TYPE_CHECKING:
    from hlo_audit.comparison import CellDelta

NAME = "count"
# Roles whose entry parameters, fewer, a user calls an improvement: RNG state the host no longer marshals.
RNG_ROLES = ("rng_key", "rng_count")
# Launch counts that, fewer, are an improvement (a collective fewer is a change to judge: the sharding moved).
FEWER_IS_BETTER_LAUNCHES = ("total", "scalar")
# The verdicts of RNG streams whose counter increments per step the count ratchet fails on.
GATED_INCREMENTS = ("carried", "unknown")


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
    return Finding(subject.cell, severity, NAME, CountChange(
        kind=kind, golden_params=d.params.golden, now_params=d.params.now, by_dtype=d.params.by_dtype,
        by_role=d.params.by_role, groups=d.params.groups, patterns=patterns, captured=captured,
        increments=increments, launches=launches, slopes=slopes, command=ctx.command(subject.cell)))


def _better_only(d: CellDelta) -> bool:
    """Whether everything that shrank is what a user calls an improvement (``spec``'s doc): RNG state's parameters
    only, fewer kernels (not collectives), fewer constants baked in, fewer increments."""
    if any(n < 0 for role, n in d.params.by_role.items() if role not in RNG_ROLES):
        return False
    return d.launches is None or all(k in FEWER_IS_BETTER_LAUNCHES for k in d.launches.delta)


SPEC = RuleSpec(NAME, Action.FAIL, count, (CountChange,),
                doc="entry parameters, captured constants, never-drawn RNG increments, launches, slopes (a ratchet)",
                golden_parts=(GoldenPart.LAUNCHES, GoldenPart.CONSTANTS, GoldenPart.RNG_INCREMENTS,
                              GoldenPart.PATTERN_ROLES, GoldenPart.SLOPES))
