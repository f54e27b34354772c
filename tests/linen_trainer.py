"""Train steps whose RNG key lives in their state, written as users of Flax linen and plain JAX write them.

Plain module (no pytest import), used by tests. None of these keeps an NNX ``Rngs``: the key is a field of a
``flax.training.train_state.TrainState`` subclass, the ``rngs`` argument linen's ``apply`` takes, or a leaf of a
plain pytree, and nothing but what the step does with it says it is a key.

``TrainerSpec`` picks one:

* ``framework="linen"``: an MLP with ``nn.Dropout(rate=0.0)`` and ``nn.Dropout(0.1)``, trained with a ``TrainState``
  subclass that holds the key in a field (``field``: ``key``; ``rng`` or ``noise``, harmless renames), adam;
  ``framework="jax"``: the same MLP by hand (dropout by ``jax.random.bernoulli``), its state a dict
  ``{"params", <field>}``, SGD;
* ``use``: what the step does with the key each step: ``fold_in`` (``dropout_key = fold_in(state.key,
  state.step)``, the key kept as it is), ``split`` (``key, dropout_key = split(state.key)``, the new key kept),
  ``bits`` (``jax.random.bits`` of a split, the mask by hand: plain JAX only), ``carried`` (split and kept, but
  only rate-0 dropouts: no draw reaches an output), ``kept`` (never touched, only rate-0 dropouts: the state
  hands it back as it came), ``rngs`` (linen only: the step takes ``rngs`` as
  ``apply`` does, ``{"dropout": ..., "noise": ...}``, draws from ``dropout``, splits ``noise`` and returns both
  split, not donated);
* ``key``: ``raw`` (``jax.random.PRNGKey``: ``u32[2]``), ``typed`` (``jax.random.key``), ``rbg_raw`` (an rbg key's
  ``u32[4]`` data, wrapped in the step) or ``rbg`` (``jax.random.key(0, impl="rbg")``).

The step is jitted with the state donated: ``step(state, x, y) -> (state, loss)`` (``rngs``: ``step(state, x, y,
rngs) -> (state, loss, rngs)``). ``expected(spec)`` is what it does with each key, by construction: the numerical
oracle (rng_oracle.trainer_case) checks it, and the analysis is tested against both.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training import train_state

FRAMEWORKS = ("linen", "jax")
USES = ("fold_in", "split", "bits", "carried", "kept", "rngs")
KEYS = ("raw", "typed", "rbg_raw", "rbg")
FIELDS = ("key", "rng", "noise")
BATCH, FEATURES, WIDTH = 8, 3, 32  # enough units that a rate-0.1 dropout drops some whatever the key


@dataclasses.dataclass(frozen=True)
class TrainerSpec:
    framework: str = "linen"
    use: str = "split"
    key: str = "raw"
    field: str = "key"

    def __post_init__(self):
        if (self.framework not in FRAMEWORKS or self.use not in USES or self.key not in KEYS
                or self.field not in FIELDS or (self.use, self.framework) in (("rngs", "jax"), ("bits", "linen"))):
            raise ValueError(f"no such trainer: {self}")

    @property
    def name(self) -> str:
        return "_".join([self.framework, self.use, self.key, self.field])

    @property
    def impl(self) -> str:
        return "rbg" if self.key.startswith("rbg") else "threefry2x32"


def expected(spec: TrainerSpec) -> dict[str, str]:
    """Stream path -> verdict, by construction."""
    if spec.use == "rngs":
        return {"rngs.dropout": "drawn", "rngs.noise": "carried"}
    return {f"state.{spec.field}": "carried" if spec.use in ("carried", "kept") else "drawn"}


def _new_key(spec: TrainerSpec, seed: int):
    """A key of the spec's kind, as the state holds it."""
    key = jax.random.key(seed, impl=spec.impl)
    return jax.random.key_data(key) if spec.key in ("raw", "rbg_raw") else key


def _typed(spec: TrainerSpec, key):
    """The key as jax.random takes it: a raw rbg key's data must be wrapped (a raw threefry key is taken as is)."""
    return jax.random.wrap_key_data(key, impl="rbg") if spec.key == "rbg_raw" else key


def _raw(spec: TrainerSpec, key):
    """A key back in the state's form."""
    return jax.random.key_data(key) if spec.key == "rbg_raw" else key


class MLP(nn.Module):
    """Two dense layers, one dropout at rate 0 and one at 0.1 (both at 0 for ``carried``)."""

    rate: float = 0.1

    @nn.compact
    def __call__(self, x, train: bool):
        x = nn.Dense(WIDTH)(x)
        x = nn.Dropout(rate=0.0)(x, deterministic=not train)
        x = nn.relu(x)
        x = nn.Dropout(self.rate)(x, deterministic=not train)
        return nn.Dense(1)(x)


class KeyedState(train_state.TrainState):
    key: jax.Array


class RngState(train_state.TrainState):
    rng: jax.Array


class NoiseState(train_state.TrainState):
    noise: jax.Array


_STATES = {"key": KeyedState, "rng": RngState, "noise": NoiseState}


