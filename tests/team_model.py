"""A team's own small Flax NNX model and its donated ``jax.jit`` train step, with the changes a pull request makes.

Plain module (no pytest import). The model is what a team with its own model gates: a stack of blocks (RMSNorm,
an ``up`` / ``down`` MLP in bfloat16, a small fixed-point refinement loop), each block rematerialized with
``nnx.remat``; the step is ``jax.jit(train_step, donate_argnums=0)`` over ``nnx.split`` state of the model and an
``nnx.Optimizer`` (adam), returning the new state and the loss. ``Variant`` is one pull request's change:

* ``donate=False``: the step no longer donates its state (the header's ``input_output_alias`` goes);
* ``debug_print``: a ``jax.debug.print`` of the loss in the step (a host callback);
* ``f32_up``: the ``up`` projection computed in float32 instead of bfloat16;
* ``remat=False``: no ``nnx.remat`` around the blocks;
* ``unroll=8``: the refinement loop (8 steps of ``lax.fori_loop``) unrolled 8x;
* ``up_name="up_proj"``: the ``up`` weight attribute renamed;
* ``fork_rngs``: every block keeps ``self.rngs = rngs.fork()``, never drawn (the seed-000 leak);
* ``bias``: the projections gain a bias;
* ``lr=2e-3``: the optimizer's learning rate doubled (a constant of the step: the constants rule's).

``lower(variant)`` lowers from abstract state (nothing allocated) and returns the HLO text; ``target(cell)`` is
the same as a callable target (``cell.quant`` names the variant: ``base`` or one of ``VARIANTS``).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import optax
from flax import nnx

WIDTH, HIDDEN, BATCH = 16, 32, 4


@dataclasses.dataclass(frozen=True)
class Variant:
    layers: int = 2
    scan: bool = False
    donate: bool = True
    debug_print: bool = False
    f32_up: bool = False
    remat: bool = True
    unroll: int = 1
    up_name: str = "up"
    fork_rngs: bool = False
    bias: bool = False
    lr: float = 1e-3


# One pull request's change each, on the base model.
VARIANTS = {
    "donation_removed": Variant(donate=False),
    "debug_print": Variant(debug_print=True),
    "f32_up": Variant(f32_up=True),
    "remat_removed": Variant(remat=False),
    "unrolled_8x": Variant(unroll=8),
    "up_renamed": Variant(up_name="up_proj"),
    "forked_rngs": Variant(fork_rngs=True),
    "bias": Variant(bias=True),
    "lr_up": Variant(lr=2e-3),
}


class Block(nnx.Module):
    def __init__(self, variant: Variant, rngs: nnx.Rngs):
        self.variant = variant
        self.norm = nnx.RMSNorm(WIDTH, rngs=rngs)
        up_dtype = jnp.float32 if variant.f32_up else jnp.bfloat16
        setattr(self, variant.up_name, nnx.Linear(WIDTH, HIDDEN, use_bias=variant.bias, dtype=up_dtype, rngs=rngs))
        self.down = nnx.Linear(HIDDEN, WIDTH, use_bias=variant.bias, dtype=jnp.bfloat16, rngs=rngs)
        if variant.fork_rngs:
            self.rngs = rngs.fork()

    def __call__(self, x):
        h = getattr(self, self.variant.up_name)(self.norm(x))
        h = nnx.gelu(h).astype(jnp.bfloat16)
        # A small fixed-point refinement: 8 steps of a loop (unroll=8 writes them out).
        h = jax.lax.fori_loop(0, 8, lambda _, v: v * 0.5 + jnp.tanh(v) * 0.5, h, unroll=self.variant.unroll)
        return x + self.down(h).astype(x.dtype)


class Model(nnx.Module):
    def __init__(self, variant: Variant, rngs: nnx.Rngs):
        self.variant = variant
        self.blocks = nnx.List([Block(variant, rngs) for _ in range(variant.layers)])

    def __call__(self, x):
        for block in self.blocks:
            if self.variant.remat:
                x = nnx.remat(lambda b, h: b(h))(block, x)
            else:
                x = block(x)
        return x


def _build(variant: Variant):
    model = Model(variant, nnx.Rngs(0))
    return model, nnx.Optimizer(model, optax.adam(variant.lr), wrt=nnx.Param)


def traced(variant: Variant):
    """The step traced from abstract state (a jax ``Traced``, as a callable target returns it)."""
    model, optimizer = nnx.eval_shape(lambda: _build(variant))
    graphdef, state = nnx.split((model, optimizer))
    x = jax.ShapeDtypeStruct((BATCH, WIDTH), jnp.float32)

    def train_step(state, x):
        model, optimizer = nnx.merge(graphdef, state)

        def loss_fn(m):
            y = m(x)
            return jnp.mean(y * y)

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        if variant.debug_print:
            jax.debug.print("loss {}", loss)
        return nnx.state((model, optimizer)), loss

    return jax.jit(train_step, donate_argnums=0 if variant.donate else ()).trace(state, x)


@functools.lru_cache(maxsize=None)
def lower(variant: Variant = Variant(), debug_info: bool = True) -> str:
    """Pre-optimization HLO text of the variant's step for the CPU (jax's caches cleared first, so the text is a
    function of the variant alone). ``debug_info``: with jax's source locations (its debug tables and each
    instruction's op_name and stack frame), as ``--xla_dump_to`` dumps it."""
    jax.clear_caches()
    return traced(variant).lower(lowering_platforms=("cpu",)).as_text(dialect="hlo", debug_info=debug_info)


def target(cell):
    """A callable target: ``cell.quant`` is ``base`` or a name of ``VARIANTS``, ``cell.layers`` the depth."""
    variant = VARIANTS.get(cell.quant, Variant())
    return traced(dataclasses.replace(variant, layers=cell.layers))


target.full_depth = {"team": 8}
