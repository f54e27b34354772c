"""What a step costs the host per call, as a figure a golden keeps, and the ``host_cost`` rule that gates its growth.

The figure (``HostFigure``) is measured by ``hlo_audit.commands.measure`` on whatever host runs it, CPU included: the
function the user calls (``nnx.jit``'s wrapper, or jax's jitted step) with a trivial body over stand-ins of the cell's
arguments, so what is timed is the per-call host work alone: pytree flatten, ``nnx.jit``'s graph traversal and
bookkeeping, and the dispatch of every state leaf. On a real TPU v5e chip that work is what a dead per-layer RNG
stream costs: nnx.jit's host time per call went 33 -> 59 ms for +288 state leaves (89 us a leaf), and the unrolled
step became host-bound (+26% blocked). The device paid nothing measurable.

The rule gates on the state leaves, not on the time. The time is noisy (tens of percent between runs on a shared CI
runner) and belongs to the machine it was measured on (a golden recorded on a workstation is checked on a runner);
the leaf count is exact, and the host work grows with it linearly (the chip: 89 us a leaf through nnx.jit, 12 us
through jax.jit; the same slope on a CPU). The count is each side's lowering's (``Lowering.call_leaves``: the
leaves of the call's arguments, those jax pruned from the entry included), and every golden records its own, so the
rule judges every lowered cell, a figure measured or not: a golden whose figure was deleted no longer turns it off
(issue 48). A regression is state leaves beyond ``tolerance`` (a fraction of the golden's; 0: any growth), and the
time measured on each side, where it was, is the finding's words: what the growth costs. The golden's leaves are
taken as far as its own lowering bears them out (``implied_leaves``: its entry's parameters are leaves of its call),
never on its word alone. This module is jax-free: a record and a pure function.
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
    """The ``host_cost`` rule's finding: state leaves per call (``now_leaves``, what this step's call flattens, from
    its lowering's arguments) against what the golden's step passed as far as its own lowering bears it out
    (``implied``: ``implied_leaves`` of what it records, ``golden_leaves``), with the time each side took where a host
    figure was measured (``golden``, ``now``: None where none was; ``same_machine``: whether the two times were
    measured on one kind of machine, so their difference means something). ``worse``: a regression (else fewer
    leaves, borne out by a smaller entry: an improvement to record)."""

    now_leaves: int
    golden_leaves: int  # what the golden records of its call's leaves
    golden: HostFigure | None
    now: HostFigure | None
    tolerance: float
    worse: bool
    command: str
    implied: int = 0
    golden_params: int = 0  # the golden's entry parameters: what its lowering takes per call

    @property
    def caller(self) -> str | None:
        """Through what the call was timed (``nnx.jit``, ``jax.jit``), where it was."""
        figure = self.now or self.golden
        return figure.caller if figure is not None else None

    @property
    def leaves_delta(self) -> int:
        return self.now_leaves - self.implied

    @property
    def claim_unborne(self) -> bool:
        """Whether the golden claims more leaves than its lowering and this step bear out."""
        return self.golden_leaves > self.implied

    @property
    def timed(self) -> bool:
        """Whether both sides' time per call is known (each measured a figure)."""
        return self.golden is not None and self.now is not None

    @property
    def median_delta_us(self) -> float:
        return self.now.per_call_us.median - self.golden.per_call_us.median if self.timed else 0.0

    @property
    def same_machine(self) -> bool:
        return self.timed and self.golden.machine == self.now.machine

    @property
    def beyond_spread(self) -> bool:
        """Whether the time moved beyond both sides' spread (the two [min, max] ranges do not overlap)."""
        return self.timed and not self.golden.per_call_us.overlaps(self.now.per_call_us)


def leaves_per_call(call_leaves: int | None, figure: HostFigure | None) -> int | None:
    """What one side says of its call's state leaves: its lowering's count, else its host figure's (an older golden,
    a result measured but not lowered here); None: neither (nothing to compare)."""
    return call_leaves if call_leaves is not None else figure.leaves if figure is not None else None


def implied_leaves(golden_leaves: int, golden_params: int, now_leaves: int, now_params: int) -> int:
    """The state leaves per call the golden's step passed, as far as evidence bears it out: its entry's parameters
    (each one a leaf of the call), plus the leaves its call passed that its entry did not take (jax prunes unused
    arguments) as the golden records them, but no more than this step passes beside its own entry. A count beyond
    that is the golden's word alone: raised from 6 to 80 (inside the plausibility bound), it hid 20 more leaves per
    call and read as an improvement while the host time rose (issue 48)."""
    claimed_outside = golden_leaves - golden_params
    return golden_params + max(0, min(claimed_outside, now_leaves - now_params))


def host_cost(golden_leaves: int | None, now_leaves: int | None, golden_params: int, now_params: int,
              tolerance: float, command: str, golden: HostFigure | None = None,
              now: HostFigure | None = None) -> HostCostChange | None:
    """State leaves per call against what the golden's step passed (``implied_leaves``: its entry's parameters, and
    the leaves it records outside them as far as this step bears them out): more than ``tolerance`` (a fraction of
    those) a regression; fewer by as much an improvement, which only a smaller entry can make (growth is never an
    improvement). None when either side's leaves are not known (a golden that records no count lacks a part the
    ``missing_golden`` rule names; a step whose jax did not say) or when they held. The leaves come
    from each side's lowering, so no figure need be measured or recorded for them to be judged; the figures
    (``golden``, ``now``), where measured, give the time: what the finding says the change costs, never gated
    (module doc)."""
    if now_leaves is None or golden_leaves is None:
        return None
    implied = implied_leaves(golden_leaves, golden_params, now_leaves, now_params)
    delta = now_leaves - implied
    if abs(delta) <= tolerance * implied or delta == 0:
        return None
    return HostCostChange(now_leaves=now_leaves, golden_leaves=golden_leaves, golden=golden, now=now,
                          tolerance=tolerance, worse=delta > 0, command=command, implied=implied,
                          golden_params=golden_params)


@dataclass(frozen=True)
class Rounds:
    """How much to run: rounds (interleaved across a group), warm-up calls, then timed calls per loop."""

    rounds: int = 3
    warmup: int = 3
    calls: int = 20
    host_calls: int = 50  # calls per round of the trivial-body twin (the host figure)


# What `check` and `golden update` spend on a host figure (the rule reads its leaves; its time is the words).
CHECK_ROUNDS = Rounds(rounds=3, warmup=1, calls=1, host_calls=20)
