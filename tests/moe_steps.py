"""A small mixture-of-experts language model's train step and a KV-cache decode step, in plain jax and optax, with
the changes a pull request makes (issue 38: findings that say what happened, in the model's terms).

Plain module (no pytest import). The train step: token embeddings, ``layers`` MoE blocks (a router, top-1 gates,
``EXPERTS`` GELU experts computed densely and combined by the gates), logits through a head; the loss is the
cross-entropy plus the load-balancing aux loss (experts' token fractions times their mean router probabilities);
the gradients are accumulated over ``MICRO`` microbatches in a ``lax.scan``, computed on the loss times a loss scale
and divided by it after, and the adam update is skipped by a ``lax.cond`` where a gradient is not finite. The step
is ``jax.jit(train_step, donate_argnums=0)``. The decode step writes one token's keys and values into a donated KV
cache at a position, attends over the cache and passes what it read through one MoE block (the train step's).

``Variant`` is one change:

* ``scan=True``: the blocks' weights stacked and the blocks a ``lax.scan`` (a loop of ``layers`` iterations);
* ``aux=False``: the load-balancing aux loss dropped from the loss;
* ``loss_scale=None``: no loss scaling (the loss not multiplied, the gradients not divided);
* ``where_update=True``: the update computed always and selected by ``jnp.where`` (both branches of the cond);
* ``micro=8``: another microbatch count (the accumulation loop's trip count);
* ``cache=32``: the decode step's KV cache of another length;
* ``router_bf16=True``: the router's logits computed in bf16 (the train step's blocks and the decode step's);
* ``top_k=2``: each token routed to its 2 best experts (``top_k``) instead of the best (``argmax``);
* ``one_hot_embed=True``: the embedding as ``one_hot(tokens) @ embed`` instead of a gather.

``SAMPLING`` are the decode step's: it samples its next token from a key it is given (``sampled``), or from
``PRNGKey(0)`` written in the step (``sampled_literal_key``: every call draws the same bits).

``target(cell)``: the callable target (``cell.model`` ``moe`` or ``decode``; ``cell.quant`` a name of
``VARIANTS``, of ``SAMPLING`` or ``base``; ``cell.layers`` the depth).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax

VOCAB, WIDTH, HIDDEN, EXPERTS, TOKENS, MICRO = 32, 16, 32, 4, 8, 2
CACHE, HEADS = 16, 2


@dataclasses.dataclass(frozen=True)
class Variant:
    layers: int = 2
    scan: bool = False
    aux: bool = True
    loss_scale: float | None = 1024.0
    where_update: bool = False
    micro: int = MICRO
    cache: int = CACHE
    router_bf16: bool = False
    top_k: int = 1
    one_hot_embed: bool = False
    # The decode step samples its next token: from a key it is given ("key"), or from PRNGKey(0) written in the step
    # ("literal": every call draws the same bits); "": it returns the attention block's output only.
    sample: str = ""


VARIANTS = {
    "scan": Variant(scan=True),
    "aux_dropped": Variant(aux=False),
    "no_loss_scale": Variant(loss_scale=None),
    "where_update": Variant(where_update=True),
    "micro_8": Variant(micro=8),
    "cache_doubled": Variant(cache=2 * CACHE),
    "router_bf16": Variant(router_bf16=True),
    "top_2": Variant(top_k=2),
    "one_hot_embed": Variant(one_hot_embed=True),
}
# The decode step's sampling, apart from ``VARIANTS`` (train-step changes besides, run by every MoE test).
SAMPLING = {"sampled": Variant(sample="key"), "sampled_literal_key": Variant(sample="literal")}


def _block_shapes() -> dict:
    return {"router": (WIDTH, EXPERTS), "w_in": (EXPERTS, WIDTH, HIDDEN), "w_out": (EXPERTS, HIDDEN, WIDTH)}


def abstract_params(variant: Variant) -> dict:
    f32 = jnp.float32
    params = {"embed": jax.ShapeDtypeStruct((VOCAB, WIDTH), f32), "head": jax.ShapeDtypeStruct((WIDTH, VOCAB), f32)}
    if variant.scan:
        params["layers"] = {k: jax.ShapeDtypeStruct((variant.layers, *s), f32) for k, s in _block_shapes().items()}
    else:
        for i in range(variant.layers):
            params[f"layers_{i}"] = {k: jax.ShapeDtypeStruct(s, f32) for k, s in _block_shapes().items()}
    return params


def _moe(block: dict, x, variant: Variant = Variant()):
    """(Output, aux loss) of one MoE block on ``x`` [tokens, width]."""
    if variant.router_bf16:
        logits = (x.astype(jnp.bfloat16) @ block["router"].astype(jnp.bfloat16)).astype(jnp.float32)
    else:
        logits = x @ block["router"]
    probs = jax.nn.softmax(logits, axis=-1)
    if variant.top_k == 1:
        chosen = jax.nn.one_hot(jnp.argmax(probs, axis=-1), EXPERTS)
    else:
        chosen = jnp.sum(jax.nn.one_hot(jax.lax.top_k(probs, variant.top_k)[1], EXPERTS), axis=1)
    h = jax.nn.gelu(jnp.einsum("td,edh->teh", x, block["w_in"]))
    out = jnp.einsum("teh,ehd->ted", h, block["w_out"])
    y = x + jnp.einsum("ted,te->td", out, probs * chosen)
    aux = EXPERTS * jnp.sum(jnp.mean(chosen, axis=0) * jnp.mean(probs, axis=0))
    return y, aux


def _loss(variant: Variant, params: dict, tokens, targets):
    x = jax.nn.one_hot(tokens, VOCAB) @ params["embed"] if variant.one_hot_embed else params["embed"][tokens]
    if variant.scan:
        def layer(h, block):
            h, aux = _moe(block, h, variant)
            return h, aux
        x, auxes = jax.lax.scan(layer, x, params["layers"])
        aux = jnp.sum(auxes)
    else:
        aux = 0.0
        for i in range(variant.layers):
            x, a = _moe(params[f"layers_{i}"], x, variant)
            aux = aux + a
    logits = x @ params["head"]
    loss = jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, targets))
    return loss + 0.01 * aux if variant.aux else loss


def train_traced(variant: Variant):
    """The train step traced from abstract state (a jax ``Traced``, as a callable target returns it)."""
    params = abstract_params(variant)
    optimizer = optax.adam(1e-3)
    opt_state = jax.eval_shape(optimizer.init, params)
    tokens = jax.ShapeDtypeStruct((variant.micro, TOKENS), jnp.int32)

    def grads_of(params, tokens, targets):
        if variant.loss_scale is None:
            return jax.value_and_grad(lambda p: _loss(variant, p, tokens, targets))(params)
        scaled, grads = jax.value_and_grad(lambda p: _loss(variant, p, tokens, targets) * variant.loss_scale)(params)
        return scaled / variant.loss_scale, jax.tree.map(lambda g: g / variant.loss_scale, grads)

    def train_step(state, tokens, targets):
        params, opt_state = state

        def micro(acc, batch):
            loss, grads = grads_of(params, *batch)
            return jax.tree.map(jnp.add, acc, grads), loss

        zeros = jax.tree.map(jnp.zeros_like, params)
        grads, losses = jax.lax.scan(micro, zeros, (tokens, targets))
        finite = jnp.all(jnp.array([jnp.all(jnp.isfinite(g)) for g in jax.tree.leaves(grads)]))

        def update(_):
            updates, new_opt = optimizer.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), new_opt

        if variant.where_update:
            updated = update(None)
            new_state = jax.tree.map(lambda new, old: jnp.where(finite, new, old), updated, (params, opt_state))
        else:
            new_state = jax.lax.cond(finite, update, lambda _: (params, opt_state), None)
        return new_state, jnp.mean(losses)

    return jax.jit(train_step, donate_argnums=0).trace((params, opt_state), tokens, tokens)


def decode_traced(variant: Variant):
    """One decode step over a donated KV cache of ``variant.cache`` positions."""
    f32 = jnp.float32
    params = {"wq": jax.ShapeDtypeStruct((WIDTH, WIDTH), f32), "wk": jax.ShapeDtypeStruct((WIDTH, WIDTH), f32),
              "wv": jax.ShapeDtypeStruct((WIDTH, WIDTH), f32), "wo": jax.ShapeDtypeStruct((WIDTH, WIDTH), f32),
              "moe": {k: jax.ShapeDtypeStruct(s, f32) for k, s in _block_shapes().items()}}
    cache = {"k": jax.ShapeDtypeStruct((variant.cache, HEADS, WIDTH // HEADS), f32),
             "v": jax.ShapeDtypeStruct((variant.cache, HEADS, WIDTH // HEADS), f32)}

    def decode_step(params, cache, x, pos, key=None):
        def heads(w):
            return (x @ params[w]).reshape(1, HEADS, WIDTH // HEADS)

        k = jax.lax.dynamic_update_slice(cache["k"], heads("wk"), (pos, 0, 0))
        v = jax.lax.dynamic_update_slice(cache["v"], heads("wv"), (pos, 0, 0))
        scores = jnp.einsum("hd,thd->ht", heads("wq")[0], k)
        scores = jnp.where(jnp.arange(variant.cache)[None] <= pos, scores, -1e9)
        out = jnp.einsum("ht,thd->hd", jax.nn.softmax(scores, axis=-1), v).reshape(WIDTH) @ params["wo"]
        out, _ = _moe(params["moe"], out[None], variant)
        if not variant.sample:
            return out[0], {"k": k, "v": v}
        sample_key = jax.random.PRNGKey(0) if variant.sample == "literal" else key
        token = jax.random.categorical(sample_key, out[0])
        return out[0], token, {"k": k, "v": v}

    args = (params, cache, jax.ShapeDtypeStruct((WIDTH,), f32), jax.ShapeDtypeStruct((), jnp.int32))
    if variant.sample:
        args += (jax.ShapeDtypeStruct((2,), jnp.uint32),)
    return jax.jit(decode_step, donate_argnums=1).trace(*args)


def target(cell):
    """A callable target: ``cell.model`` ``moe`` (the train step) or ``decode``, ``cell.quant`` ``base`` or a name of
    ``VARIANTS`` or ``SAMPLING``, ``cell.layers`` the depth."""
    variant = dataclasses.replace(VARIANTS.get(cell.quant) or SAMPLING.get(cell.quant, Variant()), layers=cell.layers)
    return decode_traced(variant) if cell.model == "decode" else train_traced(variant)


target.full_depth = {"moe": 4, "decode": 1}


def lower(name: str = "base", model: str = "moe") -> str:
    """The variant's pre-optimization HLO text for the CPU."""
    variant = VARIANTS.get(name, Variant())
    traced = decode_traced(variant) if model == "decode" else train_traced(variant)
    return traced.lower(lowering_platforms=("cpu",)).as_text(dialect="hlo")
