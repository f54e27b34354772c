"""``missing_golden``: a cell judged against a golden that is not all there: none, one that cannot be read, another
compiler stack's on a pinned run, a text it names that is missing, not UTF-8 or not a module, or parts the rules
compare for the cell that it lacks (an older format's, or damaged), each with the golden update that writes it, never
a pass (issue 34). What a golden wants is decided once, in ``golden.health``; the gate names the goldens without a
cell (``stale_goldens``)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import replace

from hlo_audit.findings import Finding, GoldenPart, MissingGolden, StaleGolden
from hlo_audit.golden.health import orphans, wanting
from hlo_audit.policy import Action
from hlo_audit.results import Severity
from hlo_audit.rules.spec import Context, RuleSpec, Subject
from hlo_audit.rules.wording import Json, and_list, environment_text

NAME = "missing_golden"


def golden_wanting(subject: Subject, ctx: Context) -> Finding | None:
    """A regression where the cell's golden is not all there (``golden.health.wanting`` says what it wants); None
    where it is whole."""
    facts = wanting(subject.result, subject.golden, subject.delta, subject.leads, ctx.command, ctx.pinned_by)
    if facts is None:
        return None
    if facts.lacks:
        facts = replace(facts, without=left_without(facts.lacks, ctx))
    return Finding(subject.cell, Severity.REGRESSION, NAME, facts)


def left_without(lacks: Sequence[GoldenPart], ctx: Context) -> tuple[str, ...]:
    """The rules a golden lacking ``lacks`` leaves with nothing to compare, as their specs say (``Context.comparing``),
    each once, in the registry's order."""
    return tuple(dict.fromkeys(rule for part in lacks for rule in ctx.comparing.get(part, ())))


def stale_goldens(golden_ids: Sequence[str], matrix_ids: Collection[str]) -> list[Finding]:
    """A golden the matrix has no cell for: stale, said (``golden update --prune`` removes it)."""
    return [Finding(cid, Severity.STALE, NAME, StaleGolden()) for cid in orphans(golden_ids, matrix_ids)]


# What each part of a golden a rule compares is called (``golden.health``); which rules compare it is their
# specs' to say (``registry.comparing``, read through ``Context.comparing``).
GOLDEN_PARTS = {
    GoldenPart.TEXT: "its text",
    GoldenPart.KERNEL_DIGESTS: "kernel digests",
    GoldenPart.LAUNCHES: "launches per step",
    GoldenPart.MEMORY: "memory",
    GoldenPart.CONSTANTS: "state captured as constants",
    GoldenPart.RNG_INCREMENTS: "RNG counter increments",
    GoldenPart.PATTERN_ROLES: "roles per path pattern",
    GoldenPart.SLOPES: "per-layer slopes",
    GoldenPart.HOST_FIGURE: "its host figure (its `measured` timing is there)",
    GoldenPart.CALL_LEAVES: "its call's state leaves",
}
RULES_NAMED = 5  # the rules a missing part's finding names before "and N more"
STALE_GOLDEN = "golden without a cell in the matrix (remove with `hlo-audit golden update --prune`)"


def _message(facts: MissingGolden | StaleGolden) -> str:
    if isinstance(facts, StaleGolden):
        return STALE_GOLDEN
    if facts.why is None:
        return f"no golden for this cell; create it with: {facts.command}"
    if facts.stack:
        return (f"{facts.why}: recorded under another compiler stack ({environment_text(facts.stack)}), and this "
                f"run's stack is pinned ({facts.pinned_by}: a CI runner's stack is fixed, so the difference is a "
                f"mistake, never advisory); re-bless it under this stack: {facts.command}")
    if not facts.lacks:
        return f"{facts.why}; regenerate it with: {facts.command}"
    parts = and_list([GOLDEN_PARTS[p] for p in facts.lacks])
    rules = list(facts.without) or ["none"]
    named = rules if len(rules) <= RULES_NAMED else [*rules[:RULES_NAMED - 1], f"{len(rules) - RULES_NAMED + 1} more"]
    lacks = (f"without {parts}: the rule{'s' if len(rules) > 1 else ''} {and_list(named)} "
             f"ha{'ve' if len(rules) > 1 else 's'} nothing to compare for this cell")
    if facts.damaged:
        return f"{facts.why}: damaged: says golden format {facts.golden_format}, yet {lacks}; regenerate it with: " \
               f"{facts.command}"
    return (f"{facts.why}: written by an older hlo-audit (golden format {facts.golden_format}) {lacks}; refresh it "
            f"with: {facts.command}")


def _details(facts: MissingGolden | StaleGolden) -> Json:
    if isinstance(facts, StaleGolden):
        return {}
    if facts.why is None:
        return {"regenerate": facts.command}
    return {"regenerate": facts.command,
            **({"lacks": [str(p) for p in facts.lacks], "golden_format": facts.golden_format,
                "damaged": facts.damaged, "without": list(facts.without)} if facts.lacks else {}),
            **({"stack": {c.key: {"golden": c.golden, "now": c.now} for c in facts.stack},
                "pinned_by": facts.pinned_by} if facts.stack else {})}


SPEC = RuleSpec(NAME, Action.FAIL, golden_wanting, (MissingGolden, StaleGolden), needs_golden=False,
                doc="a cell without a readable, complete golden (and a golden without a cell)",
                message=_message, details=_details)
