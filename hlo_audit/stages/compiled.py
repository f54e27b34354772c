"""Stage ``compiled``: what only a compiled module knows: its text after XLA's optimizations, its memory, its cost.

``run`` compiles a jax ``Lowered`` (for the devices it was lowered for: a TPU topology's or a named GPU's
compile-only devices work on a CPU host) and keeps:

* the after-optimizations module text (SPMD-partitioned: entry parameters hold one device's shard): the
  executable's, or, where the stage keeps dump files, the dump's print of it, the module those files name (on a
  GPU the executable's copy predates XLA's renaming of fusions, which the thunk metadata's names follow:
  ``input_multiply_reduce_fusion`` there is ``fusion`` in the executable's);
* jax's argument paths, but only once they are checked against the compiled module: XLA's own entry
  parameter shapes (dtype and per-device dims) and shardings must be, in order, those jax's ``args_info``
  and input shardings give the kept arguments (``program.checked_arg_keys``);
* ``memory``: ``compiled.memory_analysis()``, bytes by ``MEMORY_KINDS`` (per device);
* ``cost``: ``compiled.cost_analysis()``: flops, transcendentals and bytes accessed; where the backend has none
  (a GPU executable), XLA's generic ``HloCostAnalysis`` of the compiled module (``program.generic_cost``);
* ``key_hazards``: the literal and reused keys of jax's module before XLA's passes (``program.keys_before_xla``:
  the compiled text inlines and fuses jax.random's calls, so shows no draw);
* ``dump``: the files of XLA's dump the cell's platform says codegen writes besides the module
  (``HostPlatform.dump_files``): a GPU's thunk sequence and its metadata, what one step launches
  (``hlo/thunks.py``, ``hlo/launches.py``). Only then is the compile dumped, to a temporary folder, through the
  compile's own options; ``$HLO_AUDIT_KEEP_DUMP`` keeps a copy.
"""

from __future__ import annotations

import tempfile
from typing import TYPE_CHECKING

import jax

from hlo_audit import platforms
from hlo_audit.attribution import arg_keys
from hlo_audit.lowering import MEMORY_KINDS, Lowering
from hlo_audit.stages.lowered import literal_digests
from hlo_audit.stages.program import (
    Signature,
    checked_arg_keys,
    cost_record,
    dump_options,
    dumped,
    generic_cost,
    keep_dump,
    keys_before_xla,
    parameter_shapes,
    shard_signature,
)

if TYPE_CHECKING:
    from hlo_audit.matrix import Cell


class CompileDumpError(RuntimeError):
    """XLA's dump of the compile lacks a file the cell's platform says it writes; names the file."""


def run(lowered: jax.stages.Lowered, cell: Cell | None = None) -> Lowering:
    files = platforms.of(cell).dump_files(cell) if cell is not None else None
    if files is None or not files.kept:
        compiled = lowered.compile()
        text, dump = compiled.as_text(), None
    else:
        with tempfile.TemporaryDirectory(prefix="hlo-audit-compiled-") as folder:
            compiled = lowered.compile(compiler_options=dump_options(folder))
            text, *kept = (_dumped_text(folder, suffix) for suffix in (files.module, *files.kept.values()))
            dump = dict(zip(files.kept, kept))
            keep_dump(folder, cell)
    keys = checked_arg_keys(arg_keys(lowered), kept_argument_signatures(compiled),
                            compiled_parameter_signatures(compiled))
    # Constants the text elides get their literals' digests where the text is the executable's own module (a text
    # read from XLA's dump names its instructions otherwise: a GPU's, whose thunk metadata needs the dump's names).
    modules = compiled.runtime_executable().hlo_modules()
    digests = literal_digests(modules[0], text) if dump is None and len(modules) == 1 else ()
    return Lowering(text=text, arg_keys=keys, memory=memory_record(compiled), cost=_cost(compiled), dump=dump,
                    literal_digests=digests, key_hazards=keys_before_xla(lowered))


def _dumped_text(folder: str, suffix: str) -> str:
    path = dumped(folder, suffix)
    if path is None:
        raise CompileDumpError(f"XLA's dump of the compile holds no *{suffix} (a compile cache answered, or this XLA "
                               "names its dump files otherwise)")
    return path.read_text()


def memory_record(compiled: jax.stages.Compiled) -> dict[str, int] | None:
    stats = compiled.memory_analysis()
    if stats is None:  # a backend without the analysis
        return None
    return {kind.key: int(getattr(stats, kind.xla_stat)) for kind in MEMORY_KINDS}


def _cost(compiled: jax.stages.Compiled) -> dict[str, float] | None:
    cost = compiled.cost_analysis()
    if isinstance(cost, list):  # older jax: one dict per device program, all alike under SPMD
        cost = cost[0] if cost else None
    if cost:
        return cost_record(cost)
    modules = compiled.runtime_executable().hlo_modules()
    return generic_cost(modules[0]) if len(modules) == 1 else None


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
    return [(*shape, None if op is None else str(hlo.HloSharding.from_proto(op)))
            for shape, op in zip(shapes, shardings)]
