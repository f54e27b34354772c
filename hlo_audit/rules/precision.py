"""``precision``: dots and convolutions whose operand or result types or precision config changed, with the converts
around them and the FLOPs that moved: a regression either way (an upcast costs time, a downcast numerics)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hlo_audit.findings import NamedChange
from hlo_audit.hlo.changes import ChangeKind
from hlo_audit.rules.spec import Context, named_spec, of_kind

if TYPE_CHECKING:
    from hlo_audit.comparison import CellDelta

NAME = "precision"


def precision(d: CellDelta, ctx: Context) -> NamedChange | None:
    """Dots and convolutions of another precision: a regression whichever way (module doc)."""
    changes = of_kind(d, ChangeKind.PRECISION)
    return NamedChange(NAME, True, changes, command=ctx.command(d.cell)) if changes else None


SPEC = named_spec(NAME, precision, (ChangeKind.PRECISION,), "dots and convolutions of another precision",
                  explains_size=True)
