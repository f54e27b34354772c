"""The depth series' rules, of the cell alone (no golden), each reported once, on the series' shallowest cell:

* ``rng_scaling``: in an unrolled (scan off) series, RNG parameters must not grow with depth. That growth is the
  seed-000 bug: per-layer RNG state the host marshals every step.
* ``launch_scaling``: in an unrolled series of GPU cells, the kernels that read RNG state must not grow with depth
  either: each is a launch in the step's dependency chain (seed 000 measured 673 such counter kernels per step on
  8xH100 as 8% of step time), and a stream shared across layers adds them without a parameter.
"""

from __future__ import annotations

from collections.abc import Callable

from hlo_audit.findings import Finding, LaunchScaling, RngScaling
from hlo_audit.policy import Action
from hlo_audit.results import Severity
from hlo_audit.rules.count import RNG_ROLES
from hlo_audit.rules.spec import Context, RuleSpec, Subject
from hlo_audit.rules.wording import PARAM_GROUPS_SHOWN, Json
from hlo_audit.scaling import Series, rng_launch_slope, rng_slope


def _unrolled_growth(subject: Subject, slope_of: Callable[[Series], float]) -> tuple[Series, float] | None:
    """The cell's series and its slope where the cell leads an unrolled series whose ``slope_of`` grows with depth."""
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
    return Finding(subject.cell, Severity.REGRESSION, "rng_scaling",
                   RngScaling(slope, by_role, leads.depths, leads.rng_patterns))


def launch_scaling(subject: Subject, ctx: Context) -> Finding | None:
    """Kernels that read RNG state, per layer of an unrolled GPU series."""
    grown = _unrolled_growth(subject, rng_launch_slope)
    if grown is None:
        return None
    leads, slope = grown
    per_layer = {k: leads.launches[k].slope for k in ("total", "scalar") if leads.launches[k].slope}
    return Finding(subject.cell, Severity.REGRESSION, "launch_scaling",
                   LaunchScaling(slope, per_layer, leads.depths, leads.launch_groups))


def _rng_message(facts: RngScaling) -> str:
    where = ", ".join(f"{p} {n:+g}" for p, n in list(facts.patterns.items())[:PARAM_GROUPS_SHOWN])
    more = len(facts.patterns) - PARAM_GROUPS_SHOWN
    return (f"RNG parameters grow by {facts.slope:g} per layer in an unrolled model "
            f"({', '.join(f'{k} {v:+g}' for k, v in facts.by_role.items())}; "
            f"depths {', '.join(map(str, facts.depths))})"
            + (f": per layer {where}" + (f" and {more} more patterns" if more > 0 else "") if where else ""))


def _launch_message(facts: LaunchScaling) -> str:
    depths = facts.depths
    grown = [g.describe(signed=True) for g in facts.groups if g.count > 0][:3]
    return (f"kernels that read RNG state grow by {facts.slope:g} per layer in an unrolled model "
            f"({', '.join(f'{k} {v:+g}' for k, v in facts.per_layer.items())} per layer; depths "
            f"{', '.join(map(str, depths))})"
            + (f"; from L{depths[0]} to L{depths[-1]}: {'; '.join(grown)}" if grown else ""))


def _rng_details(facts: RngScaling) -> Json:
    return {"rng_per_layer": facts.slope, "depths": list(facts.depths), "patterns": dict(facts.patterns)}


def _launch_details(facts: LaunchScaling) -> Json:
    return {"rng_launches_per_layer": facts.slope, "launches_per_layer": dict(facts.per_layer),
            "depths": list(facts.depths), "groups": [g.to_record() for g in facts.groups]}


RNG_SCALING = RuleSpec("rng_scaling", Action.FAIL, rng_scaling, (RngScaling,), needs_golden=False,
                       doc="RNG parameters that grow with depth in an unrolled series",
                       message=_rng_message, details=_rng_details)
LAUNCH_SCALING = RuleSpec("launch_scaling", Action.FAIL, launch_scaling, (LaunchScaling,), needs_golden=False,
                          doc="kernels reading RNG state per layer of an unrolled GPU series",
                          message=_launch_message, details=_launch_details)
