"""``host_cost``: the step's host work per call (``host_cost``): the state leaves its call flattens against the
golden's, beyond its tolerance (the time, where a host figure was measured, is the words)."""

from __future__ import annotations

from hlo_audit.findings import Finding, GoldenPart
from hlo_audit.host_cost import HostCostChange
from hlo_audit.host_cost import host_cost as host_cost_change
from hlo_audit.policy import Action
from hlo_audit.results import Severity
from hlo_audit.rules.spec import Context, RuleSpec, Subject, Tolerance
from hlo_audit.rules.wording import Json, host_time

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


def host_cost_text(facts: HostCostChange) -> str:
    leaves = f"{facts.leaves_delta:+d} state leaves"
    unborne = "" if not facts.claim_unborne else (
        f"; the golden claims {facts.golden_leaves} leaves, its entry's {facts.golden_params} parameters and this step "
        f"bear out {facts.implied}")
    if not facts.timed:  # the leaves alone: no figure measured on one side or the other
        cost = "" if facts.now is None else f", {host_time(facts.now.per_call_us.median)} per call now"
        head = (f"host work per call: {facts.implied} -> {facts.now_leaves} state leaves the call flattens "
                f"({leaves}{cost})")
        tail = "" if not facts.worse else " (`hlo-audit measure` times what each costs)"
        return (f"{head}{unborne}{tail}. If intended: {facts.command}" if facts.worse
                else f"{head}{unborne}; record the smaller count: {facts.command}")
    head = (f"host work per call {host_time(facts.median_delta_us, signed=True)} ({leaves}) through {facts.caller}: "
            f"{host_time(facts.golden.per_call_us.median)} -> {host_time(facts.now.per_call_us.median)}")
    noise = "" if facts.beyond_spread else " (the times are within their rounds' spread: the leaves decide)"
    where = "" if facts.same_machine else (f"; the golden's time was measured on another machine "
                                           f"({facts.golden.machine or 'unknown'})")
    if facts.worse:
        return f"{head}{noise}{where}{unborne}. If intended: {facts.command}"
    return f"{head}{noise}{where}{unborne}; record the smaller figure: {facts.command}"


def _details(facts: HostCostChange) -> Json:
    return {"caller": facts.caller, "golden": facts.golden.to_record() if facts.golden else None,
            "now": facts.now.to_record() if facts.now else None, "now_leaves": facts.now_leaves,
            "golden_leaves": facts.golden_leaves, "leaves_delta": facts.leaves_delta, "implied_leaves": facts.implied,
            "golden_params": facts.golden_params, "tolerance": facts.tolerance, "regenerate": facts.command}


SPEC = RuleSpec(NAME, Action.FAIL, host_cost, (HostCostChange,), tolerance=Tolerance(0.0, "0.1 for 10%"),
                doc="state leaves marshalled per call against the golden's, beyond its tolerance",
                golden_parts=(GoldenPart.HOST_FIGURE, GoldenPart.CALL_LEAVES), message=host_cost_text,
                details=_details)
