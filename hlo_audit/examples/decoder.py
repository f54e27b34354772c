"""A callable target: the seeds' pair as a small llama-like Flax NNX decoder, trained with adamw, scanned or unrolled.

Use it as ``target = "hlo_audit.examples.decoder:lower"``. The cell's ``quant`` is the variant: ``none`` (no RNG
state) or ``leak``, the seeds' pattern: per layer two ``nnx.Dropout(0.0)`` that never draw, and each of the layer's 7
projections holding a forked one-stream ``nnx.Rngs`` that it calls every step, throwing the key away (as MaxText's
quantization bridge did): 9 (key, count) pairs, 18 state leaves and 7 counter increments per layer and step. The
model is the caller: ``nnxjit`` traces ``nnx.jit(train_step)(model, optimizer, tokens)``, what NNX users call;
``jaxjit`` the functional ``jax.jit(train_step)(params, rest, opt_state, tokens)``. Both donate the state.
``cell.overrides`` may set ``d``, ``heads``, ``ffn``, ``vocab`` (defaults: a toy size for CPU tests); ``cell.batch``
and ``cell.seq`` are the batch (tokens are ``seq + 1`` long: inputs and next-token labels).
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from hlo_audit import Unavailable

VARIANTS = ("none", "leak")
CALLERS = ("nnxjit", "jaxjit")
COMPUTE = jnp.bfloat16
PROJECTIONS = ("q", "k", "v", "o", "gate", "up", "down")


@dataclass(frozen=True)
class Size:
    d: int = 64
    heads: int = 4
    ffn: int = 128
    vocab: int = 256
    layers: int = 2


class Projection(nnx.Module):
    """A bias-free linear; with ``leak``, a forked stream it advances each call and never uses."""

    def __init__(self, d_in: int, d_out: int, leak: bool, rngs: nnx.Rngs):
        self.linear = nnx.Linear(d_in, d_out, use_bias=False, dtype=COMPUTE, rngs=rngs,
                                 kernel_init=nnx.initializers.normal(0.02))
        self.stream = nnx.Rngs(params=rngs.params()) if leak else None

    def __call__(self, x):
        if self.stream is not None:
            self.stream.params()  # the counter moves; the key is dropped
        return self.linear(x)


class Norm(nnx.Module):
    def __init__(self, d: int):
        self.scale = nnx.Param(jnp.ones((d,), jnp.float32))

    def __call__(self, x):
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + 1e-6)
        return (normed * self.scale[...]).astype(COMPUTE)


class Layer(nnx.Module):
    def __init__(self, size: Size, leak: bool, rngs: nnx.Rngs):
        self.heads = size.heads
        self.attention_norm, self.mlp_norm = Norm(size.d), Norm(size.d)
        shapes = {"q": (size.d, size.d), "k": (size.d, size.d), "v": (size.d, size.d), "o": (size.d, size.d),
                  "gate": (size.d, size.ffn), "up": (size.d, size.ffn), "down": (size.ffn, size.d)}
        for name in PROJECTIONS:
            setattr(self, name, Projection(*shapes[name], leak, rngs))
        self.dropouts = nnx.List([nnx.Dropout(0.0, rngs=nnx.Rngs(dropout=rngs.params())) for _ in range(2)]
                                 if leak else [])

    def _drop(self, i: int, x):
        return self.dropouts[i](x) if len(self.dropouts) else x

    def __call__(self, x):
        b, s, d = x.shape
        per_head = d // self.heads
        y = self.attention_norm(x)
        q, k, v = (getattr(self, n)(y).reshape(b, s, self.heads, per_head) for n in ("q", "k", "v"))
        logits = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) / jnp.sqrt(jnp.float32(per_head))
        logits = jnp.where(jnp.tril(jnp.ones((s, s), bool)), logits, -1e30)
        attended = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(logits, axis=-1).astype(COMPUTE), v)
        x = x + self._drop(0, self.o(attended.reshape(b, s, d)))
        y = self.mlp_norm(x)
        return x + self._drop(1, self.down(jax.nn.silu(self.gate(y)) * self.up(y)))


class Decoder(nnx.Module):
    def __init__(self, size: Size, scan: bool, leak: bool, rngs: nnx.Rngs):
        self.scan = scan
        self.embed = nnx.Embed(size.vocab, size.d, dtype=COMPUTE, rngs=rngs)
        if scan:
            @nnx.split_rngs(splits=size.layers)
            @nnx.vmap(in_axes=(0,), out_axes=0)
            def stacked(r: nnx.Rngs):
                return Layer(size, leak, r)
            self.layers = stacked(rngs)
        else:
            self.layers = nnx.List([Layer(size, leak, rngs) for _ in range(size.layers)])
        self.norm = Norm(size.d)
        self.head = nnx.Linear(size.d, size.vocab, use_bias=False, dtype=COMPUTE, rngs=rngs)

    def __call__(self, tokens):
        x = self.embed(tokens)
        if self.scan:
            @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
            def forward(h, layer):
                return layer(h)
            x = forward(x, self.layers)
        else:
            for layer in self.layers:
                x = layer(x)
        return self.head(self.norm(x))


def loss_of(model: Decoder, tokens):
    logits = model(tokens[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), tokens[:, 1:]).mean()


def size_of(cell) -> Size:
    overrides = dict(cell.overrides)
    return Size(**{k: int(overrides[k]) for k in ("d", "heads", "ffn", "vocab") if k in overrides},
                layers=cell.layers)


def build(size: Size, scan: bool, leak: bool):
    model = Decoder(size, scan, leak, nnx.Rngs(params=0))
    return model, nnx.Optimizer(model, optax.adamw(1e-4), wrt=nnx.Param)


def nnx_jit_step(model, optimizer, tokens):
    loss, grads = nnx.value_and_grad(loss_of)(model, tokens)
    optimizer.update(model, grads)
    return loss


def functional_step(graphdef, opt_graphdef):
    """``train_step(params, rest, opt_state, tokens) -> (params, rest, opt_state, loss)`` for ``jax.jit``."""

    def train_step(params, rest, opt_state, tokens):
        model = nnx.merge(graphdef, params, rest)
        optimizer = nnx.merge(opt_graphdef, opt_state)
        loss, grads = nnx.value_and_grad(loss_of)(model, tokens)
        optimizer.update(model, grads)
        _, params, rest = nnx.split(model, nnx.Param, ...)
        return params, rest, nnx.state(optimizer), loss

    return train_step


def lower(cell):
    """The cell's train step, traced from abstract shapes: ``nnx.jit``'s (model ``nnxjit``) or ``jax.jit``'s."""
    if cell.quant not in VARIANTS:
        raise Unavailable(f"decoder has no variant {cell.quant!r} (it knows {', '.join(VARIANTS)})")
    if cell.model not in CALLERS:
        raise Unavailable(f"decoder has no caller {cell.model!r} (it knows {', '.join(CALLERS)})")
    size = size_of(cell)
    model, optimizer = nnx.eval_shape(lambda: build(size, cell.scan, cell.quant == "leak"))
    tokens = jax.ShapeDtypeStruct((cell.batch, cell.seq + 1), jnp.int32)
    if cell.model == "nnxjit":
        return nnx.jit(nnx_jit_step, donate_argnums=(0, 1)).trace(model, optimizer, tokens)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    opt_graphdef, opt_state = nnx.split(optimizer)
    step = jax.jit(functional_step(graphdef, opt_graphdef), donate_argnums=(0, 1, 2))
    return step.trace(params, rest, opt_state, tokens)


lower.full_depth = {"nnxjit": 16, "jaxjit": 16}
lower.quant = VARIANTS
