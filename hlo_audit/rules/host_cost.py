"""``host_cost``: the step's host work per call (``host_cost``): the state leaves its call flattens against the
golden's, beyond its tolerance (the time, where a host figure was measured, is the words)."""

from __future__ import annotations

from hlo_audit.findings import Finding, GoldenPart
from hlo_audit.host_cost import HostCostChange
from hlo_audit.host_cost import host_cost as host_cost_change
from hlo_audit.policy import Action
from hlo_audit.results import Severity
from hlo_audit.rules.spec import Context, RuleSpec, Subject, Tolerance

NAME = "host_cost"


def host_cost(subject: Subject, ctx: Context) -> Finding | None:
    """State leaves per call of this step's lowering against what the golden's step passed as its own lowering bears
    it out (``host_cost.implied_leaves``: its entry's parameters, the leaves it records beyond them no further than
    this step shows), with the time of each side's host figure where one was measured; nothing where the cell has
    no readable golden or this run knows none of its call's leaves."""
    record = subject.golden.record if subject.golden is not None else None
    if record is None:
        return None
    result = subject.result
    facts = host_cost_change(record.leaves_per_call, result.leaves_per_call, record.entry_params,
                             result.summary.entry_params, ctx.tolerance(NAME), ctx.command(subject.cell),
                             golden=record.host, now=result.host)
    if facts is None:
        return None
    return Finding(subject.cell, Severity.REGRESSION if facts.worse else Severity.IMPROVEMENT, NAME, facts)


SPEC = RuleSpec(NAME, Action.FAIL, host_cost, (HostCostChange,), tolerance=Tolerance(0.0, "0.1 for 10%"),
                doc="state leaves marshalled per call against the golden's, beyond its tolerance",
                golden_parts=(GoldenPart.HOST_FIGURE, GoldenPart.CALL_LEAVES))
