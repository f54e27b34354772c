"""``host_cost``: the step's host work per call (``host_cost``): state leaves against the figure recorded beside the
golden, beyond its tolerance (the time is the words)."""

from __future__ import annotations

from hlo_audit.findings import Finding
from hlo_audit.host_cost import HostCostChange, host_cost as host_cost_change
from hlo_audit.policy import Action
from hlo_audit.results import Severity
from hlo_audit.rules.spec import Context, RuleSpec, Subject, Tolerance

NAME = "host_cost"


def host_cost(subject: Subject, ctx: Context) -> Finding | None:
    """State leaves per call measured now against what the golden's step passed as its own lowering bears it out
    (``host_cost.implied_leaves``: its entry's parameters, its figure's leaves beyond them no further than this step
    shows); nothing where this run measured no figure or the cell has no readable golden."""
    record = subject.golden.record if subject.golden is not None else None
    if record is None:
        return None
    facts = host_cost_change(record.host, subject.result.host, record.entry_params, subject.result.summary.entry_params,
                             ctx.tolerance(NAME), ctx.command(subject.cell))
    if facts is None:
        return None
    return Finding(subject.cell, Severity.REGRESSION if facts.worse else Severity.IMPROVEMENT, NAME, facts)


SPEC = RuleSpec(NAME, Action.FAIL, host_cost, (HostCostChange,), tolerance=Tolerance(0.0, "0.1 for 10%"),
                doc="state leaves marshalled per call against the golden's host figure, beyond its tolerance")
