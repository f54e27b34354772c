"""The rules whose findings the gate makes itself (``gate.Gate``), not a judge of one compared cell: they have a
policy key, a default action and words like any other, and no judge here.

* ``unjudged``: a cell with a golden that could not be judged here (unavailable): fails unless waived with a reason;
* ``stale_waiver``: a waiver that waived nothing although every cell it covers was judged (``gate.stale_waivers``).
"""

from __future__ import annotations

from hlo_audit.findings import StaleWaiver, Unjudged
from hlo_audit.policy import Action
from hlo_audit.rules.spec import RuleSpec
from hlo_audit.rules.wording import Json, plural


def _unjudged_message(facts: Unjudged) -> str:
    return (f"cannot be judged here ({facts.status}: {facts.message}), yet it has a golden ({facts.golden}): a pass "
            f"would say nothing of it; make it lower here, or waive it with a reason (rule \"unjudged\")")


def _unjudged_details(facts: Unjudged) -> Json:
    return {"status": facts.status, "golden": facts.golden}


def _stale_waiver_message(facts: StaleWaiver) -> str:
    w = facts.waiver
    what = (f"covers {facts.covered} {plural(facts.covered, 'cell')}, none of which has a {w.rule} finding to waive"
            if facts.covered
            else "matches no cell of the matrix")
    return (f"waiver for {w.rule} {dict(w.match)} {what}: drop it, or it will hide that regression coming back "
            f"(reason given: {w.reason})")


def _stale_waiver_details(facts: StaleWaiver) -> Json:
    return {"rule": facts.waiver.rule, "match": dict(facts.waiver.match), "covered": facts.covered}


UNJUDGED = RuleSpec("unjudged", Action.FAIL, None, (Unjudged,), needs_golden=False,
                    doc="a cell with a golden that could not be judged here (unavailable)",
                    message=_unjudged_message, details=_unjudged_details)
STALE_WAIVER = RuleSpec("stale_waiver", Action.WARN, None, (StaleWaiver,), needs_golden=False,
                        doc="a waiver that waived nothing though every cell it covers was judged",
                        message=_stale_waiver_message, details=_stale_waiver_details)
