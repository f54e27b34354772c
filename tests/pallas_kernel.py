"""A user's Pallas kernel (Mosaic, for a TPU topology) in a jitted function: the kernel-body case of the diff.

Plain module, imported from a file path by the tests (``load``), so that the same source can be lowered from two
places and its source locations differ while the kernel does not. ``lower(block)`` lowers ``scale_shift`` (``x * 2 +
1`` by a ``pallas_call`` over row blocks of ``block`` rows) for one chip of a TPU v6e-4 topology, on any host
(libtpu compiles for it; nothing runs). ``debug_locations``: jax 0.12 keeps a Mosaic kernel's source locations
beside its body (``debug_locations`` in the custom call's config); off (``jax_mosaic_unzip_debug_locations``), they
stay inside the body's bytecode, file paths included, as in jax before that split.
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


def lower(block: int, debug_locations: bool = True) -> str:
    from hlo_audit.platforms.tpu import topology_devices

    previous = jax.config.jax_mosaic_unzip_debug_locations
    jax.config.update("jax_mosaic_unzip_debug_locations", debug_locations)
    try:
        with jax.default_device(topology_devices("v6e-4")[0]):
            x = jax.ShapeDtypeStruct((ROWS, COLUMNS), jnp.float32)
            lowered = jax.jit(lambda x: scale_shift(x, block)).trace(x).lower(lowering_platforms=("tpu",))
            return lowered.as_text(dialect="hlo", debug_info=True)
    finally:
        jax.config.update("jax_mosaic_unzip_debug_locations", previous)
