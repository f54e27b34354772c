"""A user's sharded train step: a small transformer (causal attention and an MLP per layer) trained with adamw,
its weights and optimizer state sharded FSDP-wise over 8 devices, the batch data-parallel, and the changes a pull
request makes to it.

Plain module (no pytest import), a callable target (``target(cell)``: ``cell.quant`` names the variant). It needs 8
devices: ``XLA_FLAGS=--xla_force_host_platform_device_count=8`` set before jax starts (tests run it in a process of
its own). The step is ``jax.jit(train_step, donate_argnums=0)`` over ``(params, opt_state)`` with every weight
``{devices=[8,1]<=[8]}`` (split along its first dimension), the batch split across the devices, the activations
constrained sequence-wise after each attention block (``with_sharding_constraint``), and a ``shard_map`` that scales each device's rows of the output.
``Variant`` is one pull request's change:

* ``constrain=False``: the activations' sharding constraint removed;
* ``replicated="up"``: the MLP's ``up`` weight (and so its adam moments) replicated rather than split;
* ``psum``: the ``shard_map`` adds the devices' rows up (a ``psum``: an all-reduce);
* ``batch=16``: the batch doubled;
* ``causal=False``: the attention mask made non-causal (every position sees every other);
* ``transpose``: the attention probabilities transposed before they weigh the values (square: same shapes);

and harmless ones, the same program: ``named_scopes`` (each layer in a ``jax.named_scope``), ``dot_call``
(``jnp.dot(x, w)`` for ``x @ w``), ``helper`` (the MLP in a function of its own), ``reordered`` (k, v computed
before q; the weights built in another order).
"""

from __future__ import annotations

import contextlib
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

DEVICES, LAYERS = 8, 2
BATCH, SEQ, WIDTH, HIDDEN, HEADS = 8, 8, 16, 32, 2
AXIS = "fsdp"
WEIGHTS = ("q", "k", "v", "o", "up", "down")


@dataclasses.dataclass(frozen=True)
class Variant:
    batch: int = BATCH
    constrain: bool = True
    replicated: str = ""
    psum: bool = False
    causal: bool = True
    transpose: bool = False
    named_scopes: bool = False
    dot_call: bool = False
    helper: bool = False
    reordered: bool = False


VARIANTS = {
    "constraint_removed": Variant(constrain=False),
    "up_replicated": Variant(replicated="up"),
    "psum_added": Variant(psum=True),
    "batch_16": Variant(batch=16),
    "non_causal": Variant(causal=False),
    "transposed": Variant(transpose=True),
    "named_scopes": Variant(named_scopes=True),
    "dot_call": Variant(dot_call=True),
    "helper": Variant(helper=True),
    "reordered": Variant(reordered=True),
}


def _shape(name: str) -> tuple[int, int]:
    return (HIDDEN, WIDTH) if name == "down" else (WIDTH, HIDDEN) if name == "up" else (WIDTH, WIDTH)


def _weights(variant: Variant) -> dict:
    names = WEIGHTS[::-1] if variant.reordered else WEIGHTS
    return {f"layer_{n}": {w: jax.ShapeDtypeStruct(_shape(w), jnp.float32) for w in names} for n in range(LAYERS)}


def _matmul(variant: Variant, x, w):
    return jnp.dot(x, w) if variant.dot_call else x @ w


def _mlp(variant: Variant, layer: dict, h):
    return _matmul(variant, jax.nn.gelu(_matmul(variant, h, layer["up"])), layer["down"])


def _attention(variant: Variant, layer: dict, h):
    def heads(w):
        return _matmul(variant, h, layer[w]).reshape(h.shape[0], SEQ, HEADS, WIDTH // HEADS)

    if variant.reordered:
        k, v = heads("k"), heads("v")
        q = heads("q")
    else:
        q, k, v = heads("q"), heads("k"), heads("v")
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(WIDTH // HEADS)
    if variant.causal:
        mask = jnp.tril(jnp.ones((SEQ, SEQ), bool))
        scores = jnp.where(mask, scores, -1e9)
    probs = jax.nn.softmax(scores, axis=-1)
    if variant.transpose:
        probs = probs.swapaxes(-1, -2)
    out = jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(h.shape)
    return _matmul(variant, out, layer["o"])


def _model(variant: Variant, mesh: Mesh, params: dict, x):
    h = x
    for n in range(LAYERS):
        layer = params[f"layer_{n}"]
        scope = jax.named_scope(f"layer_{n}") if variant.named_scopes else contextlib.nullcontext()
        with scope:
            h = h + _attention(variant, layer, h)
            if variant.constrain:
                h = jax.lax.with_sharding_constraint(h, NamedSharding(mesh, P(None, AXIS)))
            if variant.helper:
                h = h + _mlp(variant, layer, h)
            else:
                h = h + _matmul(variant, jax.nn.gelu(_matmul(variant, h, layer["up"])), layer["down"])
    return jax.shard_map(lambda rows: _scaled(variant, rows), mesh=mesh, in_specs=P(AXIS), out_specs=P(AXIS))(h)


def _scaled(variant: Variant, rows):
    if variant.psum:
        return rows * 0.5 + jax.lax.psum(rows, AXIS) / DEVICES
    return rows * 0.5


def traced(variant: Variant, devices=None):
    """The step traced over a mesh of ``devices`` (the host's by default), from abstract state."""
    mesh = Mesh(np.array((devices or jax.devices())[:DEVICES]), (AXIS,))
    optimizer = optax.adamw(1e-3)
    weights = _weights(variant)
    state = (weights, jax.eval_shape(optimizer.init, weights))

    def sharding(path, leaf):
        name = jax.tree_util.keystr(path[-1:], simple=True)
        split = len(leaf.shape) == 2 and name != variant.replicated
        return NamedSharding(mesh, P(AXIS) if split else P())

    state_shardings = jax.tree_util.tree_map_with_path(sharding, state)
    data = NamedSharding(mesh, P(AXIS))
    batch = jax.ShapeDtypeStruct((variant.batch, SEQ, WIDTH), jnp.float32)

    def train_step(state, x, y):
        params, opt_state = state

        def loss_fn(p):
            return jnp.mean((_model(variant, mesh, p, x) - y) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), loss

    step = jax.jit(train_step, donate_argnums=0, in_shardings=(state_shardings, data, data),
                   out_shardings=(state_shardings, NamedSharding(mesh, P())))
    return step.trace(state, batch, batch)


def target(cell):
    """A callable target: ``cell.quant`` is ``base`` or a name of ``VARIANTS``."""
    import hlo_audit  # the cell's devices

    return traced(VARIANTS.get(cell.quant, Variant()), hlo_audit.devices(cell))
