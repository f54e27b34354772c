"""A Flax linen language model and the trainer a user would write for it, with the changes a pull request makes.

Plain module (no pytest import). Token embeddings, ``layers`` pre-norm blocks (causal self-attention with
``q``/``k``/``v``/``attn_out_proj`` projections, a GELU MLP), a final norm and logits through the embedding; a
``flax.training.train_state.TrainState`` whose optimizer is ``optax.MultiSteps(optax.chain(
optax.clip_by_global_norm(1.0), optax.adamw(...)))``; the step is ``jax.jit(train_step, donate_argnums=0)`` over the
state and a batch of tokens, returning the new state and the loss. Each block is rematerialized (``nn.remat`` with
``jax.checkpoint_policies.dots_saveable``) and the blocks are a Python loop. ``Variant`` is one pull request's
change:

* ``scan=True``: the blocks as one ``nn.scan`` over stacked weights (a loop of ``layers`` iterations);
* ``remat=False``: no ``nn.remat`` around the blocks;
* ``policy="nothing_saveable"``: another remat policy (the backward pass recomputes the dots too);
* ``frozen=0``: ``jax.lax.stop_gradient`` on block 0's output projection's weights (its update loses the loss);
* ``clip=False``: no ``optax.clip_by_global_norm`` in the chain;
* ``scale=0.5``: an ``optax.scale(0.5)`` after adamw in the chain;
* ``out_name="out_proj"``: the attention's output projection renamed (its weights' state paths);
* harmless edits: ``scopes`` (``jax.named_scope`` around the blocks), ``helper`` (the MLP through a helper
  function), ``reordered`` (the attention's projections constructed in another order).

``target(cell)`` is the callable target (``cell.quant`` names the variant: ``base`` or one of ``VARIANTS``).
"""

from __future__ import annotations

import contextlib
import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax.training import train_state

VOCAB, WIDTH, HEADS, SEQ, BATCH = 64, 16, 2, 8, 2


@dataclasses.dataclass(frozen=True)
class Variant:
    layers: int = 2
    scan: bool = False
    remat: bool = True
    policy: str = "dots_saveable"
    frozen: int = -1
    clip: bool = True
    scale: float = 1.0
    weight_decay: float = 0.01
    out_name: str = "attn_out_proj"
    scopes: bool = False
    helper: bool = False
    reordered: bool = False


VARIANTS = {
    "scan": Variant(scan=True),
    "remat_removed": Variant(remat=False),
    "remat_policy": Variant(policy="nothing_saveable"),
    "stop_gradient": Variant(frozen=0),
    "clip_removed": Variant(clip=False),
    "scaled": Variant(scale=0.5),
    "no_weight_decay": Variant(weight_decay=0.0),
    "out_renamed": Variant(out_name="out_proj"),
    "unscanned": Variant(),  # the base model, checked against the scanned one's golden: the scan unrolled
    "scopes": Variant(scopes=True),
    "helper": Variant(helper=True),
    "reordered": Variant(reordered=True),
}


def _mlp(block: nn.Module, x):
    return nn.Dense(WIDTH, name="down")(nn.gelu(nn.Dense(4 * WIDTH, name="up")(x)))


class Attention(nn.Module):
    variant: Variant

    @nn.compact
    def __call__(self, x):
        names = ("v", "k", "q") if self.variant.reordered else ("q", "k", "v")
        dense = {name: nn.DenseGeneral((HEADS, WIDTH // HEADS), name=name) for name in names}
        q, k, v = (dense[name](x) for name in ("q", "k", "v"))
        weights = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(WIDTH // HEADS)
        causal = jnp.tril(jnp.ones((SEQ, SEQ), bool))
        weights = jax.nn.softmax(jnp.where(causal, weights, -1e9), axis=-1)
        mixed = jnp.einsum("bhqk,bkhd->bqhd", weights, v)
        return nn.DenseGeneral(WIDTH, axis=(-2, -1), name=self.variant.out_name)(mixed)


class Block(nn.Module):
    variant: Variant

    @nn.compact
    def __call__(self, x, _=None):
        x = x + Attention(self.variant, name="attention")(nn.LayerNorm(name="norm1")(x))
        h = nn.LayerNorm(name="norm2")(x)
        if self.variant.helper:
            h = _mlp(self, h)
        else:
            h = nn.Dense(WIDTH, name="down")(nn.gelu(nn.Dense(4 * WIDTH, name="up")(h)))
        x = x + h
        return (x, None) if self.variant.scan else x


class LM(nn.Module):
    variant: Variant

    @nn.compact
    def __call__(self, tokens):
        v = self.variant
        embed = nn.Embed(VOCAB, WIDTH, name="embed")
        x = embed(tokens)
        block = Block
        if v.remat:
            block = nn.remat(Block, policy=getattr(jax.checkpoint_policies, v.policy))
        if v.scan:
            stack = nn.scan(block, variable_axes={"params": 0}, split_rngs={"params": True}, length=v.layers)
            x, _ = stack(v, name="blocks")(x, None)
        else:
            for i in range(v.layers):
                # A frozen block: its weights read through stop_gradient (no gradient reaches them).
                layer = nn.map_variables(block, "params", trans_in_fn=_stopped, init=True) if i == v.frozen else block
                with jax.named_scope(f"layer{i}") if v.scopes else contextlib.nullcontext():
                    x = layer(v, name=f"block_{i}")(x)
        return embed.attend(nn.LayerNorm(name="final_norm")(x))


def _stopped(variables):
    return jax.tree.map(jax.lax.stop_gradient, variables)


def _optimizer(variant: Variant) -> optax.GradientTransformation:
    transforms = [optax.clip_by_global_norm(1.0)] if variant.clip else []
    transforms.append(optax.adamw(1e-3, weight_decay=variant.weight_decay))
    if variant.scale != 1.0:
        transforms.append(optax.scale(variant.scale))
    return optax.MultiSteps(optax.chain(*transforms), every_k_schedule=2)


def traced(variant: Variant):
    """The step traced from abstract state (nothing allocated)."""
    model = LM(variant)
    tokens = jax.ShapeDtypeStruct((BATCH, SEQ + 1), jnp.int32)

    def create():
        params = model.init(jax.random.key(0), jnp.zeros((BATCH, SEQ), jnp.int32))["params"]
        return train_state.TrainState.create(apply_fn=model.apply, params=params, tx=_optimizer(variant))

    state = jax.eval_shape(create)

    def train_step(state, tokens):
        def loss_fn(params):
            logits = state.apply_fn({"params": params}, tokens[:, :-1])
            labels = jax.nn.one_hot(tokens[:, 1:], VOCAB)
            return optax.softmax_cross_entropy(logits, labels).mean()

        loss, grads = jax.value_and_grad(loss_fn)(state.params)
        return state.apply_gradients(grads=grads), loss

    return jax.jit(train_step, donate_argnums=0).trace(state, tokens)


def target(cell):
    """A callable target: ``cell.quant`` is ``base`` or a name of ``VARIANTS``, ``cell.layers`` the depth."""
    variant = VARIANTS.get(cell.quant, Variant())
    return traced(dataclasses.replace(variant, layers=cell.layers))


target.full_depth = {"lm": 4}
