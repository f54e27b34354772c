"""``routing``: the step selects by another op (an MoE router's experts by ``argmax`` now ``top_k`` with k=2, a
sampler's ``sort``): which values flow on changes, a change to judge either way (``hlo.change_terms.routing``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hlo_audit.findings import NamedChange
from hlo_audit.hlo.changes import ChangeKind
from hlo_audit.rules.spec import Context, named_spec, of_kind

if TYPE_CHECKING:
    from hlo_audit.compare import CellDelta

NAME = "routing"


def routing(d: CellDelta, ctx: Context) -> NamedChange | None:
    """A selection by another op (top-1 against top-2, argmax against a sort): what each token reaches changes."""
    changes = of_kind(d, ChangeKind.ROUTING, program_changed=True)
    return NamedChange(NAME, True, changes, command=ctx.command(d.cell)) if changes else None


SPEC = named_spec(NAME, routing, (ChangeKind.ROUTING,), "a selection by another op (argmax, top_k of another k, sort)")
