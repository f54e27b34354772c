"""Small, real Flax NNX train steps, lowered with jax, for tests and experiments.

Plain module (no pytest import). Everything here is deterministic given a ``ModelSpec``.

The models mirror the shapes that matter for the RNG-state audit (see DESIGN.md and the seeds):

* ``rngs=True``: the top-level model keeps the caller's ``nnx.Rngs(params=0, dropout=1)`` as ``self.rngs``.
  It is never drawn from in the step; it is paid once (2 streams -> 2 keys + 2 counts), whatever the depth.
* ``dropout_rate``: one ``nnx.Dropout`` per layer. ``nnx.Dropout`` forks the ``dropout`` stream and keeps the
  fork, so every layer carries its own (key, count) pair, also at rate 0.0, where it never draws.
* ``bridge``: one Linen module per layer wrapped with ``nnx.bridge.ToNNX``. ToNNX forks the caller's Rngs (both
  streams) and keeps the fork: two (key, count) pairs per layer. ``"draws"`` calls ``make_rng('dropout')``;
  ``"nodraw"`` never does (but ToNNX still pulls a key from every stream on each call, advancing the counts).
* ``rngs=False``: a plain ``nnx.Linear`` stack; the model state holds no RNG state at all (an ``nnx.Rngs`` is
  used for initialization only). Allowed with ``dropout_rate`` None or 0.0 (Dropout then holds no rngs).
* ``scan=True``: the flax scan-over-layers pattern: layers created with ``nnx.split_rngs`` + ``nnx.vmap``
  (their state is stacked on a leading ``layers`` axis) and applied with ``nnx.scan``.

Unrolled layers are attributes ``layers_0``, ``layers_1``, ... (so they show up in HLO parameter names);
the scanned stack is the attribute ``layers``.

API: ``ModelSpec``, ``build(spec)``, ``lower(spec, platform="cpu")``, ``hlo_text(spec)``,
``write_dump(spec, folder)``, ``expected_counts(spec)``, ``spec_name(spec)``, ``STEP_NAME``.

State no name gives away (the end of this file): ``held_rng_model(layers, holder)``, blocks ``cell_0``,
``cell_1``... holding never-drawn RNG state as ``self.noise_source = rngs.fork()`` or ``self.rng = nnx.Rngs(0)``,
its train step traced with ``jax.jit`` or ``nnx.jit`` (``held_rng_traced``, and the callable target
``held_rng_target``); ``typed_state_traced()``, a step whose state says what it is only by type.

What the HLO looks like (jax 0.12.0.1 / flax 0.12.12): the module is ``jit_train_step``; entry parameters are
numbered in sorted state-path order with ``x`` last, and named after the path with non-identifier characters
replaced by ``_``, e.g. ``state['layers_0']['dropout']['rngs']['key'].value`` ->
``state__layers_0____dropout____rngs____key___value.1`` (``u32[2]``; its count is ``u32[]``); scanned, the same
leaf is ``state__layers____dropout____rngs____key___value.1 = u32[L,2]`` (count ``u32[L]``). The input is ``x.1``.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen, nnx

# The shipped example's NNX idioms (scan-over-layers, the SGD train step): the fixtures lower the same code.
from hlo_audit.examples.nnx_mlp import make_step, scan_layers, stacked_layers

BATCH = 4
BRIDGES = (None, "draws", "nodraw")

# The name of the jitted step. In XLA dumps its module is "jit_<STEP_NAME>".
STEP_NAME = "train_step"


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    layers: int = 2
    scan: bool = False
    dropout_rate: float | None = None
    rngs: bool = True
    bridge: str | None = None
    width: int = 8

    def __post_init__(self):
        if self.layers < 1:
            raise ValueError(f"layers must be >= 1, got {self.layers}")
        if self.width < 1:
            raise ValueError(f"width must be >= 1, got {self.width}")
        if self.bridge not in BRIDGES:
            raise ValueError(f"bridge must be one of {BRIDGES}, got {self.bridge!r}")
        if self.dropout_rate is not None and not 0.0 <= self.dropout_rate < 1.0:
            raise ValueError(f"dropout_rate must be in [0, 1), got {self.dropout_rate}")
        if not self.rngs:
            if self.bridge is not None:
                raise ValueError("bridge needs rngs=True (ToNNX needs an Rngs to initialize and draw)")
            if self.dropout_rate:
                raise ValueError("dropout_rate > 0 needs rngs=True (nnx.Dropout would have nothing to draw from)")


def spec_name(spec: ModelSpec) -> str:
    """A short, file-name-safe name: e.g. ``L2``, ``L4_scan``, ``L2_drop0.5``, ``L2_norngs``, ``L2_bridge-draws``."""
    parts = [f"L{spec.layers}"]
    if spec.scan:
        parts.append("scan")
    if spec.dropout_rate is not None:
        parts.append(f"drop{spec.dropout_rate:g}")
    if not spec.rngs:
        parts.append("norngs")
    if spec.bridge is not None:
        parts.append(f"bridge-{spec.bridge}")
    if spec.width != ModelSpec.width:
        parts.append(f"w{spec.width}")
    return "_".join(parts)


# --------------------------------------------------------------------------------------------------------------
# Linen modules for the ToNNX bridge
# --------------------------------------------------------------------------------------------------------------


class LinenDraws(linen.Module):
    """Dense followed by a dropout mask drawn from ``make_rng('dropout')`` at apply time."""

    width: int

    @linen.compact
    def __call__(self, x):
        x = linen.Dense(self.width)(x)
        keep = jax.random.bernoulli(self.make_rng("dropout"), 0.5, x.shape)
        return jnp.where(keep, x * 2.0, 0.0)


class LinenNoDraw(linen.Module):
    """Dense only; never calls ``make_rng``."""

    width: int

    @linen.compact
    def __call__(self, x):
        return linen.Dense(self.width)(x)


# --------------------------------------------------------------------------------------------------------------
# NNX model
# --------------------------------------------------------------------------------------------------------------


class Block(nnx.Module):
    def __init__(self, spec: ModelSpec, rngs: nnx.Rngs):
        # With spec.rngs False the Rngs is used for initialization only and not kept anywhere.
        self.linear = nnx.Linear(spec.width, spec.width, rngs=rngs)
        self.has_dropout = spec.dropout_rate is not None
        self.has_bridge = spec.bridge is not None
        if self.has_dropout:
            self.dropout = nnx.Dropout(spec.dropout_rate, rngs=rngs if spec.rngs else None)
        if self.has_bridge:
            linen_cls = LinenDraws if spec.bridge == "draws" else LinenNoDraw
            bridged = nnx.bridge.ToNNX(linen_cls(spec.width), rngs=rngs)
            self.bridge = nnx.bridge.lazy_init(bridged, jnp.zeros((1, spec.width), jnp.float32))

    def __call__(self, x):
        x = nnx.relu(self.linear(x))
        if self.has_dropout:
            x = self.dropout(x)
        if self.has_bridge:
            x = x + self.bridge(x)
        return x


class Model(nnx.Module):
    def __init__(self, spec: ModelSpec, rngs: nnx.Rngs):
        self.scan = spec.scan
        self.num_layers = spec.layers
        if spec.rngs:
            self.rngs = rngs
        if spec.scan:
            self.layers = stacked_layers(lambda r: Block(spec, r), spec.layers, rngs)
        else:
            for i in range(spec.layers):
                setattr(self, f"layers_{i}", Block(spec, rngs))

    def __call__(self, x):
        if self.scan:
            return scan_layers(x, self.layers)
        for i in range(self.num_layers):
            x = getattr(self, f"layers_{i}")(x)
        return x


def build(spec: ModelSpec) -> Model:
    """The model, initialized from fixed seeds."""
    return Model(spec, nnx.Rngs(params=0, dropout=1))


def _input(spec: ModelSpec) -> jax.Array:
    return jnp.asarray(np.linspace(-1.0, 1.0, BATCH * spec.width, dtype=np.float32).reshape(BATCH, spec.width))


def _setup(spec: ModelSpec):
    """Real model state and input, and the jitted step (state donated, as real train steps do)."""
    model = build(spec)
    graphdef, state = nnx.split(model)
    step = jax.jit(make_step(graphdef), donate_argnums=0)
    return step, state, _input(spec)


def lower(spec: ModelSpec, platform: str = "cpu") -> jax.stages.Lowered:
    """Lower the train step for ``spec`` for ``platform`` ("cpu", "cuda", "tpu", ...).

    Lowers from abstract state (``nnx.eval_shape``), so no weights are allocated and the default device does not
    matter. The text is the same as lowering the real state on the CPU.

    Clears jax's caches first: otherwise the names XLA gives instructions inside nested computations (e.g.
    ``Arg_0.4`` vs ``RngStream___call__.4`` in ``threefry2x32``) depend on which random ops this process ran
    eagerly before, and the text would not be a function of ``spec`` alone. Entry parameter names never vary.
    """
    jax.clear_caches()
    abstract = nnx.eval_shape(lambda: build(spec))
    graphdef, state = nnx.split(abstract)
    x = jax.ShapeDtypeStruct((BATCH, spec.width), jnp.float32)
    step = jax.jit(make_step(graphdef), donate_argnums=0)
    return step.trace(state, x).lower(lowering_platforms=(platform,))


@functools.lru_cache(maxsize=None)
def hlo_text(spec: ModelSpec) -> str:
    """Pre-optimization HLO text of the train step, as jax prints it."""
    return lower(spec).as_text(dialect="hlo")


def _dtype_name(leaf) -> tuple[str, tuple[int, ...]]:
    """HLO dtype and shape a state leaf becomes as an entry parameter."""
    dtype = leaf.dtype
    shape = tuple(leaf.shape)
    if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        # A typed key (key<fry>) lowers to its raw data, u32[..., 2] for threefry.
        return "u32", shape + tuple(dtype._impl.key_shape)
    return {
        "float32": "f32",
        "float16": "f16",
        "bfloat16": "bf16",
        "float64": "f64",
        "int32": "s32",
        "int64": "s64",
        "uint32": "u32",
        "uint64": "u64",
        "int8": "s8",
        "uint8": "u8",
        "bool": "pred",
    }[np.dtype(dtype).name], shape


def expected_counts(spec: ModelSpec) -> dict[str, int]:
    """Entry parameters by HLO dtype, computed from the model state (not from HLO).

    One entry parameter per leaf of ``nnx.state(model)`` (typed keys count as u32) plus the input ``x`` (f32).
    Also ``"total"``, ``"rng_keys"`` and ``"rng_counts"`` (leaves under an ``nnx.RngKey`` / ``nnx.RngCount``).
    Built with ``nnx.eval_shape``, so no array is allocated.
    """
    abstract = nnx.eval_shape(lambda: build(spec))
    state = nnx.state(abstract)
    counts: collections.Counter[str] = collections.Counter()
    for leaf in jax.tree.leaves(state):
        counts[_dtype_name(leaf)[0]] += 1
    counts["f32"] += 1  # x
    out = dict(sorted(counts.items()))
    out["total"] = sum(counts.values())
    out["rng_keys"] = len(jax.tree.leaves(nnx.state(abstract, nnx.RngKey)))
    out["rng_counts"] = len(jax.tree.leaves(nnx.state(abstract, nnx.RngCount)))
    return out


# --------------------------------------------------------------------------------------------------------------
# Real XLA dumps
# --------------------------------------------------------------------------------------------------------------


def _run_step(spec: ModelSpec) -> float:
    """Run one real train step (used in the write_dump subprocess)."""
    step, state, x = _setup(spec)
    _, loss = step(state, x)
    return float(jax.block_until_ready(loss))


_CHILD = """
import json, sys
sys.path.insert(0, {here!r})
import nnx_models
spec = nnx_models.ModelSpec(**json.loads({spec!r}))
print("loss", nnx_models._run_step(spec))
"""


def write_dump(spec: ModelSpec, folder, *, timeout: float = 300) -> pathlib.Path:
    """Run the step for real in a fresh CPU process with ``--xla_dump_to=folder``; return the folder.

    The folder then holds XLA's own dumps, including ``module_NNNN.jit_train_step.before_optimizations.txt`` and
    ``module_NNNN.jit_train_step.cpu_after_optimizations.txt`` (plus modules for the eager ops run at init).
    """
    folder = pathlib.Path(folder).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"--xla_dump_to={folder}"
    env["JAX_PLATFORMS"] = "cpu"
    code = _CHILD.format(here=str(pathlib.Path(__file__).resolve().parent), spec=json.dumps(dataclasses.asdict(spec)))
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"write_dump({spec}) failed with exit code {proc.returncode}:\n{proc.stderr[-4000:]}")
    return folder


# --------------------------------------------------------------------------------------------------------------
# State no name gives away: RNG state under any attribute, layers under any name, roles only types tell
# --------------------------------------------------------------------------------------------------------------

HOLDERS = ("fork", "own")  # self.noise_source = rngs.fork() / self.rng = nnx.Rngs(0)
JITS = ("jax", "nnx", "nnx_grad")  # jax.jit over nnx.split state / nnx.jit / nnx.jit(nnx.grad(loss))


class HeldRngBlock(nnx.Module):
    """A layer (two Linears, ``linear`` and ``proj``) that keeps RNG state it never draws from, under a name no
    rule knows.

    ``holder="fork"``: ``self.noise_source = rngs.fork()``, an ``nnx.Rngs`` with the caller's streams (one,
    ``default``, from ``held_rng_model``'s ``nnx.Rngs(0)``): one key and one count per layer. ``holder="own"``:
    ``self.rng = nnx.Rngs(0)``, a fresh one-stream ``Rngs``: the same.
    """

    def __init__(self, width: int, holder: str, rngs: nnx.Rngs):
        self.linear = nnx.Linear(width, width, rngs=rngs)
        self.proj = nnx.Linear(width, width, rngs=rngs)
        if holder == "fork":
            self.noise_source = rngs.fork()
        elif holder == "own":
            self.rng = nnx.Rngs(0)
        else:
            raise ValueError(f"holder must be one of {HOLDERS}, got {holder!r}")

    def __call__(self, x):
        return self.proj(nnx.relu(self.linear(x)))


class HeldRngModel(nnx.Module):
    """``layers`` HeldRngBlocks as attributes ``cell_0``, ``cell_1``...: a layer list under a name the old rules
    (``layers`` / ``blocks`` / ``h``) did not know."""

    def __init__(self, layers: int, holder: str, width: int, rngs: nnx.Rngs):
        self.num_layers = layers
        for i in range(layers):
            setattr(self, f"cell_{i}", HeldRngBlock(width, holder, rngs))

    def __call__(self, x):
        for i in range(self.num_layers):
            x = getattr(self, f"cell_{i}")(x)
        return x


def held_rng_model(layers: int, holder: str, width: int = 8) -> HeldRngModel:
    """Abstract (``nnx.eval_shape``): nothing is allocated."""
    return nnx.eval_shape(lambda: HeldRngModel(layers, holder, width, nnx.Rngs(0)))


def _mean_square(model, x):
    y = model(x)
    return jnp.mean(y * y)


def _sgd(model, x):
    """Loss and gradients w.r.t. nnx.Param, an SGD update in place; the loss."""
    loss, grads = nnx.value_and_grad(_mean_square)(model, x)
    nnx.update(model, jax.tree.map(lambda p, g: p - 0.1 * g, nnx.state(model, nnx.Param), grads))
    return loss


def held_rng_traced(layers: int, holder: str, jit: str = "jax", width: int = 8):
    """The train step of ``held_rng_model``, traced from abstract shapes. ``jit="jax"``: ``jax.jit`` over the
    ``nnx.split`` state (a jax ``Traced``); ``"nnx"``: ``nnx.jit`` of the same step on the module (flax's
    ``Traced``); ``"nnx_grad"``: ``nnx.jit(nnx.grad(loss))``, gradients only. The state argument is named
    ``model`` either way, so the twins' paths can be compared as they are."""
    model = held_rng_model(layers, holder, width)
    x = jax.ShapeDtypeStruct((BATCH, width), jnp.float32)
    if jit == "nnx":
        def train_step(model, x):
            return _sgd(model, x)

        return nnx.jit(train_step).trace(model, x)
    if jit == "nnx_grad":
        return nnx.jit(nnx.grad(_mean_square)).trace(model, x)
    graphdef, state = nnx.split(model)
    if jit == "jax":
        def train_step(model, x):
            module = nnx.merge(graphdef, model)
            loss = _sgd(module, x)
            return nnx.state(module), loss

        return jax.jit(train_step).trace(state, x)
    if jit == "jax_grad":  # nnx_grad's jax.jit twin: nnx.jit hands the module's state back, so does the twin
        def grad_step(model, x):
            module = nnx.merge(graphdef, model)
            return nnx.grad(_mean_square)(module, x), nnx.state(module)

        return jax.jit(grad_step).trace(state, x)
    raise ValueError(f"jit must be one of {JITS} or 'jax_grad', got {jit!r}")


