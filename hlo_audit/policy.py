"""What the gate applies: each rule's action (fail, warn or off) and the waivers, typed, built from a config in one
place (``Policy.of``; the config validates the tables first, ``config._policy`` and ``config._waivers``)."""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from hlo_audit.matrix import Cell, matches_rule


class Action(StrEnum):
    FAIL = "fail"
    WARN = "warn"
    OFF = "off"


class Rule(StrEnum):
    """The gate's rules (a config's ``[policy]`` keys) and the kinds of finding that are not a rule's."""

    COUNT = "count"
    RNG_SCALING = "rng_scaling"
    LAUNCH_SCALING = "launch_scaling"
    HLO_TEXT = "hlo_text"
    MISSING_GOLDEN = "missing_golden"
    DEAD_RNG = "dead_rng"
    MEMORY = "memory"
    STALE_WAIVER = "stale_waiver"
    # The named rules: kinds of change the structural diff names against the golden's text (``named_rules``).
    DONATION = "donation"
    HOST_TRANSFER = "host_transfer"
    PRECISION = "precision"
    PROGRAM_SIZE = "program_size"
    KERNELS = "kernels"
    LOOPS = "loops"
    REMAT = "remat"
    GRADIENT = "gradient"
    HOST_COST = "host_cost"  # the step's host work per call (``host_cost``): state leaves against the golden's figure
    SHARDING = "sharding"
    COLLECTIVES = "collectives"
    SHAPES = "shapes"
    OPS = "ops"
    UNJUDGED = "unjudged"  # a cell with a golden that could not be judged here (unavailable): fails unless waived
    RNG_KEYS = "rng_keys"  # random bits from a literal key, or one key drawn from twice (``hlo.rng_keys``)
    CONSTANTS = "constants"
    CONDITIONAL = "conditional"  # a lax.cond removed or added, replaced by computing both branches (change_terms)
    LOWERING = "lowering"  # a cell that failed or is unavailable: not a rule, no action
    ALL = "all"  # the one finding of a cell that matches its golden


DEFAULT_POLICY = {"count": "fail", "rng_scaling": "fail", "launch_scaling": "fail", "hlo_text": "fail",
                  "missing_golden": "fail", "dead_rng": "warn", "memory": "warn", "stale_waiver": "warn",
                  "donation": "fail", "host_transfer": "fail", "precision": "fail", "program_size": "fail",
                  "kernels": "fail", "loops": "fail", "remat": "fail", "gradient": "fail", "host_cost": "fail",
                  "sharding": "fail", "collectives": "fail", "shapes": "fail", "ops": "fail",
                  "unjudged": "fail", "rng_keys": "fail", "constants": "fail", "conditional": "fail"}


@dataclass(frozen=True)
class Waiver:
    rule: str
    reason: str
    match: Mapping[str, str]  # cell attribute -> value (model, scan, quant, layers, platform)
    pattern: str | None = None  # dead_rng only: a glob over stream patterns; None waives the whole finding
    index: int = -1  # its position in the config's waive list
    source: str = ""  # where it is written: ``hlo-audit.toml: waive[3]``
    built_in: bool = False  # one of the defaults for MaxText's known leaks, not written in the user's config

    def covers(self, rule: str, cell: Cell) -> bool:
        return rule == self.rule and matches_rule(cell, self.match)

    def covers_pattern(self, pattern: str) -> bool:
        return self.pattern is not None and fnmatch.fnmatchcase(pattern, self.pattern)


@dataclass(frozen=True)
class Policy:
    actions: Mapping[str, str]
    waivers: Sequence[Waiver] = ()
    memory_tolerance: float = 0.02  # the memory rule's allowance over the golden, as a fraction
    program_size_tolerance: float = 0.05  # the program_size rule's allowance over the golden's instructions
    host_cost_tolerance: float = 0.0  # the host_cost rule's allowance over the golden's state leaves, as a fraction

    def action(self, rule: str, default: str = Action.FAIL) -> Action:
        return Action(self.actions.get(rule, default))

    def waiver(self, rule: str, cell: Cell) -> Waiver | None:
        return next((w for w in self.waivers if w.covers(rule, cell) and w.pattern is None), None)

    def pattern_waiver(self, rule: str, cell: Cell, pattern: str) -> Waiver | None:
        return next((w for w in self.waivers if w.covers(rule, cell) and w.covers_pattern(pattern)), None)

    @classmethod
    def default(cls) -> Policy:
        return cls(dict(DEFAULT_POLICY))

    @classmethod
    def of(cls, actions: Mapping[str, str], waivers: Sequence[Mapping[str, str]], built_in: bool, source: str,
           memory_tolerance: float, program_size_tolerance: float = 0.05) -> Policy:
        """The policy of a config's validated ``[policy]`` and ``[[waive]]`` tables (``config.Config.rules``)."""
        return cls(actions, tuple(
            Waiver(rule=w["rule"], reason=w["reason"], pattern=w.get("pattern"),
                   match={k: v for k, v in w.items() if k not in ("rule", "reason", "pattern")}, index=i,
                   source=f"built-in default waive[{i}]" if built_in else f"{source}: waive[{i}]", built_in=built_in)
            for i, w in enumerate(waivers)), memory_tolerance=memory_tolerance,
            program_size_tolerance=program_size_tolerance)
