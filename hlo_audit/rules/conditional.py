"""``conditional``: a ``conditional`` removed or added with its branches' sizes, replaced by computing both branches
and selecting (``jnp.where``): a change to judge, either way."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hlo_audit.findings import NamedChange
from hlo_audit.hlo.changes import ChangeKind
from hlo_audit.rules.spec import Context, named_spec, of_kind

if TYPE_CHECKING:
    from hlo_audit.compare import CellDelta

NAME = "conditional"


def conditional(d: CellDelta, ctx: Context) -> NamedChange | None:
    """A conditional removed or added (``lax.cond`` against ``jnp.where`` of both branches): the step now always
    computes (or skips) a branch's work, a change to judge either way."""
    changes = of_kind(d, ChangeKind.CONDITIONAL, program_changed=True)
    return NamedChange(NAME, True, changes, command=ctx.command(d.cell)) if changes else None


SPEC = named_spec(NAME, conditional, (ChangeKind.CONDITIONAL,), "a lax.cond removed or added (both branches computed)")
