"""``loops``: loops unrolled, layers rolled into a loop (``nn.scan``), loops added or removed, trip counts changed
(``hlo.change_flow``): a change to judge, a regression until accepted, whatever it does to the program's size."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hlo_audit.findings import Moved, NamedChange
from hlo_audit.hlo.changes import ROLLED, TRIP_COUNT, UNROLLED, Action, Change, ChangeKind
from hlo_audit.rules.spec import Context, KindWords, named_spec, of_kind
from hlo_audit.rules.wording import ops_text, plural

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


def _line(c: Change, kind: str, where: str) -> str:
    if c.subject == TRIP_COUNT:
        text = f"{kind}: trip count {c.before} -> {c.after}"
    elif c.subject == UNROLLED:
        loops = "a loop" if c.count == 1 else f"{c.count} loops"
        text = f"{kind}: {loops} of {c.before} unrolled ({c.per_step} copies of the body inline)"
    elif c.subject == ROLLED:
        layers = f"{c.layers} layers" if c.layers else "inline code"
        loops = "a loop" if c.count == 1 else f"{c.count} loops"
        text = f"{kind}: {layers} rolled into {loops} of {c.before}"
    else:
        verb = "added" if c.action is Action.ADDED else "removed"
        text = f"{kind}: a loop {verb}: {c.before}"
    if c.subject != TRIP_COUNT and c.instructions:
        text += f"; {c.instructions:+,} {plural(c.instructions, 'instruction')}"
        text += f" ({ops_text(c)})" if c.groups else ""
    return f"{text}; {where}".rstrip("; ")


SPEC = named_spec(NAME, loops, (KindWords(ChangeKind.LOOPS, "loops", _line),),
                  "loops unrolled, rolled, added or removed, trip counts changed",
                  explains_size=True)
