"""An equinox user's train step, as equinox's docs write one: an ``eqx.Module`` model, ``eqx.filter_jit`` (or
``eqx.filter_pmap``) over ``(model, opt_state, x, y)``, ``optax.adam``, ``eqx.apply_updates``. The model argument
is called ``net``, a name nothing in hlo-audit knows: its leaves are weights only by what the step does with them.

``cell.quant`` picks a variant: ``base``; ``reordered``, the blocks' fields declared in another order (the same
program); ``frozen``, the first block left out of the gradient by a wrong ``eqx.partition`` filter; ``pmap``, the
base step under ``filter_pmap``; ``dict``, a haiku-style step: ``jax.jit`` over a dict of dicts of params, with
a dropout key (a raw ``u32[2]`` argument called ``rng``) folded per layer; ``remat``, each block checkpointed;
``remat_wide``, that and 12 elementwise layers besides; ``l2``, an L2 penalty added to the loss; ``cut``, a
``stop_gradient`` after the first block; ``print``, a ``jax.debug.print`` of each block's sum.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

WIDTH, IN, OUT, BATCH = 16, 8, 4, 2


class Block(eqx.Module):
    lin1: eqx.nn.Linear
    lin2: eqx.nn.Linear

    def __call__(self, x):
        return x + self.lin2(jax.nn.relu(self.lin1(x)))


class ReorderedBlock(eqx.Module):  # Block with its fields declared the other way round
    lin2: eqx.nn.Linear
    lin1: eqx.nn.Linear

    def __call__(self, x):
        return x + self.lin2(jax.nn.relu(self.lin1(x)))


class Model(eqx.Module):
    embed: eqx.nn.Linear
    layers: list
    head: eqx.nn.Linear

    def __call__(self, x):
        x = self.embed(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def build(layers: int, block=Block) -> Model:
    keys = jax.random.split(jax.random.PRNGKey(0), 2 * layers + 2)
    blocks = [block(lin1=eqx.nn.Linear(WIDTH, WIDTH, key=keys[2 + 2 * i]),
                    lin2=eqx.nn.Linear(WIDTH, WIDTH, key=keys[3 + 2 * i])) for i in range(layers)]
    return Model(eqx.nn.Linear(IN, WIDTH, key=keys[0]), blocks, eqx.nn.Linear(WIDTH, OUT, key=keys[1]))


optim = optax.adam(1e-3)


def loss(net, x, y):
    return jnp.mean((jax.vmap(net)(x) - y) ** 2)


@eqx.filter_jit(donate="all-except-first")
def make_step(net, opt_state, x, y):
    value, grads = eqx.filter_value_and_grad(loss)(net, x, y)
    updates, opt_state = optim.update(grads, opt_state, eqx.filter(net, eqx.is_array))
    return eqx.apply_updates(net, updates), opt_state, value


def remat_loss(net, x, y, extra: int = 0):
    """``loss`` with each block checkpointed (``eqx.filter_checkpoint``) and, with ``extra``, that many elementwise
    layers of the model's own beside it (work no other rule names)."""
    def forward(x):
        h = net.embed(x)
        for block in net.layers:
            h = eqx.filter_checkpoint(lambda b, h: b(h))(block, h)
        for _ in range(extra):
            h = jnp.sin(h) * 1.01
        return net.head(h)
    return jnp.mean((jax.vmap(forward)(x) - y) ** 2)


def l2_loss(net, x, y):
    """``loss`` with an L2 penalty on every weight."""
    return loss(net, x, y) + 1e-4 * sum(jnp.sum(w ** 2) for w in jax.tree.leaves(eqx.filter(net, eqx.is_array)))


def step_of(loss_fn):
    """``make_step`` over another loss."""
    @eqx.filter_jit(donate="all-except-first")
    def step(net, opt_state, x, y):
        value, grads = eqx.filter_value_and_grad(loss_fn)(net, x, y)
        updates, opt_state = optim.update(grads, opt_state, eqx.filter(net, eqx.is_array))
        return eqx.apply_updates(net, updates), opt_state, value
    return step


def cut_loss(net, x, y):
    """``loss`` with ``stop_gradient`` after the first block: the embedding and that block train no more."""
    def forward(x):
        h = jax.lax.stop_gradient(net.layers[0](net.embed(x)))
        for block in net.layers[1:]:
            h = block(h)
        return net.head(h)
    return jnp.mean((jax.vmap(forward)(x) - y) ** 2)


