"""Small real train steps whose RNG state goes through each of XLA's pass-through constructs.

Plain module (no pytest import), used by tests. Each step runs ``LAYERS`` layers of two dropouts and a matmul,
``y = act(drop(drop(x) @ w))``, takes the gradient of ``sum(y)`` and returns ``(new_state, loss)``. Every mask is
drawn from an RNG stream (an NNX-style ``{"key", "count"}`` pair under ``.rngs``, drawn as NNX draws:
``fold_in(key, count)``, then ``count + 1``) inside one construct:

* ``remat``: each layer is ``jax.checkpoint``-ed, so its backward pass recomputes it from an ``opt-barrier``
  tuple that holds the layer's inputs, its streams' keys and counts among them (MaxText's unrolled decoder);
* ``barrier``: each layer first passes its input and streams (the idle one too) through one
  ``lax.optimization_barrier``, as MaxText does to order its all-gathers: an ``opt-barrier`` written by hand;
* ``fori_loop`` / ``scan``: the layers are one ``while`` loop over stacked weights, the streams in its state;
* ``cond``: each layer is a ``lax.cond`` on its input that draws in one branch: a ``conditional`` whose branch
  operands and results carry the streams;
* ``call``: each layer is a nested ``jax.jit``, a ``call`` taking the streams and returning their new counts (both
  layers call one computation).

How the step holds its RNG state (``rngs``):

* ``private``: each dropout its own stream, ``layers_<i>.first.rngs`` and ``layers_<i>.second.rngs`` (stacked as
  ``layers.first.rngs``, key ``[L]``, in the loops, as NNX's scan stacks them);
* ``shared``: one stream ``rngs`` for every dropout, its count advanced once per draw (seed 001's fix);
* ``private+idle``: ``private`` plus ``idle.rngs``, handed through the construct beside the drawn ones and
  advanced once per layer, never drawn (seed 000's dead state).

``private`` / ``shared`` / ``private+idle`` of one construct differ by RNG state only: the same masks are drawn
from other keys. ``activation="sin"`` changes the program itself, inside the construct.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

CONSTRUCTS = ("remat", "barrier", "fori_loop", "scan", "cond", "call")
RNG_STATES = ("private", "shared", "private+idle")
DRAWS = ("first", "second")  # the two dropouts of a layer
LAYERS = 2
WIDTH = 4
BATCH = 2
RATE = 0.5


@dataclasses.dataclass(frozen=True)
class StepSpec:
    construct: str
    rngs: str = "private"
    activation: str = "tanh"

    def __post_init__(self):
        if self.construct not in CONSTRUCTS or self.rngs not in RNG_STATES or self.activation not in ("tanh", "sin"):
            raise ValueError(f"no such step: {self}")

    @property
    def name(self) -> str:
        activation = [self.activation] if self.activation != "tanh" else []
        return "_".join([self.construct, self.rngs.replace("+", "_"), *activation])

    @property
    def stacked(self) -> bool:
        return self.construct in ("fori_loop", "scan")


def _stream(seed: int, shape: tuple[int, ...] = ()) -> dict:
    key = jax.random.key(seed)
    return {"key": jax.random.split(key, shape) if shape else key, "count": jnp.zeros(shape, jnp.uint32)}


def initial_state(spec: StepSpec) -> dict:
    """Weights and RNG streams, from fixed seeds."""
    weights = np.linspace(-1.0, 1.0, LAYERS * WIDTH * WIDTH, dtype=np.float32).reshape(LAYERS, WIDTH, WIDTH)
    if spec.stacked:
        layers = {"layers": {"w": jnp.asarray(weights)}}
    else:
        layers = {f"layers_{i}": {"w": jnp.asarray(weights[i])} for i in range(LAYERS)}
    if spec.rngs != "shared":
        for n, layer in enumerate(layers.values()):
            for d, draw in enumerate(DRAWS):
                layer[draw] = {"rngs": _stream(1 + 2 * n + d, (LAYERS,) if spec.stacked else ())}
    state = dict(layers)
    if spec.rngs == "shared":
        state["rngs"] = _stream(7)
    if spec.rngs == "private+idle":
        state["idle"] = {"rngs": _stream(9)}
    return state


def batch() -> jax.Array:
    return jnp.asarray(np.linspace(-1.0, 2.0, BATCH * WIDTH, dtype=np.float32).reshape(BATCH, WIDTH))


def _dropout(x, key, count):
    """A dropout mask drawn as an NNX stream draws: from ``fold_in(key, count)``."""
    keep = jax.random.bernoulli(jax.random.fold_in(key, count), 1.0 - RATE, x.shape)
    return jnp.where(keep, x / (1.0 - RATE), 0.0)


def _layer(spec: StepSpec, w, x, keys: tuple, counts: tuple, idle_count):
    """One layer: ``(y, new counts, new idle count)``. ``keys`` / ``counts``: one stream per dropout (private),
    or one stream for both (shared), advanced once per draw."""
    if len(keys) == 1:  # shared: the second draw takes the count the first one left
        (key,), (count,) = keys, counts
        after_first = count + 1
        draws, new_counts = [(key, count), (key, after_first)], (after_first + 1,)
    else:
        draws, new_counts = list(zip(keys, counts)), tuple(count + 1 for count in counts)
    h = _dropout(_dropout(x, *draws[0]) @ w, *draws[1])
    y = jnp.tanh(h) if spec.activation == "tanh" else jnp.sin(h)
    return y, new_counts, None if idle_count is None else idle_count + 1


def _unrolled(spec: StepSpec, params: dict, streams: dict, x):
    """The unrolled layers, each through the construct; returns the output and every stream's new count."""
    counts = {path: s["count"] for path, s in streams.items()}
    for i in range(LAYERS):
        paths = ("rngs",) if spec.rngs == "shared" else tuple(f"layers_{i}.{draw}.rngs" for draw in DRAWS)
        keys = tuple(streams[p]["key"] for p in paths)
        layer_counts = tuple(counts[p] for p in paths)
        idle = counts.get("idle.rngs")
        layer = lambda w, x, keys, layer_counts, idle: _layer(spec, w, x, keys, layer_counts, idle)  # noqa: E731
        if spec.construct == "remat":
            through = jax.checkpoint(layer)
        elif spec.construct == "barrier":
            through = lambda *operands: layer(*lax.optimization_barrier(operands))  # noqa: E731
        elif spec.construct == "call":
            through = jax.jit(layer)
        else:
            def skip(w, x, keys, layer_counts, idle):  # the branch that draws nothing
                h = x @ w
                return jnp.tanh(h) if spec.activation == "tanh" else jnp.sin(h), layer_counts, idle

            # A condition on the layer's input (so on the masks drawn before it) that holds for every input: the
            # oracle, which runs the step, sees each layer draw, as the analysis, which cannot know, assumes.
            through = lambda *operands: lax.cond(jnp.sum(operands[1] ** 2) >= 0, layer, skip, *operands)  # noqa: E731
        x, new_counts, new_idle = through(params[f"layers_{i}"], x, keys, layer_counts, idle)
        counts.update(zip(paths, new_counts))
        if idle is not None:
            counts["idle.rngs"] = new_idle
    return x, counts


