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


RNG_SCALING = RuleSpec("rng_scaling", Action.FAIL, rng_scaling, (RngScaling,), needs_golden=False,
                       doc="RNG parameters that grow with depth in an unrolled series")
LAUNCH_SCALING = RuleSpec("launch_scaling", Action.FAIL, launch_scaling, (LaunchScaling,), needs_golden=False,
                          doc="kernels reading RNG state per layer of an unrolled GPU series")
