"""``gradient``: weights the loss no longer reaches (or newly does), optimizer transforms (clipping), loss scaling and
loss terms added or removed: a regression, never an improvement, whatever it does to the program's size."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hlo_audit.findings import NamedChange
from hlo_audit.hlo.changes import ChangeKind
from hlo_audit.rules.spec import Context, named_spec, of_kind

if TYPE_CHECKING:
    from hlo_audit.comparison import CellDelta

NAME = "gradient"
_KINDS = (ChangeKind.GRADIENT, ChangeKind.TRANSFORM, ChangeKind.LOSS_SCALING, ChangeKind.LOSS_TERM)


def gradient(d: CellDelta, ctx: Context) -> NamedChange | None:
    """Weights the loss no longer reaches (or newly does) and optimizer transforms added or removed (clipping): a
    regression, never an improvement, whatever it does to the program's size."""
    changes = tuple(c for kind in _KINDS for c in of_kind(d, kind, program_changed=True))
    return NamedChange(NAME, True, changes, command=ctx.command(d.cell)) if changes else None


SPEC = named_spec(NAME, gradient, _KINDS, "gradient reach lost, optimizer transforms, loss scaling or terms changed",
                  explains_size=True)
