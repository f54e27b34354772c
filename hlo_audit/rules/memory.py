"""``memory`` (default ``warn``): a ratchet on a compiled cell's memory analysis, as ``count`` is on entry parameters:
argument, output, temp or generated-code bytes above the golden's by more than its tolerance (a fraction, default 2%)
is a regression; below it by as much, an improvement that asks to tighten the golden. Alias bytes are not gated here:
more of them means less memory, and fewer is a lost donation (the ``donation`` rule), whose smaller temp buffers are
no improvement."""

from __future__ import annotations

from hlo_audit.findings import Finding, GoldenPart, MemoryChange, TextVerdict
from hlo_audit.policy import Action
from hlo_audit.results import Severity
from hlo_audit.rules.donation import donation
from hlo_audit.rules.spec import Context, RuleSpec, Subject, Tolerance
from hlo_audit.rules.wording import Json, byte_changes

NAME = "memory"


def memory(subject: Subject, ctx: Context) -> Finding | None:
    """Compiled memory beyond the tolerance of the golden's, by gated kind: up a regression, down an improvement for
    the same program (a changed program with less memory is a change to judge: lost gradient work needs less memory
    too), except where the step lost its donation: then less temp memory is the donation's cost moved, not a gain,
    and the donation finding reports it."""
    d = subject.delta
    if d.memory is None:
        return None
    tolerance = ctx.tolerance(NAME)
    changed = d.memory.beyond(tolerance)
    if not changed:
        return None
    grew = any(b > a for a, b in changed.values())
    if not grew:
        lost = donation(d, ctx)
        if lost is not None and lost.worse:
            return None
    program_changed = not grew and d.text is TextVerdict.CHANGED
    return Finding(subject.cell, Severity.REGRESSION if grew or program_changed else Severity.IMPROVEMENT,
                   NAME, MemoryChange(changed, tolerance, grew, ctx.command(subject.cell), program_changed))


def _message(facts: MemoryChange) -> str:
    if facts.grew:
        grown = {k: v for k, v in facts.changed.items() if v[1] > v[0]}
        return (f"compiled memory grew beyond {facts.tolerance:.0%} of the golden: {byte_changes(grown)}."
                f" If intended: {facts.command}")
    if facts.program_changed:
        return (f"compiled memory shrank: {byte_changes(facts.changed)}, with the program changed: less memory for "
                f"another program is a change to judge, not an improvement. If intended: {facts.command}")
    return f"compiled memory shrank: {byte_changes(facts.changed)}; tighten the golden: {facts.command}"


def _details(facts: MemoryChange) -> Json:
    return {"memory": {k: {"golden": a, "now": b} for k, (a, b) in facts.changed.items()},
            "tolerance": facts.tolerance, "regenerate": facts.command}


SPEC = RuleSpec(NAME, Action.WARN, memory, (MemoryChange,), tolerance=Tolerance(0.02, "0.02 for 2%", top_level=True),
                doc="compiled cells' memory against the golden's, beyond its tolerance",
                golden_parts=(GoldenPart.MEMORY,), message=_message, details=_details)
