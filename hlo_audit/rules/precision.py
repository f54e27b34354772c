"""``precision``: dots and convolutions whose operand or result types or precision config changed, with the converts
around them and the FLOPs that moved: a regression either way (an upcast costs time, a downcast numerics)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hlo_audit.findings import NamedChange
from hlo_audit.hlo.changes import Change, ChangeKind
from hlo_audit.rules.spec import Context, KindWords, named_spec, of_kind
from hlo_audit.rules.wording import counted, per_layer

if TYPE_CHECKING:
    from hlo_audit.comparison import CellDelta

NAME = "precision"


def precision(d: CellDelta, ctx: Context) -> NamedChange | None:
    """Dots and convolutions of another precision: a regression whichever way (module doc)."""
    changes = of_kind(d, ChangeKind.PRECISION)
    return NamedChange(NAME, True, changes, command=ctx.command(d.cell)) if changes else None


def _line(c: Change, kind: str, where: str) -> str:
    text = f"{kind}: {counted(c.count, c.subject)}{per_layer(c)}: {c.before} now {c.after}"
    if c.instructions:
        text += f"; converts {c.instructions:+d}"
    follow = sum(n for op, n in c.groups if op != "rewired")
    if follow:
        text += f"; {counted(follow, 'op')} follow the dtype"
    if c.flops:
        text += f"; {c.flops:,} FLOPs per step moved"
    return f"{text}; {where}".rstrip("; ")


SPEC = named_spec(NAME, precision, (KindWords(ChangeKind.PRECISION, "precision", _line),),
                  "dots and convolutions of another precision",
                  explains_size=True)