def batch() -> tuple[jax.Array, jax.Array]:
    x = np.linspace(-1.0, 2.0, BATCH * FEATURES, dtype=np.float32).reshape(BATCH, FEATURES)
    return jnp.asarray(x), jnp.asarray(np.sin(x).sum(axis=1, keepdims=True))


def initial_args(spec: TrainerSpec) -> tuple:
    """The step's arguments: ``(state, x, y)`` (and ``rngs`` for ``use="rngs"``), from fixed seeds."""
    x, y = batch()
    if spec.framework == "linen":
        model = MLP(rate=0.0 if spec.use in ("carried", "kept") else 0.1)
        params = model.init(jax.random.PRNGKey(0), x, train=False)["params"]
        if spec.use == "rngs":  # the keys are the step's argument: the state holds none
            state = train_state.TrainState.create(apply_fn=model.apply, params=params, tx=optax.adam(1e-2))
        else:
            state = _STATES[spec.field].create(apply_fn=model.apply, params=params, tx=optax.adam(1e-2),
                               **{spec.field: _new_key(spec, 1)})
    else:
        w = np.linspace(-0.5, 0.5, FEATURES * WIDTH, dtype=np.float32).reshape(FEATURES, WIDTH)
        params = {"hidden": jnp.asarray(w), "out": jnp.ones((WIDTH, 1), jnp.float32)}
        state = {"params": params, spec.field: _new_key(spec, 1)}
    if spec.use == "rngs":
        return state, x, y, {"dropout": _new_key(spec, 2), "noise": _new_key(spec, 3)}
    return state, x, y


def _linen_step(spec: TrainerSpec):
    def loss_of(state, params, x, y, rngs):
        out = state.apply_fn({"params": params}, x, train=True, rngs=rngs)
        return jnp.mean((out - y) ** 2)

    if spec.use == "rngs":
        def step(state, x, y, rngs):
            loss, grads = jax.value_and_grad(lambda p: loss_of(state, p, x, y, {"dropout": _typed(spec, rngs["dropout"])}))(
                state.params)
            after = {name: _raw(spec, jax.random.split(_typed(spec, key))[0]) for name, key in rngs.items()}
            return state.apply_gradients(grads=grads), loss, after

        return step

    def step(state, x, y):
        key = _typed(spec, getattr(state, spec.field))
        if spec.use == "fold_in":
            dropout_key, new_key = jax.random.fold_in(key, state.step), key
        elif spec.use == "kept":
            dropout_key, new_key = None, key
        else:
            new_key, dropout_key = jax.random.split(key)
        rngs = {} if dropout_key is None else {"dropout": dropout_key}
        loss, grads = jax.value_and_grad(lambda p: loss_of(state, p, x, y, rngs))(state.params)
        return state.apply_gradients(grads=grads, **{spec.field: _raw(spec, new_key)}), loss

    return step


def _jax_step(spec: TrainerSpec):
    def forward(params, x, key):
        h = jax.nn.relu(x @ params["hidden"])
        if key is not None:  # dropout at 0.1, by hand
            if spec.use == "bits":
                keep = jax.random.bits(key, h.shape, jnp.uint32) > jnp.uint32(0.1 * 2**32)
            else:
                keep = jax.random.bernoulli(key, 0.9, h.shape)
            h = jnp.where(keep, h / 0.9, 0.0)
        return h @ params["out"]

    def step(state, x, y):
        key = _typed(spec, state[spec.field])
        if spec.use == "fold_in":
            dropout_key, new_key = jax.random.fold_in(key, 7), key
        elif spec.use == "kept":
            dropout_key, new_key = None, key
        else:
            new_key, dropout_key = jax.random.split(key)
        if spec.use == "carried":
            dropout_key = None

        def loss_of(params):
            return jnp.mean((forward(params, x, dropout_key) - y) ** 2)

        loss, grads = jax.value_and_grad(loss_of)(state["params"])
        params = jax.tree.map(lambda w, g: w - 0.1 * g, state["params"], grads)
        return {"params": params, spec.field: _raw(spec, new_key)}, loss

    return step


def make_step(spec: TrainerSpec):
    return _linen_step(spec) if spec.framework == "linen" else _jax_step(spec)


def jitted(spec: TrainerSpec):
    """The step, jitted with its state donated (as real train steps are)."""
    return jax.jit(make_step(spec), donate_argnums=0)


def lower(spec: TrainerSpec) -> jax.stages.Lowered:
    """The jitted step lowered for the CPU (jax's caches cleared first, as nnx_models.lower does)."""
    jax.clear_caches()
    return jitted(spec).trace(*initial_args(spec)).lower(lowering_platforms=("cpu",))


def traced(spec: TrainerSpec) -> jax.stages.Traced:
    return jitted(spec).trace(*initial_args(spec))


def target(cell) -> jax.stages.Traced:
    """A callable target (``target = "linen_trainer:target"``): ``cell.model`` names the spec,
    ``<framework>-<use>-<key>-<field>`` (``linen-split-raw-key``)."""
    framework, use, key, field = cell.model.split("-")
    return traced(TrainerSpec(framework, use, key, field))
