"""Stages compiled and optimized for CUDA, deviceless (hlo_audit/stages/cuda.py), on small real jax programs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from hlo_audit.stages.cuda import (CudaCompileError, compile_for_cuda, cuda_devices, gpu_target_config,
                                   optimize_for_cuda)


def _cuda_missing() -> str | None:
    try:
        cuda_devices(gpu_target_config("h100"))
    except CudaCompileError as error:
        return str(error)
    return None


pytestmark = pytest.mark.skipif(_cuda_missing() is not None,
                                reason=f"no compile-only CUDA devices: {_cuda_missing()}")


def step(params, batch, unused):
    """A pytree of arguments, one jit prunes (``unused``), a matmul, a reduction, an update."""
    h = jnp.tanh(batch["x"] @ params["w"])
    loss = (h * h).sum()
    return {"w": params["w"] - 0.1 * loss, "count": params["count"] + 1}, loss


def lowered_step(topology: str):
    mesh = Mesh(np.array(cuda_devices(gpu_target_config("h100"), topology)), ("x",))
    rows = NamedSharding(mesh, P("x"))
    whole = NamedSharding(mesh, P())
    params = {"w": jax.ShapeDtypeStruct((512, 512), jnp.float32, sharding=whole),
              "count": jax.ShapeDtypeStruct((), jnp.uint32, sharding=whole)}
    batch = {"x": jax.ShapeDtypeStruct((256, 512), jnp.float32, sharding=rows)}
    unused = jax.ShapeDtypeStruct((3,), jnp.float32, sharding=whole)
    return jax.jit(step, donate_argnums=0).lower(params, batch, unused)


@pytest.mark.parametrize("topology", ["1x1x1", "1x1x8"])
def test_the_optimized_stage_stops_at_the_compiled_stage_s_module(topology):
    lowered = lowered_step(topology)
    compiled = compile_for_cuda(lowered)
    optimized = optimize_for_cuda(lowered, gpu_target_config("h100"), topology)
    assert optimized.module == compiled.module
    assert optimized.thunk_sequence is None and compiled.thunk_sequence
    assert optimized.parameters == compiled.parameters
    assert optimized.arg_keys == compiled.arg_keys == (("count",), ("w",), ("x",))  # `unused` pruned by jit
    memory = {k: v for k, v in compiled.memory.items() if k != "generated_code_bytes"}
    assert optimized.memory == memory and memory["argument_bytes"] > 0
    assert optimized.cost == compiled.cost and compiled.cost["flops"] > 0
    devices = int(topology.split("x")[-1])
    assert compiled.parameters[2] == ("float32", (256 // devices, 512))  # one GPU's shard of the batch
    # What the optimized stage counts from the scheduled module is what the compiled one's thunks launch.
    from_module, from_thunks = optimized.launches(), compiled.launches()
    assert from_module.from_module and not from_thunks.from_module
    assert (from_module.total, from_module.by_kind, from_module.scalar) == (
        from_thunks.total, from_thunks.by_kind, from_thunks.scalar)
    assert optimized.child_peak_rss_bytes > 0 and set(optimized.phases) == {"capture", "setup", "xla"}


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
    mesh = Mesh(np.array(cuda_devices(gpu_target_config("h100"), "1x1x8")), ("x",))
    x = jax.ShapeDtypeStruct((64, 64), jnp.float32, sharding=NamedSharding(mesh, P("x")))
    lowered = jax.jit(doubled).lower(x)
    with pytest.raises(CudaCompileError, match="custom_partitioning callbacks .* use stage compiled"):
        optimize_for_cuda(lowered, gpu_target_config("h100"), "1x1x8")
    compiled = compile_for_cuda(lowered)
    assert compiled.memory["argument_bytes"] == 8 * 64 * 4


def test_errors_are_one_line():
    with pytest.raises(CudaCompileError, match=r"^CUDA topology '8' is not <partitions>x<hosts>x<devices per host>"):
        cuda_devices(gpu_target_config("h100"), "8")
    with pytest.raises(CudaCompileError, match=r"^no GPU target config 'h1000' \(shipped: a100, b200, gb200, gb300, "
                                               r"h100, h200;"):
        gpu_target_config("h1000")
