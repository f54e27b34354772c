"""A callable target for GPU cells of tests/nnx_models.py's small NNX train steps (target "gpu_targets:nnx_step").

The cell's model names the layer (``bridge``: a ToNNX-bridged Linen layer that never draws, seed 000's pattern, two
(key, count) pairs a layer; ``dropout``: an ``nnx.Dropout`` a layer, which keeps its fork of the stream at any
rate); ``HLO_AUDIT_TEST_DROPOUT`` is the dropout rate (default 0.0: the stream is carried and never drawn). At 0.5
every layer draws: the same entry parameters, more kernels per step (the counter's increment and the key's hash
a layer), which is a change only launches per step can see. Lowered from abstract state, as nnx_models.lower does,
for the cell's default device (the callable target sets it: a named GPU's first compile-only device).
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
from flax import nnx

import nnx_models
from hlo_audit.examples.nnx_mlp import make_step

DROPOUT = "HLO_AUDIT_TEST_DROPOUT"


def nnx_step(cell):
    if cell.model == "bridge":
        spec = nnx_models.ModelSpec(layers=cell.layers, bridge="nodraw")
    elif cell.model == "dropout":
        spec = nnx_models.ModelSpec(layers=cell.layers, dropout_rate=float(os.environ.get(DROPOUT, "0.0")))
    else:
        raise ValueError(f"gpu_targets: no model {cell.model!r} (bridge, dropout)")
    jax.clear_caches()  # names inside nested computations must not depend on what this process traced before
    graphdef, state = nnx.split(nnx.eval_shape(lambda: nnx_models.build(spec)))
    x = jax.ShapeDtypeStruct((nnx_models.BATCH, spec.width), jnp.float32)
    return jax.jit(make_step(graphdef), donate_argnums=0).trace(state, x)


nnx_step.full_depth = {"bridge": 32, "dropout": 32}
