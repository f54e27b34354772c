"""Stage ``compiled``: what only a compiled module knows: its text after XLA's optimizations, its memory, its cost.

``run`` compiles a jax ``Lowered`` (for the devices it was lowered for: a TPU topology's compile-only devices
work on a CPU host) and keeps:

* the after-optimizations module text (SPMD-partitioned: entry parameters hold one device's shard);
* jax's argument paths, but only once they are checked against the compiled module: XLA's own entry
  parameter shapes (dtype and per-device dims) and shardings must be, in order, those jax's ``args_info``
  and input shardings give the kept arguments (``program.checked_arg_keys``);
* ``memory``: ``compiled.memory_analysis()``, bytes by ``MEMORY_KINDS``;
* ``cost``: ``compiled.cost_analysis()``: flops, transcendentals and bytes accessed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax

from hlo_audit.attribution import arg_keys
from hlo_audit.lowering import MEMORY_KINDS, Lowering
from hlo_audit.stages.lowered import literal_digests
from hlo_audit.stages.program import Signature, checked_arg_keys, cost_record, parameter_shapes, shard_signature

if TYPE_CHECKING:
    from hlo_audit.matrix import Cell


def run(lowered: jax.stages.Lowered, cell: Cell | None = None) -> Lowering:
    compiled = lowered.compile()
    keys = checked_arg_keys(arg_keys(lowered), kept_argument_signatures(compiled),
                            compiled_parameter_signatures(compiled))
    modules, text = compiled.runtime_executable().hlo_modules(), compiled.as_text()
    digests = literal_digests(modules[0], text) if len(modules) == 1 else ()
    return Lowering(text=text, arg_keys=keys, memory=memory_record(compiled), cost=_cost(compiled),
                    literal_digests=digests)


def memory_record(compiled: jax.stages.Compiled) -> dict[str, int] | None:
    stats = compiled.memory_analysis()
    if stats is None:  # a backend without the analysis
        return None
    return {kind.key: int(getattr(stats, kind.xla_stat)) for kind in MEMORY_KINDS}


def _cost(compiled: jax.stages.Compiled) -> dict[str, float] | None:
    cost = compiled.cost_analysis()
    if isinstance(cost, list):  # older jax: one dict per device program, all alike under SPMD
        cost = cost[0] if cost else None
    return cost_record(cost)


def kept_argument_signatures(compiled: jax.stages.Compiled) -> list[Signature] | None:
    """Each argument jax kept, in jax's order, with the sharding the executable settled on."""
    try:
        kept = sorted(compiled._executable._kept_var_idx)  # noqa: SLF001 (no public view of pruned arguments)
    except AttributeError:
        return None
    avals = jax.tree_util.tree_leaves(compiled.in_avals)
    shardings = jax.tree_util.tree_leaves(compiled.input_shardings, is_leaf=lambda s: s is None)
    if len(avals) != len(shardings):
        return None
    from jax._src import core  # noqa: PLC0415 (PRNG keys' physical shape: key<fry>[] is uint32[2] in HLO)

    signatures = []
    for index in kept:
        aval, sharding = core.physical_aval(avals[index]), shardings[index]
        if sharding is None:
            return None
        signatures.append((*shard_signature(aval, sharding), str(sharding._to_xla_hlo_sharding(aval.ndim))))  # noqa: SLF001
    return signatures


def compiled_parameter_signatures(compiled: jax.stages.Compiled) -> list[Signature] | None:
    """Each entry parameter as XLA's compiled module declares it."""
    from jax._src.lib import hlo  # noqa: PLC0415 (the program shape has no public jax view)

    executable = compiled.runtime_executable()
    modules = executable.hlo_modules()
    if len(modules) != 1:
        return None
    shapes = parameter_shapes(modules[0])
    shardings = executable.get_parameter_shardings()
    if shardings is None:  # not SPMD-partitioned (one device): XLA declares no shardings
        shardings = [None] * len(shapes)
    if len(shardings) != len(shapes):
        return None
    return [(*shape, None if op is None else str(hlo.HloSharding.from_proto(op))) for shape, op in zip(shapes, shardings)]
