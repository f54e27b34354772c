"""The structural kinds (``hlo.change_structure``), one judge for five rules: ``sharding`` (a parameter's or value's
sharding changed, a sharding constraint added or removed), ``collectives`` (added, removed or changed: a removed one
is a change to judge, not an improvement), ``shapes`` (inputs or activations of other dims), ``ops`` (added, removed
or changed at equal shapes: a mask, a transpose, a reduction) and ``constants`` (literals whose value changed: a
learning rate, a dropout rate, a loss scale, an epsilon; both values with their type and place). Each a regression
whichever way: layouts, metadata, instruction order and fusion names are none of these kinds.

Under another environment than the golden's, ops, constants and the values' shapes are advisory (another jax and XLA
move them in an unchanged step, and lower an op with other constants); shardings, collectives and the inputs'
shapes still gate.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hlo_audit.findings import EnvironmentChange, NamedChange
from hlo_audit.hlo.changes import ChangeKind
from hlo_audit.rules.spec import Context, named_spec, of_kind

if TYPE_CHECKING:
    from hlo_audit.comparison import CellDelta


def _structural(rule: str, kind: ChangeKind, d: CellDelta, ctx: Context,
                moved: tuple[EnvironmentChange, ...] = ()) -> NamedChange | None:
    changes = of_kind(d, kind)
    return NamedChange(rule, True, changes, command=ctx.command(d.cell), environment=moved) if changes else None


def sharding(d: CellDelta, ctx: Context) -> NamedChange | None:
    """Shardings of parameters, values or outputs changed; sharding constraints added or removed."""
    return _structural("sharding", ChangeKind.SHARDING, d, ctx)


def collectives(d: CellDelta, ctx: Context) -> NamedChange | None:
    """Collectives added, removed or changed per step."""
    return _structural("collectives", ChangeKind.COLLECTIVES, d, ctx)


def shapes(d: CellDelta, ctx: Context) -> NamedChange | None:
    """Inputs and activations whose dims changed: advisory where the environment moved since the golden
    (``CellDelta.environment``), unless an input's dims changed (they do not move with jax and XLA, and gate)."""
    moved = d.environment
    if moved and any(c.subject == "inputs" for c in of_kind(d, ChangeKind.SHAPES)):
        moved = ()
    return _structural("shapes", ChangeKind.SHAPES, d, ctx, moved)


def ops(d: CellDelta, ctx: Context) -> NamedChange | None:
    """Ops added, removed or changed at equal shapes; advisory where the environment moved (``shapes``)."""
    return _structural("ops", ChangeKind.OPS, d, ctx, d.environment)


def constants(d: CellDelta, ctx: Context) -> NamedChange | None:
    """Literals whose value changed; advisory where the environment moved (``ops``)."""
    return _structural("constants", ChangeKind.CONSTANTS, d, ctx, d.environment)


SHARDING = named_spec("sharding", sharding, (ChangeKind.SHARDING,), "shardings changed, constraints added or removed")
COLLECTIVES = named_spec("collectives", collectives, (ChangeKind.COLLECTIVES,), "collectives added, removed, changed")
SHAPES = named_spec("shapes", shapes, (ChangeKind.SHAPES,), "inputs and activations of other dims")
OPS = named_spec("ops", ops, (ChangeKind.OPS,), "ops added, removed or changed at equal shapes")
CONSTANTS = named_spec("constants", constants, (ChangeKind.CONSTANTS,), "literals whose value changed")
