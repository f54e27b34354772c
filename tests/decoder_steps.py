"""A decode step as MaxEngine writes one, in miniature: params in, the rest of the model state (an int8 weight
kept outside nnx.Param, as AQT's serve mode keeps its pre-quantized kernels; its scale; a dropout stream)
closed over. Plain module: test_constants imports it, and the gate's tests run it as a callable target, where
``HLO_AUDIT_INJECT=rest-as-args`` passes the rest state in as an argument instead, as the train step does."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

WIDTH = 1024  # an int8 [1024, 1024] weight is exactly LARGE_CONSTANT_BYTES


class Frozen(nnx.Variable):
    """Kept outside nnx.Param, as AQT's serve mode keeps its pre-quantized weights (qrhs.frozen)."""


class Decoder(nnx.Module):
    def __init__(self, rngs: nnx.Rngs, real_weights: bool):
        values = np.random.default_rng(0).integers(-127, 128, (WIDTH, WIDTH)) if real_weights else 0
        self.embed = nnx.Param(jnp.ones((8, WIDTH)))
        self.qvalue = Frozen(jnp.zeros((WIDTH, WIDTH), jnp.int8) + jnp.asarray(values, jnp.int8))
        self.scale = Frozen(jnp.full((1, WIDTH), 0.5, jnp.bfloat16))
        self.dropout = nnx.Dropout(0.5, rngs=rngs)

    def __call__(self, x):
        h = x @ self.embed
        h = (h.astype(jnp.int8) @ self.qvalue[...]).astype(jnp.bfloat16) * self.scale[...]
        return self.dropout(h.astype(jnp.float32))


def traced_step(real_weights: bool = False, rest_as_argument: bool = False):
    """(Traced step, its rest state). Merged with copy=True, as MaxEngine merges: the closed-over Variables
    outlive the trace."""
    model = Decoder(nnx.Rngs(0, dropout=1), real_weights)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), params)
    x = jax.ShapeDtypeStruct((2, 8), jnp.float32)
    if rest_as_argument:
        traced = jax.jit(lambda params, rest, x: nnx.merge(graphdef, params, rest, copy=True)(x)).trace(
            abstract, rest, x)
    else:
        traced = jax.jit(lambda params, x: nnx.merge(graphdef, params, rest, copy=True)(x)).trace(abstract, x)
    return traced, rest


def lower(cell):
    """The callable target: a Traced, whose captured arrays the tool records (without names)."""
    return traced_step(rest_as_argument=os.environ.get("HLO_AUDIT_INJECT") == "rest-as-args")[0]


lower.full_depth = {"decoder": 1}
