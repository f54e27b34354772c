"""Any JAX project: ``target = "package.module:function"``.

The function receives the cell (every field it may read is in docs/configuration.md, "What a target reads off
the cell"; ``quant`` is a free variant axis the function gives a meaning) and returns
a ``jax.stages.Traced`` (the tool lowers it for ``cell.platform`` and records the arrays it closes over) or a
``jax.stages.Lowered``, or what ``nnx.jit(f).trace(...)`` / ``.lower(...)`` return (flax's wrappers of those two:
``.traced`` / ``.lowered``; the arguments' real state paths and variable types are read back from their graph,
``hlo_audit.attribution``), or the ``Lowering`` a built-in target returns, for a function that wraps one. It may raise
``hlo_audit.Unavailable("why")`` for cells it cannot build here. It runs with jax's default device set to the
cell's first device (one chip of a TPU topology, for a ``tpu`` cell with a ``topology``), so unsharded code
lowers and compiles for that platform as it is; a function that shards builds its mesh over
``hlo_audit.devices(cell)``. Optional attributes: ``function.full_depth``, a dict model -> layers, or a callable
model -> layers, for ``--layers full`` and scaling projections; ``function.scan`` and ``function.quant``, the
values of those axes it lowers, the defaults of a series that leaves them out (``config.resolve``, at plan time,
where a misspelled function is a config error too).
"""

from __future__ import annotations

import importlib
import sys

import jax

from hlo_audit import host, platforms, wrapped_args
from hlo_audit.capture import captured_arrays
from hlo_audit.files import current_directory
from hlo_audit.lowering import Lowering, TargetError, import_failure
from hlo_audit.matrix import Cell
from hlo_audit.stages import to_stage

# Libraries whose version the exact text of a cell lowered through them depends on (their module, their distribution).
_MODEL_LIBRARIES = (("maxtext", "maxtext"), ("transformer_engine.jax", "transformer-engine-jax"))


class CallableTarget:
    def __init__(self, spec: str):
        self.name = spec
        module_name, sep, attribute = spec.partition(":")
        if not sep or not module_name or not attribute:
            raise TargetError(f"target {spec!r}: expected 'package.module:function'")
        if "" not in sys.path and (here := current_directory()) is not None and str(here) not in sys.path:
            sys.path.insert(0, str(here))  # a project's own module, run from its root
        try:
            self.module = importlib.import_module(module_name)
        except (Exception, SystemExit) as exc:  # noqa: BLE001 (the user's module failing at import: one line)
            raise TargetError(f"target {spec!r}: {import_failure(module_name, exc)}") from None
        function = self.module
        for part in attribute.split("."):
            function = getattr(function, part, None)
        if not callable(function):
            raise TargetError(f"target {spec!r}: {attribute!r} is not a callable in {module_name}")
        self.function = function

    def check_available(self, cell: Cell) -> None:
        """What the platform needs (libtpu for a topology...); the rest only the function knows (lower())."""
        platforms.of(cell).check_available(cell)

    def trace(self, cell: Cell):
        """What the function returns for the cell, as it returns it (flax's ``nnx.jit`` wrapper kept: ``measure``
        calls the function the user calls), traced for this machine's own devices: the step ``measure`` runs."""
        return self.function(cell)

    def lower(self, cell: Cell) -> Lowering:
        with platforms.default_device(cell), wrapped_args.recording():
            produced = self.trace(cell)
            if isinstance(produced, Lowering):  # a function that wraps a built-in target
                return produced
            produced = jax_stage(produced)
            captured = None  # what the function closes over: known from a trace only
            if isinstance(produced, jax.stages.Traced):
                captured = captured_arrays(produced)
                lowered = produced.lower(lowering_platforms=(cell.platform,))
            elif isinstance(produced, jax.stages.Lowered):
                lowered = produced
            else:
                raise TargetError(f"target {self.name!r} returned {type(produced).__name__}, expected a jax Traced "
                                  "(jax.jit(f).trace(...) or nnx.jit(f).trace(...)) or Lowered")
            return to_stage(lowered, cell, captured)

    def full_depth(self, model: str) -> int:
        depth = getattr(self.function, "full_depth", None)
        if isinstance(depth, dict) and model in depth:
            return int(depth[model])
        if callable(depth):
            return int(depth(model))
        raise TargetError(f"target {self.name!r} does not say the full depth of {model!r} "
                          "(give the function a full_depth dict or callable)")

    def versions(self, cell: Cell) -> dict[str, str]:
        """The model libraries the function lowered through, as MaxText's own target names them (a team's function
        that wraps MaxText's step depends on MaxText's version as the built-in target's cells do): read after the
        lowering, in its process, from what it imported."""
        return {distribution: host.installed_version(distribution)
                for module, distribution in _MODEL_LIBRARIES if module in sys.modules}


def jax_stage(produced):
    """jax's own Traced / Lowered inside what ``nnx.jit(f).trace(...)`` / ``.lower(...)`` return (flax keeps it as
    ``.traced`` / ``.lowered``); anything else as it is."""
    for attribute, stage in (("traced", jax.stages.Traced), ("lowered", jax.stages.Lowered)):
        inner = getattr(produced, attribute, None)
        if not isinstance(produced, stage) and isinstance(inner, stage):
            return inner
    return produced
