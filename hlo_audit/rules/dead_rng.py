"""``dead_rng``: RNG streams the step carries and never draws from (their state marshalled every call for nothing),
by pattern, of the cell alone; patterns a waiver names are set apart, and alone they make a waived finding."""

from __future__ import annotations

from hlo_audit.findings import DeadRng, Finding
from hlo_audit.policy import Action
from hlo_audit.results import Severity
from hlo_audit.rules.spec import Context, RuleSpec, Subject
from hlo_audit.rules.wording import Json, plural

NAME = "dead_rng"


def dead_rng(subject: Subject, ctx: Context) -> Finding | None:
    """Carried streams, by pattern; patterns a waiver names are set apart, and alone they make a waived finding."""
    result = subject.result
    rng = result.rng
    if rng is None or not rng.carried:
        return None
    dead = rng.dead_patterns
    waived = {p.pattern: w for p in dead
              if (w := ctx.policy.pattern_waiver(NAME, result.cell, p.pattern))}
    open_ = [p for p in dead if p.pattern not in waived]
    shown = open_ or dead
    facts = DeadRng(cell=result.cell.id, streams=sum(p.carried for p in shown),
                    params=sum(p.dead_params for p in shown), increments=sum(p.dead_increments for p in shown),
                    patterns=tuple(p.pattern for p in shown), largest=shown[0].pattern,
                    largest_streams=shown[0].carried, waived_patterns=waived)
    finding = Finding(result.cell.id, Severity.REGRESSION, NAME, facts)
    return finding if open_ else finding.waived(*{w.index: w for w in waived.values()}.values())


def _message(facts: DeadRng) -> str:
    more = (f" and {len(facts.patterns) - 1} more {plural(len(facts.patterns) - 1, 'pattern')}"
            if len(facts.patterns) > 1 else "")
    return (f"{facts.streams} RNG {plural(facts.streams, 'stream')} never drawn: {facts.params} entry "
            f"{plural(facts.params, 'parameter')} and {facts.increments:g} counter "
            f"{plural(facts.increments, 'increment')} per step of dead state (largest: {facts.largest} "
            f"x{facts.largest_streams}{more}); see `hlo-audit rng {facts.cell}`")


def _details(facts: DeadRng) -> Json:
    return {"dead_params": facts.params, "dead_increments": facts.increments, "patterns": list(facts.patterns),
            "waived_patterns": {k: w.reason for k, w in facts.waived_patterns.items()}}


SPEC = RuleSpec(NAME, Action.WARN, dead_rng, (DeadRng,), needs_golden=False, folds=True, pattern_waivers=True,
                doc="RNG streams carried and never drawn from (a waiver may name patterns)",
                message=_message, details=_details)
