"""What only a compiled module knows: its text after XLA's optimizations, its memory, its cost.

``compile_lowering`` compiles a jax ``Lowered`` (for the devices it was lowered for: a TPU topology's
compile-only devices work on a CPU host) and keeps:

* the after-optimizations module text (SPMD-partitioned: entry parameters hold one device's shard);
* jax's argument paths, but only once they are checked against the compiled module: XLA's own entry
  parameter shapes (dtype and per-device dims) and shardings must be, in order, those jax's ``args_info``
  and input shardings give the kept arguments. jax does not promise the compiled parameter order, so an
  executable that disagrees is attributed from its text (the ``op_name`` metadata XLA keeps) instead;
* ``memory``: ``compiled.memory_analysis()`` (argument, output, alias, temp and generated-code bytes);
* ``cost``: ``compiled.cost_analysis()``: flops, transcendentals and bytes accessed, the totals that do not
  depend on the machine that compiled (its per-operand and ``utilization`` entries and the TPU's
  ``optimal_seconds`` estimate are left out).
"""

from __future__ import annotations

import jax

from hlo_audit.attribution import arg_keys
from hlo_audit.targets.base import Lowering

# CompiledMemoryStats attribute -> the record's key.
MEMORY_FIELDS = {
    "argument_size_in_bytes": "argument_bytes",
    "output_size_in_bytes": "output_bytes",
    "alias_size_in_bytes": "alias_bytes",
    "temp_size_in_bytes": "temp_bytes",
    "generated_code_size_in_bytes": "generated_code_bytes",
}
# cost_analysis() key -> the record's key.
COST_FIELDS = {"flops": "flops", "transcendentals": "transcendentals", "bytes accessed": "bytes_accessed"}


def compile_lowering(lowered: jax.stages.Lowered) -> Lowering:
    compiled = lowered.compile()
    return Lowering(text=compiled.as_text(), arg_keys=checked_arg_keys(lowered, compiled),
                    memory=memory_record(compiled), cost=cost_record(compiled))


def memory_record(compiled: jax.stages.Compiled) -> dict[str, int] | None:
    stats = compiled.memory_analysis()
    if stats is None:  # a backend without the analysis
        return None
    return {key: int(getattr(stats, attribute)) for attribute, key in MEMORY_FIELDS.items()}


def cost_record(compiled: jax.stages.Compiled) -> dict[str, float] | None:
    cost = compiled.cost_analysis()
    if isinstance(cost, list):  # older jax: one dict per device program, all alike under SPMD
        cost = cost[0] if cost else None
    if not cost:
        return None
    return {key: float(cost[name]) for name, key in COST_FIELDS.items() if name in cost}


def checked_arg_keys(lowered: jax.stages.Lowered, compiled: jax.stages.Compiled):
    """The lowering's argument keys, if the compiled entry parameters are, in order, the arguments jax kept."""
    keys = arg_keys(lowered)
    if keys is None:
        return None
    expected = kept_argument_signatures(compiled)
    actual = compiled_parameter_signatures(compiled)
    if expected is None or actual is None or not len(keys) == len(expected) == len(actual):
        return None
    for want, got in zip(expected, actual):
        if got[2] is None:  # a single-device executable declares no parameter shardings: shapes only
            want = (*want[:2], None)
        if want != got:
            return None
    return keys


def kept_argument_signatures(compiled: jax.stages.Compiled) -> list[tuple] | None:
    """(dtype, per-device dims, sharding) of each argument jax kept, in jax's order, from args_info."""
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


def shard_signature(aval, sharding) -> tuple[str, tuple[int, ...] | None]:
    """(dtype, per-device dims) of one argument as its entry parameter has it (dims None where XLA chooses the
    sharding); ``aval`` is physical (a PRNG key's uint32 data)."""
    dims = tuple(sharding.shard_shape(aval.shape)) if hasattr(sharding, "shard_shape") else None
    return str(aval.dtype), dims


def compiled_parameter_signatures(compiled: jax.stages.Compiled) -> list[tuple] | None:
    """(dtype, dims, sharding or None) of each entry parameter as XLA's compiled module declares them."""
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


def parameter_shapes(module) -> list[tuple[str, tuple[int, ...]]]:
    """(dtype, dims) of each entry parameter of an XLA ``HloModule``, from its program shape."""
    from jax._src.lib import hlo  # noqa: PLC0415 (the program shape has no public jax view)

    program = hlo.XlaComputation(module.as_serialized_hlo_module_proto()).program_shape()
    return [(str(shape.numpy_dtype()), tuple(shape.dimensions())) for shape in program.parameter_shapes()]
