"""``loops``: loops unrolled, layers rolled into a loop (``nn.scan``), loops added or removed, trip counts changed
(``hlo.change_flow``): a change to judge, a regression until accepted, whatever it does to the program's size."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hlo_audit.findings import Moved, NamedChange
from hlo_audit.hlo.changes import ChangeKind
from hlo_audit.rules.spec import Context, named_spec, of_kind

if TYPE_CHECKING:
    from hlo_audit.comparison import CellDelta

NAME = "loops"


def loops(d: CellDelta, ctx: Context) -> NamedChange | None:
    """Loops added, removed, unrolled or rolled, or of another trip count: a change to judge, either way. Advisory
    where the golden's jax and this one write closed_calls apart (a loop's body inside a call on one side only is no
    loop the match pairs: ``program_size``)."""
    changes = of_kind(d, ChangeKind.LOOPS, program_changed=True)
    return NamedChange(NAME, True, changes, command=ctx.command(d.cell), environment=d.closed_calls_moved,
                       moved_by=Moved.CLOSED_CALLS) if changes else None


SPEC = named_spec(NAME, loops, (ChangeKind.LOOPS,), "loops unrolled, rolled, added or removed, trip counts changed",
                  explains_size=True)
