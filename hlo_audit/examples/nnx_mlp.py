"""A callable target: a small Flax NNX MLP train step, unrolled or scanned over its layers.

Use it as ``target = "hlo_audit.examples.nnx_mlp:lower"``. The cell's ``quant`` picks the dropout in each
layer: ``none`` (no dropout), ``dropout0`` (an ``nnx.Dropout(0.0)``: it holds an RNG stream it never draws
from, the seed-000 leak in miniature) or ``dropout`` (rate 0.1, draws). ``cell.overrides`` may set ``width``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from hlo_audit import Unavailable

DROPOUT = {"none": None, "dropout0": 0.0, "dropout": 0.1}
LEARNING_RATE = 0.1


def stacked_layers(make_block, layers: int, rngs: nnx.Rngs):
    """``layers`` blocks whose state is stacked on a leading axis: flax's scan-over-layers (split_rngs + vmap)."""

    @nnx.split_rngs(splits=layers)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def create(r: nnx.Rngs):
        return make_block(r)

    return create(rngs)


def scan_layers(x, layers):
    """Apply stacked layers with ``nnx.scan``: the body is traced once, whatever the depth."""

    @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
    def forward(h, layer):
        return layer(h)

    return forward(x, layers)


def make_step(graphdef):
    """``train_step(state, x) -> (new_state, loss)``: merge, forward, mean-square loss, grads w.r.t. nnx.Param, SGD."""

    def train_step(state, x):
        model = nnx.merge(graphdef, state)

        def loss_fn(m):
            y = m(x)
            return jnp.mean(y * y)

        loss, grads = nnx.value_and_grad(loss_fn, argnums=nnx.DiffState(0, nnx.Param))(model)
        params = nnx.state(model, nnx.Param)
        nnx.update(model, jax.tree.map(lambda p, g: p - LEARNING_RATE * g, params, grads))
        return nnx.state(model), loss

    return train_step


class Block(nnx.Module):
    def __init__(self, width: int, rate: float | None, rngs: nnx.Rngs):
        self.linear = nnx.Linear(width, width, rngs=rngs)
        self.dropout = nnx.Dropout(rate, rngs=rngs) if rate is not None else None

    def __call__(self, x):
        x = nnx.relu(self.linear(x))
        return self.dropout(x) if self.dropout is not None else x


class MLP(nnx.Module):
    def __init__(self, layers: int, scan: bool, width: int, rate: float | None, rngs: nnx.Rngs):
        self.scan = scan
        if scan:
            self.layers = stacked_layers(lambda r: Block(width, rate, r), layers, rngs)
        else:
            self.layers = nnx.List([Block(width, rate, rngs) for _ in range(layers)])

    def __call__(self, x):
        if self.scan:
            return scan_layers(x, self.layers)
        for layer in self.layers:
            x = layer(x)
        return x


def lower(cell) -> jax.stages.Traced:
    """The train step for ``cell``, traced from abstract shapes (the tool lowers it for cell.platform)."""
    if cell.quant not in DROPOUT:
        raise Unavailable(f"nnx_mlp has no quantization {cell.quant!r} (it knows {', '.join(DROPOUT)})")
    width = int(dict(cell.overrides).get("width", 16))
    model = nnx.eval_shape(lambda: MLP(cell.layers, cell.scan, width, DROPOUT[cell.quant], nnx.Rngs(0, dropout=1)))
    graphdef, state = nnx.split(model)
    x = jax.ShapeDtypeStruct((cell.batch, width), jnp.float32)
    return jax.jit(make_step(graphdef), donate_argnums=0).trace(state, x)


lower.full_depth = {"mlp": 8}
