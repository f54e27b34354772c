"""``host_transfer``: host callbacks, infeed / outfeed, send / recv to the host added (removed: an improvement)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hlo_audit.findings import NamedChange
from hlo_audit.hlo.changes import Action, Change, ChangeKind
from hlo_audit.rules.spec import Context, KindWords, named_spec, of_kind
from hlo_audit.rules.wording import counted, in_computation

if TYPE_CHECKING:
    from hlo_audit.comparison import CellDelta

NAME = "host_transfer"


def host_transfer(d: CellDelta, ctx: Context) -> NamedChange | None:
    """Host round trips added per step (removed: an improvement)."""
    changes = of_kind(d, ChangeKind.HOST_TRANSFER)
    if not changes:
        return None
    return NamedChange(NAME, any(c.action is Action.ADDED for c in changes), changes, command=ctx.command(d.cell))


def _line(c: Change, kind: str, where: str) -> str:
    verb = "added" if c.action is Action.ADDED else "removed"
    return f"{kind} {verb}: {c.subject}{' x' + str(c.count) if c.count > 1 else ''} {in_computation(c, where)}, " \
           f"{counted(c.per_step, 'run')} per step"


SPEC = named_spec(NAME, host_transfer, (KindWords(ChangeKind.HOST_TRANSFER, "host transfer", _line),),
                  "host callbacks, infeed / outfeed added")
