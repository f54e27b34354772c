"""``host_transfer``: host callbacks, infeed / outfeed, send / recv to the host added (removed: an improvement)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hlo_audit.findings import NamedChange
from hlo_audit.hlo.changes import Action, ChangeKind
from hlo_audit.rules.spec import Context, named_spec, of_kind

if TYPE_CHECKING:
    from hlo_audit.comparison import CellDelta

NAME = "host_transfer"


def host_transfer(d: CellDelta, ctx: Context) -> NamedChange | None:
    """Host round trips added per step (removed: an improvement)."""
    changes = of_kind(d, ChangeKind.HOST_TRANSFER)
    if not changes:
        return None
    return NamedChange(NAME, any(c.action is Action.ADDED for c in changes), changes, command=ctx.command(d.cell))


SPEC = named_spec(NAME, host_transfer, (ChangeKind.HOST_TRANSFER,), "host callbacks, infeed / outfeed added")
