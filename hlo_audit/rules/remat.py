"""``remat``: rematerialization removed or added, or its policy changed: memory against recomputation, a change to
judge either way."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hlo_audit.findings import NamedChange
from hlo_audit.hlo.changes import ChangeKind
from hlo_audit.rules.spec import Context, named_spec, of_kind

if TYPE_CHECKING:
    from hlo_audit.compare import CellDelta

NAME = "remat"


def remat(d: CellDelta, ctx: Context) -> NamedChange | None:
    """Rematerialization removed or added, or its policy changed: memory against recomputation, either way."""
    changes = of_kind(d, ChangeKind.REMAT, program_changed=True)
    return NamedChange(NAME, True, changes, command=ctx.command(d.cell)) if changes else None


SPEC = named_spec(NAME, remat, (ChangeKind.REMAT,), "rematerialization removed or added, or its policy changed")
