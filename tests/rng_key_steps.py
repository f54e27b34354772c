"""Small train steps that draw their dropout masks from keys every way a user writes it, right and wrong.

Plain module (no pytest import), used by tests/test_rng_keys.py and as a callable target (``target``). Each step is
two dropouts around a matmul, ``y = drop(drop(x) @ w)``, the gradient of ``sum(y)`` applied by optax (plain JAX) or by
hand to an NNX model's ``nnx.Param`` state. What ``variant`` does with the keys:

* ``split``: ``key, k1, k2 = split(key, 3)``, one half per dropout, the new key kept (right);
* ``fold_in``: ``fold_in(key, 0)`` and ``fold_in(key, 1)`` (right: fold_in does not consume the key);
* ``reused``: both dropouts draw from ``key`` itself (wrong: they drop the same units);
* ``literal``: the dropout keys are split from ``PRNGKey(0)`` inside the step (wrong: every step draws the same bits);
* ``scan_fold_in``: the layers are a ``lax.scan``, each drawing from ``fold_in(key, i)`` (right);
* ``scan_reused``: the scan draws from the key it carries, unchanged (wrong: every layer drops the same units). Only
  in ``forward``: under ``value_and_grad`` jax hoists the loop-invariant draw out of the loop (one draw, its mask
  read by every layer), which the HLO cannot tell from a mask meant to be shared;
* ``init_seed``: ``split``, and the state also holds a key under a neutral name, ``init_seed``, the step hands back
  unread (dead RNG state, whatever its name);
* NNX (``framework="nnx"``): ``streams`` (an ``nnx.Dropout`` with its own ``nnx.Rngs`` stream, called twice: the
  stream's count makes two keys), ``split``, ``reused`` and ``literal`` (the keys given to ``nnx.Dropout(rngs=...)``).
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax import lax

JAX_VARIANTS = ("split", "fold_in", "reused", "literal", "scan_fold_in", "init_seed")
NNX_VARIANTS = ("streams", "split", "reused", "literal")
RIGHT = frozenset({"split", "fold_in", "scan_fold_in", "init_seed", "streams"})
LAYERS, WIDTH, BATCH, RATE = 3, 8, 4, 0.5


def _drop(x, key):
    keep = jax.random.bernoulli(key, 1.0 - RATE, x.shape)
    return jnp.where(keep, x / (1.0 - RATE), 0.0)


def _keys(variant: str, key):
    """(the two dropout keys, the key the state keeps)."""
    if variant in ("split", "init_seed"):
        key, k1, k2 = jax.random.split(key, 3)
        return (k1, k2), key
    if variant == "fold_in":
        return (jax.random.fold_in(key, 0), jax.random.fold_in(key, 1)), key
    if variant == "literal":
        return tuple(jax.random.split(jax.random.PRNGKey(0))), key
    return (key, key), key  # reused


def _forward(variant: str, w, x, key):
    if variant.startswith("scan_"):
        def layer(h, xs):
            i, wi = xs
            k = jax.random.fold_in(key, i) if variant == "scan_fold_in" else key
            return jnp.tanh(_drop(h, k) @ wi), None

        h, _ = lax.scan(layer, x, (jnp.arange(LAYERS), w))
        return h, key
    (k1, k2), kept = _keys(variant, key)
    return jnp.tanh(_drop(_drop(x, k1) @ w[0], k2)), kept


def forward(variant: str):
    """The layers alone, jitted: ``f(w, x, key) -> sum(y)`` (inference: no gradient)."""
    return jax.jit(lambda w, x, key: jnp.sum(_forward(variant, w, x, key)[0]))


def jax_state(variant: str) -> dict:
    w = np.linspace(-1.0, 1.0, LAYERS * WIDTH * WIDTH, dtype=np.float32).reshape(LAYERS, WIDTH, WIDTH)
    state = {"w": jnp.asarray(w), "key": jax.random.PRNGKey(1)}
    state["opt"] = optax.adam(1e-2).init(state["w"])
    if variant == "init_seed":
        state["init_seed"] = jax.random.PRNGKey(2)
    return state


def jax_step(variant: str):
    tx = optax.adam(1e-2)

    def step(state, x):
        def loss(w):
            y, kept = _forward(variant, w, x, state["key"])
            return jnp.sum(y), kept

        (value, kept), grads = jax.value_and_grad(loss, has_aux=True)(state["w"])
        updates, opt = tx.update(grads, state["opt"], state["w"])
        return {**state, "w": optax.apply_updates(state["w"], updates), "opt": opt, "key": kept}, value

    return step


class Block(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.inner = nnx.Linear(WIDTH, WIDTH, rngs=rngs)
        self.outer = nnx.Linear(WIDTH, WIDTH, rngs=rngs)
        self.drop = nnx.Dropout(RATE, rngs=nnx.Rngs(dropout=3))

    def __call__(self, x, keys=None):
        first, second = keys if keys is not None else (None, None)
        h = self.drop(self.inner(x), rngs=first)
        return jnp.tanh(self.drop(self.outer(h), rngs=second))


def nnx_parts(variant: str):
    """(graphdef, params, rest, step): the model split into its ``nnx.Param`` state and the rest (the dropout's
    stream), and ``step(params, rest, x, key) -> (params, rest, key, loss)``."""
    graphdef, params, rest = nnx.split(Block(nnx.Rngs(0)), nnx.Param, ...)

    def step(params, rest, x, key):
        model = nnx.merge(graphdef, params, rest)
        keys, kept = (None, key) if variant == "streams" else _keys(variant, key)
        value, grads = nnx.value_and_grad(lambda m: jnp.sum(m(x, keys)))(model)
        _, params, rest = nnx.split(model, nnx.Param, ...)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), rest, kept, value

    return graphdef, params, rest, step


def batch() -> jax.Array:
    return jnp.asarray(np.linspace(-1.0, 2.0, BATCH * WIDTH, dtype=np.float32).reshape(BATCH, WIDTH))


def traced(framework: str, variant: str) -> jax.stages.Traced:
    jax.clear_caches()
    if framework == "jax":
        return jax.jit(jax_step(variant), donate_argnums=0).trace(jax_state(variant), batch())
    _, params, rest, step = nnx_parts(variant)
    return jax.jit(step, donate_argnums=(0, 1)).trace(params, rest, batch(), jax.random.PRNGKey(1))


def lower(framework: str, variant: str) -> jax.stages.Lowered:
    return traced(framework, variant).lower(lowering_platforms=("cpu",))


def target(cell) -> jax.stages.Traced:
    """A callable target: ``cell.model`` names the framework (``jax`` / ``nnx``); the variant is ``STEP_VARIANT``'s
    (an edit to the step without another cell: what the gate must see against the golden)."""
    return traced(cell.model, os.environ.get("STEP_VARIANT", "split"))
