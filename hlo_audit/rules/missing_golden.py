"""``missing_golden``: a cell judged against a golden that is not all there: none, one that cannot be read, another
compiler stack's on a pinned run, a text it names that is missing, not UTF-8 or not a module, or parts the rules
compare for the cell that it lacks (an older format's, or damaged), each with the golden update that writes it, never
a pass (issue 34). What a golden wants is decided once, in ``golden.health``; the gate names the goldens without a
cell (``stale_goldens``)."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from hlo_audit.findings import Finding, MissingGolden, StaleGolden
from hlo_audit.golden.health import orphans, wanting
from hlo_audit.policy import Action
from hlo_audit.results import Severity
from hlo_audit.rules.spec import Context, RuleSpec, Subject

NAME = "missing_golden"


def golden_wanting(subject: Subject, ctx: Context) -> Finding | None:
    """A regression where the cell's golden is not all there (``golden.health.wanting`` says what it wants); None
    where it is whole."""
    facts = wanting(subject.result, subject.golden, subject.delta, subject.leads, ctx.command, ctx.pinned_by)
    return Finding(subject.cell, Severity.REGRESSION, NAME, facts) if facts is not None else None


def stale_goldens(golden_ids: Sequence[str], matrix_ids: Collection[str]) -> list[Finding]:
    """A golden the matrix has no cell for: stale, said (``golden update --prune`` removes it)."""
    return [Finding(cid, Severity.STALE, NAME, StaleGolden()) for cid in orphans(golden_ids, matrix_ids)]


SPEC = RuleSpec(NAME, Action.FAIL, golden_wanting, (MissingGolden, StaleGolden), needs_golden=False,
                doc="a cell without a readable, complete golden (and a golden without a cell)")
