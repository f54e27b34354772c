"""A user's Pallas kernel in a jitted function: the kernel-body case of the diff.

Plain module, imported from a file path by the tests, so that the same source can be lowered from two places and
its source locations differ while the kernel does not. ``lower(block)`` lowers ``scale_shift`` (``x * 2 + 1`` by a
``pallas_call`` over row blocks of ``block`` rows), on any host (nothing runs):

* ``backend="mosaic"``: for one chip of a TPU v6e-4 topology (libtpu compiles for it): a ``tpu_custom_call``.
  ``debug_locations``: jax 0.12 keeps a Mosaic kernel's source locations beside its body (``debug_locations`` in
  the custom call's config); off (``jax_mosaic_unzip_debug_locations``), they stay inside the body's bytecode,
  file paths included, as in jax before that split;
* ``backend="triton"``: for a compile-only H100 (XLA's GPU target config, jax's CUDA plugin): a
  ``__gpu$xla.gpu.triton`` call whose config holds the kernel's bytecode, locations inside.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

ROWS, COLUMNS = 512, 128


def _kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0 + 1.0


def scale_shift(x, block: int):
    spec = pl.BlockSpec((block, COLUMNS), lambda i: (i, 0))
    return pl.pallas_call(_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(x.shape[0] // block,),
                          in_specs=[spec], out_specs=spec)(x)


def lower(block: int, debug_locations: bool = True, backend: str = "mosaic") -> str:
    if backend == "triton":
        from hlo_audit.platforms.cuda import cuda_devices, target_config

        device, platform = cuda_devices(target_config("h100"))[0], "cuda"
    else:
        from hlo_audit.platforms.tpu import topology_devices

        device, platform = topology_devices("v6e-4")[0], "tpu"
    previous = jax.config.jax_mosaic_unzip_debug_locations
    jax.config.update("jax_mosaic_unzip_debug_locations", debug_locations)
    try:
        with jax.default_device(device):
            x = jax.ShapeDtypeStruct((ROWS, COLUMNS), jnp.float32)
            lowered = jax.jit(lambda x: scale_shift(x, block)).trace(x).lower(lowering_platforms=(platform,))
            return lowered.as_text(dialect="hlo", debug_info=True)
    finally:
        jax.config.update("jax_mosaic_unzip_debug_locations", previous)