def held_rng_target(cell):
    """A callable target: ``cell.quant`` is the holder (``fork`` / ``own``), ``cell.model`` the jit (``jax``,
    ``nnx``, ``nnx_grad``, ``jax_grad``; ``nnx_lowered`` returns ``nnx.jit(...).lower(...)``)."""
    if cell.model == "nnx_lowered":
        return held_rng_traced(cell.layers, cell.quant, "nnx").lower(lowering_platforms=(cell.platform,))
    return held_rng_traced(cell.layers, cell.quant, cell.model)


held_rng_target.full_depth = {jit: 8 for jit in (*JITS, "jax_grad", "nnx_lowered")}


class TypedState(nnx.Module):
    """State whose roles only types tell: a BatchNorm's running statistics (``nnx.BatchStat``) and a cache
    (``nnx.Cache``) beside its weights (``nnx.Param``)."""

    def __init__(self, width: int, rngs: nnx.Rngs):
        self.linear = nnx.Linear(width, width, rngs=rngs)
        self.norm = nnx.BatchNorm(width, rngs=rngs)
        self.last = nnx.Cache(jnp.zeros((BATCH, width), jnp.float32))

    def __call__(self, x):
        y = self.norm(self.linear(x) + self.last.value)  # read, so jit keeps it
        self.last.value = y
        return y


