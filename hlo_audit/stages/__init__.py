"""The stages a cell's program is taken to, in pipeline order, one module each.

``lowered``: jax's module before XLA (what every platform gives, cross-lowered from the host);
``optimized``: after XLA's optimization passes and buffer assignment, without codegen;
``compiled``: after the whole compile, codegen included.

Each stage module has ``run(lowered, cell) -> Lowering``. ``to_stage`` is the one dispatch: a target lowers,
then hands jax's ``Lowered`` here. Adding a stage is one module and one entry in ``STAGES``; which platforms
support it is theirs to say (``HostPlatform.stage_problem``).
"""

from __future__ import annotations

import importlib
from dataclasses import replace
from typing import TYPE_CHECKING

from hlo_audit.attribution import arg_leaves, call_leaves, name_parameters
from hlo_audit.lowering import Lowering

if TYPE_CHECKING:
    from hlo_audit.hlo.constants import CapturedArray
    from hlo_audit.matrix import Cell

STAGES = ("lowered", "optimized", "compiled")


def to_stage(lowered, cell: Cell, captured: tuple[CapturedArray, ...] | None = None, note: str = "",
             mesh_sizes: dict[str, int | None] | None = None) -> Lowering:
    """A jax ``Lowered`` taken to the cell's stage, with what the target knows besides (captured arrays, a note, the
    sizes its config gives the target mesh: ``Lowering.mesh_sizes``)."""
    # By name: a stage's module imports jax (and XLA's bindings) only once a cell asks for that stage.
    stage = importlib.import_module(f"{__name__}.{cell.stage}")
    result = stage.run(lowered, cell)
    # What each kept argument is (its argument's name, its type), wherever the stage vouches for the key order.
    leaves = arg_leaves(lowered) if result.arg_keys is not None else None
    # The paths args_info knows, written into the text where its names do not say them (an nnx.jit step's),
    # so what is stored and printed (goldens, `lower`) reads as `check` does.
    text = name_parameters(result.text, result.arg_keys, leaves)
    return replace(result, text=text, stage=cell.stage, captured=captured, note=note, arg_leaves=leaves,
                   call_leaves=call_leaves(lowered), mesh_sizes=mesh_sizes)
