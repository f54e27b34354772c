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

import re
from typing import TYPE_CHECKING

from hlo_audit.findings import EnvironmentChange, NamedChange
from hlo_audit.hlo.changes import MESH, NO_SPLIT_CHANGE, Action, Change, ChangeKind
from hlo_audit.rules.spec import Context, KindWords, named_spec, of_kind
from hlo_audit.rules.wording import VERBS, counted, groups_text, in_computation, paths_text, per_layer

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


def _sharding_line(c: Change, kind: str, where: str) -> str:
    if c.subject in (NO_SPLIT_CHANGE, MESH):
        return _mesh_line(c, kind, where)
    if c.subject == "sharding constraint" and c.action is not Action.CHANGED:
        verb = "added" if c.action is Action.ADDED else "removed"
        return f"{kind}: {counted(c.count, c.subject)} {verb} ({c.after or c.before}); {where}".rstrip("; ")
    what = c.subject.removesuffix(" (per-device shape)")
    text = f"{kind}: {counted(c.count, what.removesuffix('s'), what) if what.endswith('s') else c.count} "
    if c.subject.endswith("(per-device shape)"):
        text += (f"per-device shape {c.before} -> {c.after} where their collectives changed (sharded otherwise "
                 "across the devices)")
    else:
        text += f"{c.before} -> {c.after}"
    if c.splits:  # the arrays split differently on the target mesh, by how much
        text += f", split differently: {'; '.join(c.splits)}"
    if c.groups and c.subject == "parameters":
        return f"{text}" if c.splits else f"{text}: {groups_text(c.groups)}"
    return f"{text}; {where}".rstrip("; ")


def _mesh_line(c: Change, kind: str, where: str) -> str:
    """``sharding: no effect on how any array is split: mesh axis "context"=1 added (mesh [...] -> [...], 2
    shardings changed); at mesh.yml:3``: the shardings that changed without splitting anything differently and the
    mesh with them, one line; or the mesh's change beside shardings whose split changed (on lines of their own)."""
    axes = "; ".join(a for a, _ in c.groups)
    # The axes' changes say what changed; of the mesh, how many axes and those that split anything (size not 1).
    mesh = f"mesh of {_mesh_summary(c.before)} -> {_mesh_summary(c.after)}" if c.before != c.after else ""
    if c.subject == MESH:
        text = f"{kind}: {mesh}" + (f" ({axes})" if axes else "")
        return text + (f"; {counted(c.count, 'other sharding')} split as before" if c.count else "")
    text = f"{kind}: {NO_SPLIT_CHANGE}" + (f": {axes}" if axes else "")
    said = [part for part in (mesh, counted(c.count, "sharding") + " changed" if c.count else "") if part]
    text += f" ({', '.join(said)})" if said else ""
    return f"{text}; {where}".rstrip("; ")


def _mesh_summary(mesh: str) -> str:
    """``12 axes, all of size 1 but "fsdp"=?``: a mesh as ``hlo.mesh.mesh_text`` prints it, in short."""
    axes = re.findall(r'"[^"]+"=[\d?]+', mesh)
    if not axes:
        return mesh
    cutting = [a for a in axes if not a.endswith("=1")]
    if not cutting:
        return f"{counted(len(axes), 'axis', 'axes')}, all of size 1"
    if len(cutting) == len(axes):
        return f"{counted(len(axes), 'axis', 'axes')}: {', '.join(axes)}"
    return f"{counted(len(axes), 'axis', 'axes')}, all of size 1 but {', '.join(cutting)}"


def _collectives_line(c: Change, kind: str, where: str) -> str:
    verb = VERBS[c.action]
    text = f"{kind}: {c.subject} {verb} x{c.count}{per_layer(c)}"
    if c.action is Action.CHANGED:
        text += f": {c.before} now {c.after}"
    text += f", {counted(c.per_step, 'run')} per step moving {c.bytes:,} bytes"
    return f"{text}; {in_computation(c, where)}"


def _shapes_line(c: Change, kind: str, where: str) -> str:
    if c.subject == "inputs":
        text = f"{kind}: {counted(c.count, 'input')} {', '.join(f for f, _ in c.groups)} ({c.before} -> {c.after}"
        return f"{text}, {c.bytes:+,} bytes): {paths_text(c.place.paths)}"
    factors = ", ".join(f"{f} on {n:,}" for f, n in c.groups)
    device = " per device (their shape or their sharding)" if c.subject.endswith("(per device)") else ""
    return f"{kind}: {counted(c.count, 'value')}{per_layer(c)} reshaped{device}, {factors} (most: {c.before} -> " \
           f"{c.after}); {where}".rstrip("; ")


def _ops_line(c: Change, kind: str, where: str) -> str:
    mix = ", ".join(f"{op} {n:+d}" if " -> " not in op and "(" not in op else f"{op} x{n}" for op, n in c.groups[:6])
    more = f" and {len(c.groups) - 6} more" if len(c.groups) > 6 else ""
    work = f", {c.flops:+,} FLOPs per step" if c.flops else ""
    return f"{kind}: {counted(c.count, 'instruction')}{per_layer(c)} at equal shapes: {mix}{more}, " \
           f"{counted(c.per_step, 'run')} per step{work}; {in_computation(c, where)}"


def _constants_line(c: Change, kind: str, where: str) -> str:
    """``constants: f32[] literal 0.001 -> 0.002 at train.py:12 (jit(step)/mul)``: both values, the type, the place."""
    what = f"{c.subject} literal" if c.count == 1 else f"{c.count:,} {c.subject} literals{per_layer(c)}"
    return f"{kind}: {what} {c.before} -> {c.after} {in_computation(c, where)}"


SHARDING = named_spec("sharding", sharding, (KindWords(ChangeKind.SHARDING, "sharding", _sharding_line),),
                      "shardings changed, constraints added or removed")
COLLECTIVES = named_spec("collectives", collectives,
                         (KindWords(ChangeKind.COLLECTIVES, "collectives", _collectives_line),),
                         "collectives added, removed, changed")
SHAPES = named_spec("shapes", shapes, (KindWords(ChangeKind.SHAPES, "shapes", _shapes_line),),
                    "inputs and activations of other dims")
OPS = named_spec("ops", ops, (KindWords(ChangeKind.OPS, "ops", _ops_line),),
                 "ops added, removed or changed at equal shapes")
CONSTANTS = named_spec("constants", constants, (KindWords(ChangeKind.CONSTANTS, "constants", _constants_line),),
                       "literals whose value changed")