def _loop(spec: StepSpec, params: dict, streams: dict, x):
    """The stacked layers as one while loop; private streams are stacked like the weights."""
    ws = params["layers"]
    shared = streams.get("rngs")
    stacked = [streams[f"layers.{draw}.rngs"] for draw in DRAWS] if shared is None else []
    idle = streams.get("idle.rngs")
    init_idle = None if idle is None else idle["count"]
    counts = {}
    if spec.construct == "scan":
        def body(carry, xs):
            h, count, idle_count = carry
            w, keys, layer_counts = xs
            if shared is not None:
                keys, layer_counts = (shared["key"],), (count,)
            h, new_counts, idle_count = _layer(spec, w, h, keys, layer_counts, idle_count)
            if shared is not None:
                return (h, new_counts[0], idle_count), ()
            return (h, count, idle_count), new_counts

        xs = (ws, tuple(s["key"] for s in stacked), tuple(s["count"] for s in stacked))
        init = (x, None if shared is None else shared["count"], init_idle)
        (x, count, idle_count), stacked_counts = lax.scan(body, init, xs)
    else:
        def body(i, carry):
            h, count, idle_count, stacked_counts = carry
            if shared is not None:
                keys, layer_counts = (shared["key"],), (count,)
            else:
                keys = tuple(s["key"][i] for s in stacked)
                layer_counts = tuple(lax.dynamic_index_in_dim(c, i, keepdims=False) for c in stacked_counts)
            h, new_counts, idle_count = _layer(spec, ws[i], h, keys, layer_counts, idle_count)
            if shared is not None:
                return h, new_counts[0], idle_count, stacked_counts
            stacked_counts = tuple(lax.dynamic_update_index_in_dim(c, n, i, 0)
                                   for c, n in zip(stacked_counts, new_counts))
            return h, count, idle_count, stacked_counts

        init = (x, None if shared is None else shared["count"], init_idle, tuple(s["count"] for s in stacked))
        x, count, idle_count, stacked_counts = lax.fori_loop(0, LAYERS, body, init)
    if shared is not None:
        counts["rngs"] = count
    counts.update({f"layers.{draw}.rngs": c for draw, c in zip(DRAWS, stacked_counts)})
    if idle is not None:
        counts["idle.rngs"] = idle_count
    return x, counts


def _streams(state: dict, prefix: str = "") -> dict:
    """``{"layers_0.first.rngs": {"key", "count"}, ...}``: every stream of the state by its path below ``state``."""
    found = {}
    for name, sub in state.items():
        if name == "rngs":
            found[prefix + "rngs"] = sub
        elif isinstance(sub, dict):
            found.update(_streams(sub, f"{prefix}{name}."))
    return found


def make_step(spec: StepSpec):
    """``step(state, x) -> (new_state, loss)``: one SGD step, every stream's count advanced as drawn."""

    def step(state, x):
        streams = _streams(state)
        params = {name: sub["w"] for name, sub in state.items() if "w" in sub}

        def loss(params):
            forward = _loop if spec.stacked else _unrolled
            y, counts = forward(spec, params, streams, x)
            return jnp.sum(y), counts

        (value, counts), grads = jax.value_and_grad(loss, has_aux=True)(params)
        new = jax.tree.map(lambda a: a, state)
        for name, g in grads.items():
            new[name]["w"] = state[name]["w"] - 0.1 * g
        for path, count in counts.items():
            owner = new
            for part in path.split(".")[:-1]:
                owner = owner[part]
            owner["rngs"]["count"] = count
        return new, value

    return step


def jitted(spec: StepSpec):
    """The step, jitted with its state donated (as real train steps are)."""
    return jax.jit(make_step(spec), donate_argnums=0)


def lower(spec: StepSpec) -> jax.stages.Lowered:
    """The jitted step lowered for the CPU. Clears jax's caches first, as nnx_models.lower does, so that names
    inside nested computations do not depend on what ran before."""
    jax.clear_caches()
    return jitted(spec).trace(initial_state(spec), batch()).lower(lowering_platforms=("cpu",))


def hlo_text(spec: StepSpec) -> str:
    """The pre-optimization HLO text, as hlo-audit prints a lowering (stages.lowered.hlo_text)."""
    from hlo_audit.stages.lowered import hlo_text as text

    return text(lower(spec))
