"""Stages compiled and optimized for a named GPU, deviceless (hlo_audit/stages/, the CUDA platform's dump files), on
small real jax programs: the same stage modules as a TPU topology's, with the platform saying what differs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from cuda_probe import needs_cuda
from hlo_audit import platforms
from hlo_audit.hlo.analysis import analyze
from hlo_audit.hlo.launch_model import step_launches
from hlo_audit.matrix import Cell
from hlo_audit.platforms.cuda import device_name
from hlo_audit.stages import compiled as compiled_stage
from hlo_audit.stages import optimized as optimized_stage
from hlo_audit.stages import to_stage

pytestmark = needs_cuda


def cell(topology: str, stage: str) -> Cell:
    return Cell("step", False, "none", 1, target="tests:unused", platform="cuda", device=device_name("h100", topology),
                stage=stage)


def step(params, batch, unused):
    """A pytree of arguments, one jit prunes (``unused``), a matmul, a reduction, an update."""
    h = jnp.tanh(batch["x"] @ params["w"])
    loss = (h * h).sum()
    return {"w": params["w"] - 0.1 * loss, "count": params["count"] + 1}, loss


def lowered_step(topology: str):
    mesh = Mesh(np.array(platforms.devices(cell(topology, "compiled"))), ("x",))
    rows = NamedSharding(mesh, P("x"))
    whole = NamedSharding(mesh, P())
    params = {"w": jax.ShapeDtypeStruct((512, 512), jnp.float32, sharding=whole),
              "count": jax.ShapeDtypeStruct((), jnp.uint32, sharding=whole)}
    batch = {"x": jax.ShapeDtypeStruct((256, 512), jnp.float32, sharding=rows)}
    unused = jax.ShapeDtypeStruct((3,), jnp.float32, sharding=whole)
    return jax.jit(step, donate_argnums=0).lower(params, batch, unused)


def launches(lowering):
    analysis = analyze(lowering.text, "<stage>", lowering.arg_keys)
    return step_launches(analysis.module, analysis.params, lowering.dump), analysis


@pytest.mark.parametrize("topology", ["1x1x1", "1x1x8"])
def test_the_optimized_stage_stops_at_the_compiled_stage_s_module(topology):
    lowered = lowered_step(topology)
    compiled = to_stage(lowered, cell(topology, "compiled"))
    optimized = to_stage(lowered, cell(topology, "optimized"))
    assert (compiled.stage, optimized.stage) == ("compiled", "optimized")
    assert optimized.text == compiled.text  # both the module XLA dumped after its optimizations
    assert set(compiled.dump) == {"thunk_sequence", "thunk_metadata"} and optimized.dump == {}
    assert optimized.arg_keys == compiled.arg_keys == (("count",), ("w",), ("x",))  # `unused` pruned by jit
    memory = {k: v for k, v in compiled.memory.items() if k != "generated_code_bytes"}
    assert optimized.memory == memory and memory["argument_bytes"] > 0
    # A GPU executable has no cost analysis of its own: both stages report XLA's generic one of the same module.
    assert optimized.cost == compiled.cost and compiled.cost["flops"] > 0
    from_thunks, analysis = launches(compiled)
    devices = int(topology.split("x")[-1])
    assert analysis.params[2].shape.dims == (256 // devices, 512)  # one GPU's shard of the batch
    # What the optimized stage counts from the scheduled module is what the compiled one's thunks launch.
    from_module, _ = launches(optimized)
    assert from_module.from_module and not from_thunks.from_module and from_thunks.attributed
    assert (from_module.total, from_module.by_kind, from_module.scalar) == (
        from_thunks.total, from_thunks.by_kind, from_thunks.scalar)
    # The one scalar kernel is the counter's increment, and it reads the counter.
    [increment] = [launch for launch in from_thunks.launches if launch.is_scalar]
    assert [from_thunks.param_by_number()[i].path for i in increment.reads] == ["params.count"]


def test_a_tpu_style_compile_keeps_no_dump():
    """A platform that keeps no dump files compiles as before, without XLA's dump (the CPU host's own devices)."""
    x = jax.ShapeDtypeStruct((8, 8), jnp.float32)
    lowering = compiled_stage.run(jax.jit(lambda a: a @ a).lower(x), Cell("f", True, "none", 1, stage="compiled"))
    assert lowering.dump is None and lowering.cost["flops"] > 0
    assert step_launches(analyze(lowering.text).module, [], lowering.dump) is None


@custom_partitioning
def doubled(x):
    return x * 2


def _partition(mesh, arg_shapes, result_shape):
    return mesh, lambda x: x * 2, result_shape.sharding, (arg_shapes[0].sharding,)


doubled.def_partition(partition=_partition, infer_sharding_from_operands=lambda mesh, args, result: args[0].sharding,
                      sharding_rule="i j -> i j")


def test_custom_partitioning_is_compiled_not_optimized():
    """Transformer Engine's ops partition through custom_partitioning callbacks that XLA calls back into the
    lowering process for: the child of stage optimized cannot, so it refuses, saying why; compiled compiles."""
    mesh = Mesh(np.array(platforms.devices(cell("1x1x8", "optimized"))), ("x",))
    x = jax.ShapeDtypeStruct((64, 64), jnp.float32, sharding=NamedSharding(mesh, P("x")))
    lowered = jax.jit(doubled).lower(x)
    with pytest.raises(optimized_stage.OptimizeError, match="custom_partitioning callbacks .* use stage compiled"):
        optimized_stage.run(lowered, cell("1x1x8", "optimized"))
    compiled = compiled_stage.run(lowered, cell("1x1x8", "compiled"))
    assert compiled.memory["argument_bytes"] == 8 * 64 * 4
