"""The rules whose findings the gate makes itself (``gate.Gate``), not a judge of one compared cell: they have a
policy key, a default action and words like any other, and no judge here.

* ``unjudged``: a cell with a golden that could not be judged here (unavailable): fails unless waived with a reason;
* ``stale_waiver``: a waiver that waived nothing although every cell it covers was judged (``gate.stale_waivers``).
"""

from __future__ import annotations

from hlo_audit.findings import StaleWaiver, Unjudged
from hlo_audit.policy import Action
from hlo_audit.rules.spec import RuleSpec

UNJUDGED = RuleSpec("unjudged", Action.FAIL, None, (Unjudged,), needs_golden=False,
                    doc="a cell with a golden that could not be judged here (unavailable)")
STALE_WAIVER = RuleSpec("stale_waiver", Action.WARN, None, (StaleWaiver,), needs_golden=False,
                        doc="a waiver that waived nothing though every cell it covers was judged")
