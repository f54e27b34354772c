"""What XLA says of a program it optimized or compiled: its entry parameters, checked against jax's argument
order, and its cost in the record's terms. Shared by stages optimized and compiled.

jax does not promise that XLA's entry parameters are, in order, the arguments it kept: a module whose
parameters disagree with them is attributed from its text (the ``op_name`` metadata XLA keeps) instead of from
jax's argument paths.
"""

from __future__ import annotations

from collections.abc import Sequence

# One entry parameter as (dtype, per-device dims, sharding): dims or sharding None where that side does not
# know it (jax left the sharding to XLA's propagation; a single-device executable declares none).
Signature = tuple[str, tuple[int, ...] | None, str | None]

# cost_analysis() key -> the record's key: the totals that do not depend on the machine that compiled (the
# per-operand and ``utilization`` entries and the TPU's ``optimal_seconds`` estimate are left out).
COST_FIELDS = {"flops": "flops", "transcendentals": "transcendentals", "bytes accessed": "bytes_accessed"}


def cost_record(cost: dict | None) -> dict[str, float] | None:
    """The record's cost fields of an XLA cost analysis (``None`` when XLA gave none)."""
    if not cost:
        return None
    return {key: float(cost[name]) for name, key in COST_FIELDS.items() if name in cost}


def checked_arg_keys(keys, expected: Sequence[Signature] | None, actual: Sequence[Signature] | None):
    """``keys`` (jax's argument paths of the kept arguments) if XLA's entry parameters ``actual`` are, in order,
    the kept arguments ``expected``; None otherwise. A field one side does not know is not compared."""
    if keys is None or expected is None or actual is None or not len(keys) == len(expected) == len(actual):
        return None
    for want, got in zip(expected, actual):
        if any(w is not None and g is not None and w != g for w, g in zip(want, got)):
            return None
    return keys


def shard_signature(aval, sharding) -> tuple[str, tuple[int, ...] | None]:
    """(dtype, per-device dims) of one argument as its entry parameter has it (dims None where XLA chooses the
    sharding); ``aval`` is physical (a PRNG key's uint32 data)."""
    dims = tuple(sharding.shard_shape(aval.shape)) if hasattr(sharding, "shard_shape") else None
    return str(aval.dtype), dims


def lowered_argument_signatures(lowered) -> list[Signature] | None:
    """Each argument jax kept, from the lowering's own arguments and input shardings (no sharding: those XLA
    may still choose)."""
    from jax._src import core  # noqa: PLC0415 (PRNG keys' physical shape: key<fry>[] is uint32[2] in HLO)

    try:
        args = lowered._lowering.compile_args  # noqa: SLF001 (no public view of the kept arguments)
        kept, avals, shardings = sorted(args["kept_var_idx"]), args["global_in_avals"], args["in_shardings"]
    except (AttributeError, KeyError, TypeError):
        return None
    if len(avals) != len(shardings):
        return None
    signatures = [(*shard_signature(core.physical_aval(aval), sharding), None)
                  for aval, sharding in zip(avals, shardings)]
    return signatures if len(signatures) == len(kept) else [signatures[i] for i in kept]


def parameter_shapes(module) -> list[tuple[str, tuple[int, ...]]]:
    """(dtype, dims) of each entry parameter of an XLA ``HloModule``, from its program shape."""
    from jax._src.lib import hlo  # noqa: PLC0415 (the program shape has no public jax view)

    program = hlo.XlaComputation(module.as_serialized_hlo_module_proto()).program_shape()
    return [(str(shape.numpy_dtype()), tuple(shape.dimensions())) for shape in program.parameter_shapes()]
