"""What a step costs the host per call, as a figure a golden keeps, and the ``host_cost`` rule that gates its growth.

The figure (``HostFigure``) is measured by ``hlo_audit.judging.measure`` on whatever host runs it, CPU included: the
function the user calls (``nnx.jit``'s wrapper, or jax's jitted step) with a trivial body over stand-ins of the cell's
arguments, so what is timed is the per-call host work alone: pytree flatten, ``nnx.jit``'s graph traversal and
bookkeeping, and the dispatch of every state leaf. On a real TPU v5e chip that work is what a dead per-layer RNG
stream costs: nnx.jit's host time per call went 33 -> 59 ms for +288 state leaves (89 us a leaf), and the unrolled
step became host-bound (+26% blocked). The device paid nothing measurable.

The rule gates on the state leaves, not on the time. The time is noisy (tens of percent between runs on a shared CI
runner) and belongs to the machine it was measured on (a golden recorded on a workstation is checked on a runner);
the leaf count is exact, and the host work grows with it linearly (the chip: 89 us a leaf through nnx.jit, 12 us
through jax.jit; the same slope on a CPU). So a regression is state leaves beyond ``tolerance`` (a fraction of the
golden's; 0: any growth), and the time measured on each side is the finding's words: what the growth costs. This
module is jax-free: a record and a pure function.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Spread:
    """min / median / max of one figure over rounds (each round's own median)."""

    low: float
    median: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        return cls(min(values), statistics.median(values), max(values))

    def overlaps(self, other: Spread) -> bool:
        """Whether the two [low, high] ranges share a point: a difference within the rounds' own spread."""
        return self.low <= other.high and other.low <= self.high

    def to_record(self) -> list[float]:
        return [round(self.low, 3), round(self.median, 3), round(self.high, 3)]

    @classmethod
    def from_record(cls, record: Sequence[float]) -> Spread:
        return cls(*map(float, record))


@dataclass(frozen=True)
class HostFigure:
    """A step's host work per call: through which caller (``nnx.jit`` or ``jax.jit``), over how many state leaves
    (arrays the call flattens and dispatches), in microseconds per call over rounds, on which machine."""

    caller: str
    leaves: int
    per_call_us: Spread
    machine: str

    def to_record(self) -> dict[str, Any]:
        return {"caller": self.caller, "leaves": self.leaves, "per_call_us": self.per_call_us.to_record(),
                "machine": self.machine}

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> HostFigure:
        return cls(caller=record["caller"], leaves=int(record["leaves"]),
                   per_call_us=Spread.from_record(record["per_call_us"]), machine=record.get("machine", ""))


def figure_problem(record) -> str | None:
    """Why ``record`` is not a ``HostFigure`` record (a golden's ``host``), or None."""
    if not isinstance(record, dict):
        return "not an object"
    leaves, spread = record.get("leaves"), record.get("per_call_us")
    if not isinstance(leaves, int) or isinstance(leaves, bool) or leaves < 0:
        return "'leaves' is not a count"
    if not (isinstance(spread, list) and len(spread) == 3 and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in spread)):
        return "'per_call_us' is not [min, median, max]"
    if not isinstance(record.get("caller"), str):
        return "'caller' is not a string"
    return None


@dataclass(frozen=True)
class HostCostChange:
    """The ``host_cost`` rule's finding: state leaves per call against the golden's, with the time each side took
    (``same_machine``: whether the two times were measured on one kind of machine, so their difference means
    something). ``worse``: a regression (else fewer leaves, an improvement to record)."""

    caller: str
    golden: HostFigure
    now: HostFigure
    tolerance: float
    worse: bool
    command: str

    @property
    def leaves_delta(self) -> int:
        return self.now.leaves - self.golden.leaves

    @property
    def median_delta_us(self) -> float:
        return self.now.per_call_us.median - self.golden.per_call_us.median

    @property
    def same_machine(self) -> bool:
        return self.golden.machine == self.now.machine

    @property
    def beyond_spread(self) -> bool:
        """Whether the time moved beyond both sides' spread (the two [min, max] ranges do not overlap)."""
        return not self.golden.per_call_us.overlaps(self.now.per_call_us)


def host_cost(golden: HostFigure | None, now: HostFigure | None, tolerance: float,
              command: str) -> HostCostChange | None:
    """State leaves per call against the golden's figure: more than ``tolerance`` (a fraction of the golden's) a
    regression, fewer by as much an improvement; None when either side has no figure (a golden recorded before
    figures were kept, or a check that measured none: nothing is compared) or when the leaves held. The time is
    not gated (module doc): it is what the finding says the change costs."""
    if golden is None or now is None:
        return None
    delta = now.leaves - golden.leaves
    if abs(delta) <= tolerance * golden.leaves or delta == 0:
        return None
    return HostCostChange(caller=now.caller, golden=golden, now=now, tolerance=tolerance, worse=delta > 0,
                          command=command)