def typed_state_traced(width: int = 8):
    """``jax.jit(step)(seed, adam, ts, net, x)``: no argument is named as state (``state``, ``params``...), and no
    key as the old rules knew it. ``seed``: a typed PRNG key (``jax.random.key``); ``noise``: a raw
    ``jax.random.PRNGKey`` (``u32[2]``, untyped: only what the step does with it says it is a key); ``adam``: an optax state; ``ts``: a flax
    ``TrainState``; ``net``: an ``nnx.split`` state with ``Param``, ``BatchStat`` and ``Cache`` leaves."""
    import optax
    from flax.training import train_state

    weights = {"w": jax.ShapeDtypeStruct((width, width), jnp.float32)}
    tx = optax.adam(1e-3)
    adam = jax.eval_shape(tx.init, weights)
    ts = jax.eval_shape(lambda w: train_state.TrainState.create(apply_fn=None, params=w, tx=optax.sgd(0.1)), weights)
    graphdef, net = nnx.split(nnx.eval_shape(lambda: TypedState(width, nnx.Rngs(0))))
    seed = jax.eval_shape(lambda: jax.random.key(0))
    noise = jax.ShapeDtypeStruct((2,), jnp.uint32)
    x = jax.ShapeDtypeStruct((BATCH, width), jnp.float32)

    def step(seed, noise, adam, ts, net, x):
        module = nnx.merge(graphdef, net)
        keep = jax.random.bernoulli(seed, 0.5, x.shape) & jax.random.bernoulli(noise, 0.5, x.shape)
        h = jnp.where(keep, module(x), 0.0) @ ts.params["w"]
        updates, adam = tx.update({"w": jnp.full((width, width), jnp.mean(h))}, adam)
        return adam, ts.replace(step=ts.step + 1), nnx.state(module), updates

    return jax.jit(step).trace(seed, noise, adam, ts, net, x)
