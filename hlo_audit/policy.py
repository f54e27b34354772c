"""What the gate applies: each rule's action (fail, warn or off), the tolerances a config set and the waivers, typed,
built from a config in one place (``Policy.of``; the config validates the tables first, ``config._policy`` and
``config._waivers``). The rules themselves, their names and default actions are their specs' (``rules.registry``)."""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from hlo_audit.matrix import Cell, matches_rule


class Action(StrEnum):
    FAIL = "fail"
    WARN = "warn"
    OFF = "off"


@dataclass(frozen=True)
class Waiver:
    rule: str
    reason: str
    match: Mapping[str, str]  # cell attribute -> value (model, scan, quant, layers, platform)
    pattern: str | None = None  # dead_rng only: a glob over stream patterns; None waives the whole finding
    # unreached only: a glob over the repository paths of changed files (``src/legacy/*.py``) whose lines no cell
    # needs to reach (``check --changes``)
    path: str | None = None
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
    # rule -> the allowance a config set for it (a fraction; a rule absent here has its spec's default:
    # ``rules.registry.tolerances``)
    tolerances: Mapping[str, float] = field(default_factory=dict)

    def action(self, rule: str, default: Action) -> Action:
        """The config's action for ``rule``, else ``default``: its spec's (``rules.registry.applied`` passes it; a
        fallback of its own here once failed rules whose default is warn under a policy that names none)."""
        return Action(self.actions.get(rule, default))

    def waiver(self, rule: str, cell: Cell) -> Waiver | None:
        return next((w for w in self.waivers if w.covers(rule, cell) and w.pattern is None), None)

    def pattern_waiver(self, rule: str, cell: Cell, pattern: str) -> Waiver | None:
        return next((w for w in self.waivers if w.covers(rule, cell) and w.covers_pattern(pattern)), None)

    def path_waiver(self, rule: str, path: str) -> Waiver | None:
        """The first waiver of ``rule`` whose ``path`` glob matches a changed file's repository path."""
        return next((w for w in self.waivers if w.rule == rule and w.path is not None
                     and fnmatch.fnmatchcase(path, w.path)), None)

    @classmethod
    def of(cls, actions: Mapping[str, str], waivers: Sequence[Mapping[str, str]], built_in: bool, source: str,
           tolerances: Mapping[str, float]) -> Policy:
        """The policy of a config's validated ``[policy]`` and ``[[waive]]`` tables (``config.Config.rules``)."""
        return cls(actions, tuple(
            Waiver(rule=w["rule"], reason=w["reason"], pattern=w.get("pattern"), path=w.get("path"),
                   match={k: v for k, v in w.items() if k not in ("rule", "reason", "pattern", "path")}, index=i,
                   source=f"built-in default waive[{i}]" if built_in else f"{source}: waive[{i}]", built_in=built_in)
            for i, w in enumerate(waivers)), tolerances=tolerances)
