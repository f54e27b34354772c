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

from dataclasses import dataclass, replace
from enum import StrEnum
from typing import TYPE_CHECKING

from hlo_audit.comparison import ParamDelta
from hlo_audit.findings import (
    CapturedDelta,
    Finding,
    GoldenPart,
    IncrementChange,
    LaunchChange,
    SlopeChange,
)
from hlo_audit.hlo.diff import captured_change, signed_counts
from hlo_audit.policy import Action
from hlo_audit.results import Severity
from hlo_audit.rules.spec import Context, RuleSpec, Subject
from hlo_audit.rules.wording import (
    Json,
    golden_to_now,
    increments_text,
    launch_change_record,
    launches_text,
    patterns_text,
    slopes_text,
)

if TYPE_CHECKING:
    from hlo_audit.comparison import CellDelta

NAME = "count"


class CountKind(StrEnum):
    GREW = "grew"  # something gated grew: a regression
    MOVED = "moved"  # renamed patterns, or drawn streams' increments: nothing gated grew or shrank
    SHRANK = "shrank"  # an improvement that asks to tighten the golden (RNG state, baked constants, kernels fewer)
    CHANGED = "changed"  # fewer of what a program needs (weights, optimizer state, collectives): a change to judge


@dataclass(frozen=True)
class CountChange:
    """The count rule's facts: the entry parameters against the golden's (the cell's comparison's ``ParamDelta``, its
    patterns as the comparison refines them with the texts' dtype moves: ``CellDelta.patterns``), with what else it
    counts that moved."""

    kind: CountKind
    params: ParamDelta
    captured: CapturedDelta | None
    increments: IncrementChange | None
    launches: LaunchChange | None
    slopes: SlopeChange | None
    command: str
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
        kind=kind, params=replace(d.params, patterns=patterns), captured=captured, increments=increments,
        launches=launches, slopes=slopes, command=ctx.command(subject.cell)))


def _better_only(d: CellDelta) -> bool:
    """Whether everything that shrank is what a user calls an improvement (``spec``'s doc): RNG state's parameters
    only, fewer kernels (not collectives), fewer constants baked in, fewer increments."""
    if any(n < 0 for role, n in d.params.by_role.items() if role not in RNG_ROLES):
        return False
    return d.launches is None or all(k in FEWER_IS_BETTER_LAUNCHES for k in d.launches.delta)


def _message(facts: CountChange) -> str:
    changes = []
    params = facts.params
    if params.counts_moved:
        changes.append(f"entry parameters {golden_to_now(params.golden, params.now)}: "
                       f"{signed_counts(params.by_dtype) or 'dtypes unchanged'}"
                       + (f" ({signed_counts(params.by_role)})" if params.by_role else ""))
    changes += [patterns_text(params.patterns)] if params.patterns else []
    changes += [captured_change(facts.captured.to_record())] if facts.captured else []
    changes += [increments_text(facts.increments)] if facts.increments else []
    changes += [launches_text(facts.launches)] if facts.launches else []
    changes += [slopes_text(facts.slopes)] if facts.slopes else []
    said = "; ".join(changes)
    return {CountKind.GREW: f"{said}. If intended: {facts.command}",
            CountKind.MOVED: f"{said}; record it: {facts.command}",
            CountKind.SHRANK: f"{said}; tighten the golden: {facts.command}",
            CountKind.CHANGED: f"{said}: fewer of what the step needs is a change to judge, not an improvement. "
                               f"If intended: {facts.command}"}[facts.kind]


def _details(facts: CountChange) -> Json:
    params = facts.params
    p = params.patterns
    moved = [{"pattern": m.pattern, "delta": m.delta, "roles": m.roles} for m in p.grown], [
        {"pattern": m.pattern, "delta": m.delta, "roles": m.roles} for m in p.shrunk]
    renamed = [{"from": r.before, "to": r.after, "params": r.params, "roles": r.roles} for r in p.renamed]
    retyped = [{"pattern": r.pattern, "dtypes": dict(r.dtypes), "roles": dict(r.roles)} for r in p.retyped]
    inc = facts.increments
    return {"entry_params": {"golden": params.golden, "now": params.now}, "by_dtype": params.by_dtype,
            "by_role": params.by_role, "groups": params.groups,
            "patterns": {"grown": moved[0], "shrunk": moved[1], "renamed": renamed, "retyped": retyped},
            "captured": facts.captured.to_record() if facts.captured else None,
            "rng_increments": None if inc is None else {
                "golden": inc.golden, "now": inc.now, "by_verdict": inc.by_verdict, "by_pattern": inc.by_pattern,
                "paths": {k: list(v) for k, v in inc.paths.items()}},
            "launches": launch_change_record(facts.launches) if facts.launches else None,
            "slopes": {k: list(v) for k, v in facts.slopes.moved.items()} if facts.slopes else None,
            "regenerate": facts.command}


SPEC = RuleSpec(NAME, Action.FAIL, count, (CountChange,),
                doc="entry parameters, captured constants, never-drawn RNG increments, launches, slopes (a ratchet)",
                golden_parts=(GoldenPart.LAUNCHES, GoldenPart.CONSTANTS, GoldenPart.RNG_INCREMENTS,
                              GoldenPart.PATTERN_ROLES, GoldenPart.SLOPES),
                message=_message, details=_details)
