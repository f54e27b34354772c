"""``missing_golden``: a cell judged against a golden that is not all there. The judge here names the parts a
readable golden lacks of what the rules compare for the cell (``golden.completeness``: an older format's, or
damaged), with the golden update that writes them, never a pass (issue 34). The gate makes the rule's other findings
itself (no golden, one it cannot read, another compiler stack's under a pinned stack, a golden without a cell), and
the text rule makes one for a golden text that is missing, not UTF-8 or not a module."""

from __future__ import annotations

from hlo_audit.findings import Finding, MissingGolden, StaleGolden
from hlo_audit.golden.completeness import lacking
from hlo_audit.golden.record import GOLDEN_FORMAT
from hlo_audit.policy import Action
from hlo_audit.results import Severity
from hlo_audit.rules.spec import Context, RuleSpec, Subject

NAME = "missing_golden"


def golden_parts(subject: Subject, ctx: Context) -> Finding | None:
    """A regression where the golden lacks parts the rules compare for the cell, naming them, the format its summary
    says and the golden update that writes them; None where it lacks none."""
    golden, result = subject.golden, subject.result
    lacks = lacking(golden, result, subject.leads)
    if not lacks:
        return None
    cid = result.cell.id
    return Finding(cid, Severity.REGRESSION, NAME, MissingGolden(
        why=str(golden.summary) if golden.summary is not None else cid, command=ctx.command(cid), lacks=lacks,
        golden_format=golden.record.format, damaged=golden.record.format >= GOLDEN_FORMAT))


SPEC = RuleSpec(NAME, Action.FAIL, golden_parts, (MissingGolden, StaleGolden),
                doc="a cell without a readable, complete golden (and a golden without a cell)")
