"""What XLA says of a program it optimized or compiled: its entry parameters, checked against jax's argument
order, and its cost in the record's terms. Shared by stages optimized and compiled.

jax does not promise that XLA's entry parameters are, in order, the arguments it kept: a module whose
parameters disagree with them is attributed from its text (the ``op_name`` metadata XLA keeps) instead of from
jax's argument paths.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hlo_audit.hlo.rng_keys import PlacedHazard

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


def generic_cost(module) -> dict[str, float] | None:
    """XLA's device-independent ``HloCostAnalysis`` of an ``HloModule``, computed by the CPU client.

    For a module whose backend gives no cost analysis of its own: a GPU executable's ``cost_analysis()`` is None
    (the compile-only CUDA client cannot run one), and stage optimized has no executable at all. Its flops and
    transcendentals equal a backend's own; its bytes accessed follow the generic model. None when this process has
    no CPU client (jax started without its CPU backend)."""
    import jax  # noqa: PLC0415
    from jax._src.lib import _jax  # noqa: PLC0415 (XLA's cost analysis of a module; no public jax view)

    try:
        client = jax.devices("cpu")[0].client
    except RuntimeError:
        return None
    return cost_record(_jax.hlo_module_cost_analysis(client, module))


def keys_before_xla(lowered) -> tuple[PlacedHazard, ...]:
    """The literal and reused keys of jax's module before XLA's passes, placed (``hlo.rng_keys``): what a stage whose
    text is XLA's keeps beside it. XLA inlines jax.random's calls and fuses them (on the CPU, threefry's rounds are a
    while loop among the model's fusions, a literal key's halves constants folded into it), so its text shows no draw,
    while the program's keys are the module's XLA was handed: its passes keep what the program computes, which key
    each draw reads included. Read from the module as stage lowered prints it, with its arguments' paths and the
    places its metadata gives each draw."""
    from hlo_audit.attribution import arg_keys, arg_leaves  # noqa: PLC0415 (jax's stages; the stage has it loaded)
    from hlo_audit.hlo.analysis import analyze  # noqa: PLC0415
    from hlo_audit.hlo.rng_keys import placed  # noqa: PLC0415
    from hlo_audit.stages.lowered import hlo_text, instruction_metadata  # noqa: PLC0415

    module = lowered.compiler_ir(dialect="hlo").as_hlo_module()
    analysis = analyze(hlo_text(lowered, module), "before XLA", arg_keys(lowered), None, arg_leaves(lowered))
    if not analysis.keys.hazards:
        return ()
    return placed(analysis.keys, analysis.module, analysis.params, instruction_metadata(module).places())


# --------------------------------------------------------------------------------------------------------------
# XLA's dump, as the stages read it
# --------------------------------------------------------------------------------------------------------------

# Where a user asks for each compiled or optimized cell's XLA dump to be kept (a folder per cell under it).
KEEP_DUMP_ENV = "HLO_AUDIT_KEEP_DUMP"


def dump_options(folder) -> dict[str, object]:
    """The compile options that dump a module to ``folder``. The dump is a stage's input, so its form is fixed here
    whatever XLA_FLAGS says: text, every module, XLA's long form with metadata (its defaults), large constants as
    ``{...}`` (as every stage prints them)."""
    return {"xla_dump_to": str(folder), "xla_dump_hlo_as_text": True, "xla_dump_hlo_as_long_text": True,
            "xla_dump_hlo_module_re": ".*", "xla_dump_large_constants": False, "xla_dump_disable_metadata": False}


def dumped(folder, suffix: str):
    """The one file of the compiled module in a dump folder whose name ends with ``suffix``; None if there is none.

    One compile dumps one module; should jax have compiled a helper into the same folder, the largest is the step."""
    from pathlib import Path  # noqa: PLC0415

    folder = Path(folder)
    files = sorted(p for p in folder.iterdir() if p.name.endswith(suffix)) if folder.is_dir() else []
    return max(files, key=lambda p: p.stat().st_size) if files else None


def keep_dump(folder, cell) -> None:
    """Copy a cell's dump to ``$HLO_AUDIT_KEEP_DUMP/<cell id, '/' as '+'>`` when that variable names a folder (a cell
    answered from the cache compiles nothing, so keeps nothing)."""
    import os  # noqa: PLC0415
    import shutil  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    root = os.environ.get(KEEP_DUMP_ENV)
    if root and cell is not None:
        shutil.copytree(folder, Path(root) / cell.id.replace("/", "+"), dirs_exist_ok=True)
