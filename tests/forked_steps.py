"""A callable target whose train step comes in every kind the tool lowers, with or without a per-layer fork.

``forked_target(cell)``: ``cell.model`` is the step's kind: ``nnx`` (``nnx.jit(step).trace(model, x)``),
``nnx_lowered`` (``nnx.jit(step).lower(...)``), ``jax`` (``jax.jit`` over ``nnx.split``'s state) or ``pytree``
(``jax.jit`` over a plain dict of arrays; the fork a raw key u32[2] and count u32[] per layer, as NNX's streams
flatten) or ``pytree_typed`` (the same, the fork a typed PRNG key per layer: RNG state by its dtype alone, which
only args_info has); ``cell.quant`` is ``base``
or ``fork``: every layer keeps ``self.rngs = rngs.fork()`` (an ``nnx.Rngs`` it never draws from: a key u32[2] and
a count u32[] per layer, carried), the regression of issue 26's user. The layers are an ``nnx.List`` named
``layers``; the step is SGD on a mean-square loss. Abstract throughout: nothing is allocated.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

WIDTH = 8
BATCH = 4
KINDS = ("nnx", "nnx_lowered", "jax", "pytree", "pytree_typed")


class Block(nnx.Module):
    def __init__(self, fork: bool, rngs: nnx.Rngs):
        self.linear = nnx.Linear(WIDTH, WIDTH, rngs=rngs)
        if fork:
            self.rngs = rngs.fork()  # kept, never drawn: RNG state marshalled into every step

    def __call__(self, x):
        return nnx.relu(self.linear(x))


class Model(nnx.Module):
    def __init__(self, layers: int, fork: bool, rngs: nnx.Rngs):
        self.layers = nnx.List([Block(fork, rngs) for _ in range(layers)])

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def _sgd(model, x):
    def loss(m):
        y = m(x)
        return jnp.mean(y * y)

    value, grads = nnx.value_and_grad(loss)(model)
    nnx.update(model, jax.tree.map(lambda p, g: p - 0.1 * g, nnx.state(model, nnx.Param), grads))
    return value


def _pytree_step(layers: int, fork: bool, typed: bool):
    """jax.jit over a plain dict: ``params.layers_N.{w,b}``, and with the fork ``rngs.layers_N.{key,count}`` (typed:
    ``rngs.layers_N``, a ``jax.random.key``)."""
    state = {"params": {f"layers_{i}": {"w": jax.ShapeDtypeStruct((WIDTH, WIDTH), jnp.float32),
                                        "b": jax.ShapeDtypeStruct((WIDTH,), jnp.float32)} for i in range(layers)}}
    if fork and typed:
        state["rngs"] = {f"layers_{i}": jax.eval_shape(lambda: jax.random.key(0)) for i in range(layers)}
    elif fork:
        state["rngs"] = {f"layers_{i}": {"key": jax.ShapeDtypeStruct((2,), jnp.uint32),
                                         "count": jax.ShapeDtypeStruct((), jnp.uint32)} for i in range(layers)}

    def step(state, x):
        def loss(params):
            y = x
            for i in range(layers):
                y = nnx.relu(y @ params[f"layers_{i}"]["w"] + params[f"layers_{i}"]["b"])
            return jnp.mean(y * y)

        grads = jax.grad(loss)(state["params"])
        return {**state, "params": jax.tree.map(lambda p, g: p - 0.1 * g, state["params"], grads)}

    return jax.jit(step, donate_argnums=0).trace(state, jax.ShapeDtypeStruct((BATCH, WIDTH), jnp.float32))


def forked_target(cell):
    if cell.model not in KINDS or cell.quant not in ("base", "fork"):
        raise ValueError(f"forked_target: model one of {KINDS}, quant base or fork; got {cell.model}/{cell.quant}")
    fork = cell.quant == "fork"
    if cell.model.startswith("pytree"):
        return _pytree_step(cell.layers, fork, typed=cell.model == "pytree_typed")
    model = nnx.eval_shape(lambda: Model(cell.layers, fork, nnx.Rngs(0)))
    x = jax.ShapeDtypeStruct((BATCH, WIDTH), jnp.float32)
    if cell.model == "nnx":
        return nnx.jit(_sgd).trace(model, x)
    if cell.model == "nnx_lowered":
        return nnx.jit(_sgd).trace(model, x).lower(lowering_platforms=(cell.platform,))
    graphdef, state = nnx.split(model)

    def step(model, x):
        module = nnx.merge(graphdef, model)
        loss = _sgd(module, x)
        return nnx.state(module), loss

    return jax.jit(step).trace(state, x)


forked_target.scan = "off"
forked_target.quant = ["base", "fork"]
forked_target.full_depth = {kind: 4 for kind in KINDS}
