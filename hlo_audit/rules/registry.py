"""The registry: every rule's spec, once, in the order the gate judges a cell (and lists its findings), then the
rules whose findings the gate makes itself. Everything that lists rules is derived here: ``Rule`` (their names, and
the two kinds of finding that are no rule's), ``default_policy`` (the ``[policy]`` actions a config accepts, and their
defaults), ``judged`` (the table ``gate.Gate`` applies), the tolerances a config may set (``tolerance_keys``), each
rule's tolerance under a policy and those a policy's fingerprint reads.

Adding a rule is one module beside this one (its ``RuleSpec``) and one line in ``SPECS`` (docs/development.md,
"Adding a rule").
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from enum import StrEnum

from hlo_audit.findings import Finding, GoldenPart
from hlo_audit.hlo.changes import ChangeKind
from hlo_audit.matrix import Cell
from hlo_audit.policy import Action, Policy
from hlo_audit.results import Severity
from hlo_audit.rules import (
    conditional,
    count,
    dead_model,
    dead_rng,
    donation,
    gate_made,
    gradient,
    hlo_text,
    host_cost,
    host_transfer,
    kernels,
    loops,
    memory,
    missing_golden,
    precision,
    program_size,
    remat,
    rng_keys,
    routing,
    series,
    structure,
    unreached,
)
from hlo_audit.rules.spec import Context, KindWords, RuleSpec, Subject

SPECS: tuple[RuleSpec, ...] = (
    count.SPEC,
    donation.SPEC,
    host_transfer.SPEC,
    rng_keys.SPEC,
    precision.SPEC,
    structure.CONSTANTS,
    program_size.SPEC,
    kernels.SPEC,
    loops.SPEC,
    remat.SPEC,
    conditional.SPEC,
    routing.SPEC,
    gradient.SPEC,
    structure.SHARDING,
    structure.COLLECTIVES,
    structure.SHAPES,
    structure.OPS,
    hlo_text.SPEC,
    missing_golden.SPEC,
    memory.SPEC,
    host_cost.SPEC,
    series.RNG_SCALING,
    series.LAUNCH_SCALING,
    dead_rng.SPEC,
    dead_model.SPEC,
    gate_made.UNJUDGED,
    gate_made.STALE_WAIVER,
    unreached.SPEC,
)

# Kinds of finding that are no rule's (no policy key, no action): a cell that did not lower, a cell that matches.
NOT_RULES = {"LOWERING": "lowering", "ALL": "all"}


def _rule_names(specs: tuple[RuleSpec, ...]) -> type[StrEnum]:
    names = {spec.name.upper(): spec.name for spec in specs}
    rule = StrEnum("Rule", {**names, **NOT_RULES})
    rule.__doc__ = "The gate's rules (a config's ``[policy]`` keys, from ``SPECS``) and the kinds of finding no rule's."
    rule.__module__ = __name__
    return rule


# The built-in rules' names as constants, for the code that makes their findings outside a spec (``gate``).
Rule = _rule_names(SPECS)


# The tables derived from ``SPECS``, each read when used (a test adds a spec to ``SPECS`` and nothing else).

def spec_of(name: str) -> RuleSpec:
    return next(spec for spec in SPECS if spec.name == name)


def comparing(part: GoldenPart) -> tuple[str, ...]:
    """The rules that compare ``part`` of a golden (``RuleSpec.compares``), in the registry's order."""
    return tuple(spec.name for spec in SPECS if spec.compares(part))


def kind_words(kind: ChangeKind) -> KindWords:
    """How ``kind`` is worded in every report: the ``KindWords`` of the one spec that words it (``RuleSpec.words``)."""
    return next(words for spec in SPECS for words in spec.words if words.kind is kind)


def size_explained() -> tuple[ChangeKind, ...]:
    """The kinds of change whose rules account for the instructions they name (``RuleSpec.explains_size``): what
    the program_size rule leaves to them, in the registry's order."""
    return tuple(dict.fromkeys(kind for spec in SPECS if spec.explains_size for kind in spec.reads))


def default_policy() -> dict[str, str]:
    """Each rule's default action, by ``[policy]`` key, in the registry's order."""
    return {spec.name: spec.action.value for spec in SPECS}


def judged() -> tuple[RuleSpec, ...]:
    """The table the gate applies to each cell, in order: every spec with a judge."""
    return tuple(spec for spec in SPECS if spec.judge is not None)


def folded() -> frozenset[str]:
    """The rules whose advisories reports fold into one line (``RuleSpec.folds``)."""
    return frozenset(spec.name for spec in SPECS if spec.folds)


def tolerance_keys() -> dict[str, RuleSpec]:
    """``[policy]`` key -> its rule's spec, for each rule with a tolerance (``memory_tolerance``: the memory rule's)."""
    return {spec.tolerance_key: spec for spec in SPECS if spec.tolerance is not None}


def top_level_tolerance_keys() -> frozenset[str]:
    """The tolerances a config may also set at its top level (written there before ``[policy]`` held tolerances)."""
    return frozenset(key for key, spec in tolerance_keys().items() if spec.tolerance.top_level)


def tolerances(policy: Policy) -> dict[str, float]:
    """Each rule's tolerance under ``policy``: the config's where it set one, else the spec's."""
    return {spec.name: policy.tolerances.get(spec.name, spec.tolerance.default) for spec in tolerance_keys().values()}


def judge(subject: Subject, context: Context, rules: Collection[str] | None = None) -> list[Finding]:
    """What the judges find of one ok cell, in the registry's order, before the policy's actions and waivers; where
    no readable golden is there, only the rules of the cell alone run. ``rules``: only these rules' judges (None:
    every rule; `measure` judges ``host_cost`` alone)."""
    return [finding for spec in judged() if (subject.delta is not None or not spec.needs_golden)
            and (rules is None or spec.name in rules)
            if (finding := spec.judge(subject, context)) is not None]


def applied(policy: Policy, finding: Finding, cell: Cell | None) -> Finding | None:
    """``finding`` as the policy has it, the one place a finding meets the policy (the judges' and the gate's own
    alike): its rule's action (the config's, else its spec's default), ``off`` dropping it; a regression waived by a
    waiver covering ``cell`` (None: a finding of no cell, a stale waiver's), else a warning where the action is
    ``warn``."""
    action = policy.action(finding.rule, spec_of(finding.rule).action)
    if action is Action.OFF:
        return None
    if finding.severity is Severity.REGRESSION:
        waiver = policy.waiver(finding.rule, cell) if cell is not None else None
        if waiver is not None:
            return finding.waived(waiver)
        if action is Action.WARN:
            return finding.warned()
    return finding


def context(policy: Policy, command: Callable[[str], str], pinned_by: str | None = None) -> Context:
    """What every judge reads besides its subject: the policy, its tolerances resolved, the accept command, what
    pinned the run's stack (None: a local run)."""
    return Context(policy, command, tolerances(policy), pinned_by, size_explained(),
                   {part: comparing(part) for part in GoldenPart})


def fingerprinted_tolerances(policy: Policy) -> dict[str, float]:
    """The tolerances a policy's fingerprint reads (``plan.Judge``), by key: each top-level one always (as the
    fingerprint always had them), another where the config sets it otherwise than its spec's default (a default
    policy's fingerprint stays the one shards already wrote)."""
    resolved = tolerances(policy)
    return {key: resolved[spec.name] for key, spec in tolerance_keys().items()
            if spec.tolerance.top_level or resolved[spec.name] != spec.tolerance.default}