def printing_loss(net, x, y):
    """``loss`` printing each block's output sum (per example, under vmap): what it computes to print is the
    callback's."""
    def forward(x):
        h = net.embed(x)
        for block in net.layers:
            h = block(h)
            jax.debug.print("block {}", h.sum())
        return net.head(h)
    return jnp.mean((jax.vmap(forward)(x) - y) ** 2)


STEPS = {"remat": step_of(remat_loss), "remat_wide": step_of(lambda net, x, y: remat_loss(net, x, y, extra=12)),
         "l2": step_of(l2_loss), "cut": step_of(cut_loss),
         "print": step_of(printing_loss)}


def _trainable(net: Model):
    """A filter meant to train every block, that leaves the first one out (an off-by-one in the spec)."""
    spec = jax.tree.map(eqx.is_array, net)
    return eqx.tree_at(lambda m: m.layers[0], spec, replace=jax.tree.map(lambda _: False, net.layers[0]))


@eqx.filter_jit(donate="all-except-first")
def frozen_step(net, opt_state, x, y):
    trained, frozen = eqx.partition(net, _trainable(net))
    value, grads = eqx.filter_value_and_grad(lambda t, x, y: loss(eqx.combine(t, frozen), x, y))(trained, x, y)
    updates, opt_state = optim.update(grads, opt_state, trained)
    return eqx.apply_updates(net, updates), opt_state, value


@eqx.filter_pmap(axis_name="batch")
def pmap_step(net, opt_state, x, y):
    value, grads = eqx.filter_value_and_grad(loss)(net, x, y)
    grads = jax.lax.pmean(grads, "batch")
    updates, opt_state = optim.update(grads, opt_state, eqx.filter(net, eqx.is_array))
    return eqx.apply_updates(net, updates), opt_state, value


def _dict_params(layers: int) -> dict:
    keys = jax.random.split(jax.random.PRNGKey(0), layers + 1)
    params = {f"layer_{i}": {"w": jax.random.normal(keys[i], (WIDTH, WIDTH)), "b": jnp.zeros(WIDTH)}
              for i in range(layers)}
    params["embed"] = {"w": jax.random.normal(keys[-1], (IN, WIDTH)), "b": jnp.zeros(WIDTH)}
    return params


def _dict_forward(p, x, rng):
    h = x @ p["embed"]["w"] + p["embed"]["b"]
    for i, name in enumerate(sorted(k for k in p if k.startswith("layer_"))):
        keep = jax.random.bernoulli(jax.random.fold_in(rng, i), 0.9, h.shape)  # dropout, a mask per layer
        h = h + jnp.where(keep, jax.nn.relu(h @ p[name]["w"] + p[name]["b"]) / 0.9, 0)
    return h


def dict_step(p, opt_state, x, y, rng):
    value, grads = jax.value_and_grad(lambda p: jnp.mean((_dict_forward(p, x, rng)[:, :OUT] - y) ** 2))(p)
    updates, opt_state = optim.update(grads, opt_state, p)
    return optax.apply_updates(p, updates), opt_state, value


def _replicated(tree):
    return jax.tree.map(lambda a: a[None] if eqx.is_array(a) else a, tree)


def lower(cell):
    layers = cell.layers or 2
    x, y = jnp.ones((BATCH, IN)), jnp.ones((BATCH, OUT))
    if cell.quant == "dict":
        params = _dict_params(layers)
        return jax.jit(dict_step, donate_argnums=(0, 1)).lower(params, optim.init(params), x, y,
                                                               jax.random.PRNGKey(1))
    net = build(layers, ReorderedBlock if cell.quant == "reordered" else Block)
    # The optimizer's state is for what the step trains (the frozen variant's filter leaves a block out of both).
    opt_state = optim.init(eqx.partition(net, _trainable(net))[0] if cell.quant == "frozen" else
                           eqx.filter(net, eqx.is_array))
    if cell.quant == "pmap":
        return pmap_step.lower(_replicated(net), _replicated(opt_state), x[None], y[None])
    step = frozen_step if cell.quant == "frozen" else STEPS.get(cell.quant, make_step)
    return step.lower(net, opt_state, x, y)


lower.full_depth = {"eqx": 2}
