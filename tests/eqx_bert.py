"""A small BERT encoder and its train step, as equinox's BERT example writes them
(https://docs.kidger.site/equinox/examples/bert/), with a dropout key mistake a pull request can make.

Plain module (no pytest import), used by tests/test_rng_reuse_eqx.py and as a callable target (``target``). The
encoder embeds the tokens (an ``eqx.nn.Embedding`` and a dropout) and runs ``LAYERS`` transformer layers; each layer
splits the key it is given for its attention block (``eqx.nn.MultiheadAttention`` with attention dropout, then an
``eqx.nn.Dropout``) and its feed-forward block (a GELU MLP and an ``eqx.nn.Dropout``, one key per position under
``vmap``, as the example does). The train step is ``eqx.filter_jit`` over ``(model, opt_state, tokens, labels,
key)``: one key per example (``split(key, BATCH)`` under ``vmap``), adam, and the key split for the next step.

``variant`` says what the encoder does with its layers' key:

* ``split``: ``cl_key, l_key = split(l_key)`` before each layer, as the example does (every layer its own key);
* ``unsplit``: every layer is given ``l_key`` itself (wrong: each layer splits the same key the same way, so every
  layer drops the same units; jax's key-reuse checker rejects it).
"""

from __future__ import annotations

import os

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

VARIANTS = ("split", "unsplit")
VOCAB, WIDTH, HEADS, SEQ, BATCH, CLASSES, LAYERS, RATE = 32, 16, 2, 8, 2, 3, 2, 0.1


class AttentionBlock(eqx.Module):
    attention: eqx.nn.MultiheadAttention
    layernorm: eqx.nn.LayerNorm
    dropout: eqx.nn.Dropout

    def __init__(self, key):
        self.attention = eqx.nn.MultiheadAttention(HEADS, WIDTH, dropout_p=RATE, key=key)
        self.layernorm = eqx.nn.LayerNorm(WIDTH)
        self.dropout = eqx.nn.Dropout(RATE)

    def __call__(self, inputs, mask, enable_dropout, key):
        attention_key, dropout_key = jax.random.split(key)
        out = self.attention(inputs, inputs, inputs, mask=mask, inference=not enable_dropout, key=attention_key)
        out = self.dropout(out, inference=not enable_dropout, key=dropout_key)
        return jax.vmap(self.layernorm)(out + inputs)


class FeedForwardBlock(eqx.Module):
    mlp: eqx.nn.Linear
    output: eqx.nn.Linear
    layernorm: eqx.nn.LayerNorm
    dropout: eqx.nn.Dropout

    def __init__(self, key):
        mlp_key, output_key = jax.random.split(key)
        self.mlp = eqx.nn.Linear(WIDTH, 4 * WIDTH, key=mlp_key)
        self.output = eqx.nn.Linear(4 * WIDTH, WIDTH, key=output_key)
        self.layernorm = eqx.nn.LayerNorm(WIDTH)
        self.dropout = eqx.nn.Dropout(RATE)

    def __call__(self, inputs, enable_dropout, key):
        out = self.output(jax.nn.gelu(self.mlp(inputs)))
        out = self.dropout(out, inference=not enable_dropout, key=key)
        return self.layernorm(out + inputs)


class TransformerLayer(eqx.Module):
    attention_block: AttentionBlock
    ff_block: FeedForwardBlock

    def __init__(self, key):
        attention_init, ff_init = jax.random.split(key)
        self.attention_block = AttentionBlock(attention_init)
        self.ff_block = FeedForwardBlock(ff_init)

    def __call__(self, inputs, mask, *, enable_dropout, key):
        attention_key, ff_key = jax.random.split(key)
        out = self.attention_block(inputs, mask, enable_dropout, attention_key)
        ff_keys = jax.random.split(ff_key, num=inputs.shape[0])
        return jax.vmap(self.ff_block, in_axes=(0, None, 0))(out, enable_dropout, ff_keys)


class Encoder(eqx.Module):
    embedder: eqx.nn.Embedding
    embed_dropout: eqx.nn.Dropout
    layers: list
    head: eqx.nn.Linear
    variant: str = eqx.field(static=True)

    def __init__(self, variant: str, key):
        embed_key, head_key, *layer_keys = jax.random.split(key, LAYERS + 2)
        self.embedder = eqx.nn.Embedding(VOCAB, WIDTH, key=embed_key)
        self.embed_dropout = eqx.nn.Dropout(RATE)
        self.layers = [TransformerLayer(k) for k in layer_keys]
        self.head = eqx.nn.Linear(WIDTH, CLASSES, key=head_key)
        self.variant = variant

    def __call__(self, tokens, *, enable_dropout, key):
        embed_key, l_key = jax.random.split(key)
        x = self.embed_dropout(jax.vmap(self.embedder)(tokens), inference=not enable_dropout, key=embed_key)
        mask = (tokens != 0)[None, :] & (tokens != 0)[:, None]
        for layer in self.layers:
            if self.variant == "split":
                cl_key, l_key = jax.random.split(l_key)
            else:  # the regression: the layers' key handed on as it is
                cl_key = l_key
            x = layer(x, mask, enable_dropout=enable_dropout, key=cl_key)
        return self.head(x[0])


optim = optax.adam(1e-3)


def loss(model, tokens, labels, key):
    keys = jax.random.split(key, tokens.shape[0])
    logits = jax.vmap(lambda t, k: model(t, enable_dropout=True, key=k))(tokens, keys)
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, labels))


@eqx.filter_jit(donate="all-except-first")
def make_step(model, opt_state, tokens, labels, key):
    key, new_key = jax.random.split(key)
    value, grads = eqx.filter_value_and_grad(loss)(model, tokens, labels, key)
    updates, opt_state = optim.update(grads, opt_state, eqx.filter(model, eqx.is_array))
    return eqx.apply_updates(model, updates), opt_state, value, new_key


def inputs(variant: str):
    """(model, opt_state, tokens, labels, key): one step's arguments."""
    model = Encoder(variant, jax.random.PRNGKey(0))
    tokens = (jnp.arange(BATCH * SEQ, dtype=jnp.int32).reshape(BATCH, SEQ) % (VOCAB - 1)) + 1
    return model, optim.init(eqx.filter(model, eqx.is_array)), tokens, jnp.arange(BATCH) % CLASSES, \
        jax.random.PRNGKey(1)


def lower(variant: str) -> jax.stages.Lowered:
    return make_step.lower(*inputs(variant))


def target(cell) -> jax.stages.Lowered:
    """A callable target: the variant is ``STEP_VARIANT``'s (an edit to the model without another cell: what the gate
    must see against the golden)."""
    return lower(os.environ.get("STEP_VARIANT", "split"))
