"""A against B in `hlo-audit measure`: each timed metric of B (min / median / max over rounds) against A's, and
whether that is a difference worth a verdict. Jax-free: records and pure functions, as ``host_cost`` beside it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hlo_audit.host_cost import Spread

# The least difference of medians a verdict is given for, as a fraction of A's: three rounds whose ranges happen
# not to overlap by microseconds are not "slower" (+0.0%, issue 40). 1%: on the TPU v5e chip (docs/chip-2026-12-05)
# the leak's queued step time, where the device hides the host's extra work, came out +0.3% to +0.6% with the
# ranges apart; the differences a reader acts on (host time, blocked steps) were +1.3% to +73%.
MIN_EFFECT = 0.01


@dataclass(frozen=True)
class MetricChange:
    """One metric of B against A: both spreads, the ratio of medians, and whether that is a difference: the ranges
    apart and the medians at least ``MIN_EFFECT`` apart."""

    metric: str
    a: Spread
    b: Spread
    min_effect: float = MIN_EFFECT

    @property
    def ratio(self) -> float:
        return self.b.median / self.a.median if self.a.median else math.inf

    @property
    def separated(self) -> bool:
        """The two [min, max] ranges do not overlap."""
        return not self.a.overlaps(self.b)

    @property
    def beyond_noise(self) -> bool:
        """A verdict: the ranges apart, and an effect of at least ``min_effect``."""
        return self.separated and abs(self.ratio - 1) >= self.min_effect


@dataclass(frozen=True)
class Comparison:
    """B (``cell``) against A (``baseline``: the group's first cell, or the golden's recorded figures)."""

    baseline: str
    cell: str
    recorded: bool  # A is the golden's record (measured another time, maybe elsewhere), not interleaved rounds
    leaves: tuple[int, int]
    changes: tuple[MetricChange, ...]


METRICS = ("blocked_ms", "queued_ms", "host_ms")


def compare(a, b, recorded: bool = False) -> Comparison:
    """B's timing against A's (``measure.StepTiming`` each), metric by metric."""
    return Comparison(baseline=a.cell, cell=b.cell, recorded=recorded, leaves=(a.leaves, b.leaves),
                      changes=tuple(MetricChange(m, getattr(a, m), getattr(b, m)) for m in METRICS))
