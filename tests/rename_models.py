"""Small train steps with a rename or a reorder in them, and the same edit beside a real change (issue 37 item 5,
issue 39 item 4). Plain module (no pytest import); every function returns pre-optimization HLO text for the CPU.

* ``salted(up, salts, extra)``: a plain-JAX step over a dict state ``{"params": {"layer_i": {"norm", <up>}},
  "key"}``, each layer drawing its dropout mask from ``fold_in(state["key"], salts[i])``; ``up="up_proj"`` renames
  the weight (it sorts after ``norm`` either way: no reorder), ``salts=(11, 11)`` makes both layers draw one mask,
  ``extra="multiply"`` scales layer 1's activations, ``extra="fold_in"`` folds layer 1's key once more;
  ``target(cell)`` is the same as a callable target, ``cell.quant`` naming a ``SALTED`` variant;
* ``scanned_nnx(up, extra)``: an NNX stack of blocks (LayerNorm, ``up`` and ``down`` Linear, Dropout drawing from
  its own stream) scanned over 3 layers; ``up="ff_in"`` sorts before ``norm``, reordering the stacked leaves;
* ``linen_attention(out, extra)``: a linen block (LayerNorm, query/key/value, ``attn_out_proj``, MLP, Dropout),
  two of them, trained with ``clip_by_global_norm`` and adamw, returning a norm per gradient, as nanodo does;
  ``out="out_proj"`` moves the projection's leaves past ``mlp_*``'s in the state's order (and the global norm's sum
  and the metrics with them);
* ``dataclass_fields(order, extra)``: attention weights as a dataclass registered as a pytree (what an equinox
  module is underneath), its fields in ``order``: another order is a field reorder.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import optax
from flax import linen as nn
from flax import nnx
from flax.training import train_state

from hlo_audit.examples.nnx_mlp import scan_layers, stacked_layers

WIDTH, BATCH = 8, 4
SALTED = {"base": {}, "renamed": {"up": "up_proj"}, "renamed_salts_collapsed": {"up": "up_proj", "salts": (11, 11)}}


def _x() -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct((BATCH, WIDTH), jnp.float32)


def _salted_traced(up: str = "up", salts: tuple[int, int] = (11, 22), extra: str = ""):
    def step(state, x):
        def loss(params):
            h = x
            for i in range(2):
                h = jnp.tanh((h * params[f"layer_{i}"]["norm"]) @ params[f"layer_{i}"][up])
                key = jax.random.fold_in(state["key"], salts[i])
                if extra == "fold_in" and i == 1:
                    key = jax.random.fold_in(key, 7)
                h = jnp.where(jax.random.bernoulli(key, 0.9, h.shape), h, 0.0)
                if extra == "multiply" and i == 1:
                    h = h * 2.0
            return jnp.mean(h * h)

        value, grads = jax.value_and_grad(loss)(state["params"])
        params = jax.tree.map(lambda p, g: p - 0.1 * g, state["params"], grads)
        return {"params": params, "key": state["key"]}, value

    weight = jax.ShapeDtypeStruct((WIDTH, WIDTH), jnp.float32)
    params = {f"layer_{i}": {up: weight, "norm": jax.ShapeDtypeStruct((WIDTH,), jnp.float32)} for i in range(2)}
    state = {"params": params, "key": jax.ShapeDtypeStruct((2,), jnp.uint32)}
    return jax.jit(step, donate_argnums=0).trace(state, _x())


@functools.lru_cache(maxsize=None)
def salted(up: str = "up", salts: tuple[int, int] = (11, 22), extra: str = "") -> str:
    jax.clear_caches()
    return _salted_traced(up, salts, extra).lower(lowering_platforms=("cpu",)).as_text(dialect="hlo")


def target(cell):
    """A callable target: ``cell.quant`` names a ``SALTED`` variant."""
    return _salted_traced(**SALTED[cell.quant])


@functools.lru_cache(maxsize=None)
def scanned_nnx(up: str = "up", extra: bool = False, layers: int = 3) -> str:
    class Block(nnx.Module):
        def __init__(self, rngs: nnx.Rngs):
            self.norm = nnx.LayerNorm(WIDTH, rngs=rngs)
            setattr(self, up, nnx.Linear(WIDTH, WIDTH, rngs=rngs))
            self.down = nnx.Linear(WIDTH, WIDTH, rngs=rngs)
            self.drop = nnx.Dropout(0.1, rngs=rngs)

        def __call__(self, x):
            h = getattr(self, up)(self.norm(x))
            h = h * 2.0 if extra else h
            return x + self.down(nnx.relu(self.drop(h)))

    class Model(nnx.Module):
        def __init__(self, rngs: nnx.Rngs):
            self.layers = stacked_layers(Block, layers, rngs)

        def __call__(self, x):
            return scan_layers(x, self.layers)

    graphdef, state = nnx.split(nnx.eval_shape(lambda: Model(nnx.Rngs(0, dropout=1))))

    def step(state, x):
        model = nnx.merge(graphdef, state)
        loss, grads = nnx.value_and_grad(lambda m: jnp.mean(m(x) ** 2), argnums=nnx.DiffState(0, nnx.Param))(model)
        nnx.update(model, jax.tree.map(lambda p, g: p - 0.1 * g, nnx.state(model, nnx.Param), grads))
        return nnx.state(model), loss

    jax.clear_caches()
    traced = jax.jit(step, donate_argnums=0).trace(state, _x())
    return traced.lower(lowering_platforms=("cpu",)).as_text(dialect="hlo")


@functools.lru_cache(maxsize=None)
def linen_attention(out: str = "attn_out_proj", extra: bool = False) -> str:
    class Block(nn.Module):
        @nn.compact
        def __call__(self, x):
            h = nn.LayerNorm(name="ln1")(x)
            q, k, v = (nn.Dense(WIDTH, name=n)(h) for n in ("query", "key", "value"))
            a = nn.Dense(WIDTH, name=out)(jax.nn.softmax(q @ k.T) @ v)
            a = a * 2.0 if extra else a
            x = x + nn.Dropout(0.1, deterministic=False)(a)
            return x + nn.Dense(WIDTH, name="mlp_out")(nn.gelu(nn.Dense(WIDTH, name="mlp_in")(nn.LayerNorm(name="ln2")(x))))

    class Model(nn.Module):
        @nn.compact
        def __call__(self, x):
            for i in range(2):
                x = Block(name=f"blocks_{i}")(x)
            return nn.Dense(1, name="head")(nn.LayerNorm(name="final_ln")(x)).sum()

    model = Model()

    def create():
        params = model.init(jax.random.key(0), jnp.zeros((BATCH, WIDTH)))["params"]
        tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3))
        return train_state.TrainState.create(apply_fn=model.apply, params=params, tx=tx)

    def step(state, x, rng):
        rng = jax.random.fold_in(rng, state.step)
        loss, grads = jax.value_and_grad(lambda p: state.apply_fn({"params": p}, x, rngs={"dropout": rng}))(
            state.params)
        # nanodo's metrics: a norm per gradient, returned in the state's order (outputs no parameter aliases).
        return state.apply_gradients(grads=grads), {"loss": loss, "grad_norms": jax.tree.map(jnp.linalg.norm, grads)}

    jax.clear_caches()
    lowered = jax.jit(step, donate_argnums=0).lower(jax.eval_shape(create), _x(), jax.random.PRNGKey(1))
    return lowered.as_text(dialect="hlo")


@functools.lru_cache(maxsize=None)
def dataclass_fields(order: tuple[str, ...] = ("wq", "wk", "wv", "wo"), extra: bool = False) -> str:
    cls = dataclasses.make_dataclass("Attention", [(name, jax.Array) for name in order])
    jax.tree_util.register_dataclass(cls, data_fields=list(order), meta_fields=[])

    def forward(p, x):
        out = (jax.nn.softmax((x @ p.wq) @ (x @ p.wk).T) @ (x @ p.wv)) @ p.wo
        return out * 2.0 if extra else out

    def step(p, x):
        loss, grads = jax.value_and_grad(lambda p: jnp.mean(forward(p, x) ** 2))(p)
        return jax.tree.map(lambda w, g: w - 0.1 * g, p, grads), loss

    weights = cls(**{name: jax.ShapeDtypeStruct((WIDTH, WIDTH), jnp.float32) for name in order})
    jax.clear_caches()
    return jax.jit(step, donate_argnums=0).lower(weights, _x()).as_text(dialect="hlo")
