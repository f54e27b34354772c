"""Numerical ground truth for the RNG dataflow analysis: which RNG streams does a train step actually use?

Plain module (no pytest import), used by tests.

The oracle (``stream_effects`` / ``stream_truth``) runs the jitted step once on the real arguments (the
baseline) and then once per RNG stream with only that stream's key replaced by a different valid key of the
same shape (everything else, including the stream's count, unchanged). A stream is *used* (``True``) iff some
output leaf other than that stream's own key and count in the returned state differs bit for bit from the
baseline. Exact comparison is right: same compiled program, same inputs but one, and XLA:CPU is
deterministic.

* A stream is a (key, count) pair of leaves under one path: ``...rngs.dropout.key`` / ``...rngs.dropout.count``
  (a top-level ``nnx.Rngs``), ``...dropout.rngs.key`` / ``.count`` (a stream kept by ``nnx.Dropout``),
  ``...to_nnx__rngs.aqt.key`` / ``.count`` (ToNNX's fork). Scanned models stack a stream over the layers
  (key ``key<fry>[L]`` = ``u32[L,2]`` in HLO, count ``u32[L]``): one stream, and the whole stacked key is
  replaced (by ``jax.random.split`` of a fixed key to that shape, so every layer's key changes).
* Key leaves are found by dtype: typed key arrays (``jax.dtypes.prng_key``, what NNX's ``RngKey`` holds), or raw
  ``u32[..., 2|4]`` leaves named ``key`` that have a ``count`` sibling.
* Paths use exactly ``EntryParam.path``'s format: the argument's name, then the pytree keys below it joined by
  ``.``, NNX's trailing ``.value`` dropped, and the stream path is the key's path minus ``.key``
  (``state.layers_0.dropout.rngs``). The case builders assert that the oracle's streams are exactly the
  streams of ``analyze(text, arg_keys=...)``'s ``rng_key`` parameters.
* Donation: the steps here are jitted with ``donate_argnums=0``, like real train steps. The oracle calls the
  very same jitted function (so the HLO text in a case is the text of the executed program, aliasing
  included) and hands it a fresh copy of every argument on each call, so donation never invalidates the
  baseline arguments.

Cases (``OracleCase``): ``nnx_case(spec)`` for ``tests/nnx_models.ModelSpec`` (``nnx_specs()`` lists the ones the
tests use), ``construct_case(spec)`` for ``tests/rng_constructs.StepSpec`` (RNG state through each pass-through
construct: remat's opt-barrier, a hand-written barrier, loops, conditionals, nested jit), ``trainer_case(spec)`` for
``tests/linen_trainer.TrainerSpec`` (a key of its own in a linen ``TrainState``, linen's ``rngs``, a plain pytree) and
``maxtext_case(...)`` for MaxText 0.2.5's real NNX train step at a tiny size, initialized concretely and executed on
the CPU (``MAXTEXT_CASES`` lists the configurations).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from hlo_audit.attribution import arg_keys as lowered_arg_keys
from hlo_audit.attribution import arg_leaves as lowered_arg_leaves
from hlo_audit.attribution import key_name
from hlo_audit.hlo.analysis import analyze
from hlo_audit.hlo.rng_streams import pair_streams

# The replacement key's seed. Any seed works; the oracle checks that every element of the key changes.
PERTURB_SEED = 12345


@dataclasses.dataclass(frozen=True)
class OracleCase:
    name: str
    text: str  # pre-optimization HLO text of the executed jitted step: lowered.as_text(dialect="hlo")
    arg_keys: tuple | None  # hlo_audit.attribution.arg_keys(lowered)
    truth: dict[str, bool]  # stream path -> True iff replacing its key changes any other output leaf
    effects: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict, compare=False)
    # stream path -> how much one step advances its count, summed over its elements (out - in)
    increments: dict[str, int] = dataclasses.field(default_factory=dict, compare=False)
    # ^ stream path -> the output leaves (paths) that changed; for reports and failure messages
    seconds: float = dataclasses.field(default=0.0, compare=False)  # wall time to build the case

    def stream_params(self) -> set[str]:
        """Stream paths of the ``rng_key`` entry parameters ``analyze`` finds in ``text``."""
        return analyzed_streams(self.text, self.arg_keys)


def analyzed_streams(text: str, arg_keys, arg_leaves=None) -> set[str]:
    """The paths of the streams with a key that ``analyze`` finds in ``text`` (``arg_leaves``: the arguments'
    names, where a pytree attribute's mangled name hides them: ``state_key`` is ``state`` then ``key``)."""
    params = analyze(text, "<oracle>", arg_keys, arg_leaves=arg_leaves).params
    return {path for path, key, _ in pair_streams(params) if key is not None}


# --------------------------------------------------------------------------------------------------------------
# The generic oracle
# --------------------------------------------------------------------------------------------------------------


def _names(keypath) -> tuple[str, ...]:
    names = [key_name(k) for k in keypath]
    if len(names) > 1 and names[-1] == "value":  # NNX Variable.value, as attribution.arg_keys drops it
        names.pop()
    return tuple(names)


def _is_typed_key(leaf) -> bool:
    return hasattr(leaf, "dtype") and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)


def _find_streams(flat, lone: frozenset[tuple[str, ...]] = frozenset()) -> dict[tuple[str, ...], tuple[int, int | None]]:
    """Stream path (names, argument index first) -> (key leaf index, count leaf index or None).

    A stream's path is its key's without the ``key`` component where that is NNX's ``<stream>.key`` (a ``count``
    beside it, or an owner named ``rngs`` above it), else the key's own path, as ``rng_streams.stream_path``
    names them. ``lone``: leaves (names, argument index first) that are keys whatever their name or dtype (a raw
    ``u32[2]`` in a linen ``TrainState``'s field), each a stream of its own."""
    index = {names: i for i, (names, _) in enumerate(flat)}
    streams = {}
    for i, (names, leaf) in enumerate(flat):
        if names in lone:
            streams[names] = (i, None)
            continue
        if not names or names[-1] != "key":
            continue
        count = index.get(names[:-1] + ("count",))
        raw = (
            count is not None
            and np.dtype(getattr(leaf, "dtype", np.float32)) == np.uint32
            and leaf.ndim >= 1
            and leaf.shape[-1] in (2, 4)
        ) if not _is_typed_key(leaf) else False
        if _is_typed_key(leaf) or raw:
            nnx_stream = count is not None or any(n == "rngs" or n.endswith("_rngs") for n in names[1:-1])
            streams[names[:-1] if nnx_stream else names] = (i, count)
    return streams


def _replacement(key):
    """A different valid key with ``key``'s shape, impl and sharding; every element differs from ``key``."""
    if _is_typed_key(key):
        impl = jax.random.key_impl(key)
        base = jax.random.key(PERTURB_SEED, impl=impl)
        new = jax.random.split(base, key.shape) if key.shape else base
        old_bits, new_bits = jax.random.key_data(key), jax.random.key_data(new)
    else:  # raw bits u32[..., n]
        new = jax.random.bits(jax.random.key(PERTURB_SEED), key.shape, jnp.uint32)
        old_bits, new_bits = key, new
    differs = np.any(np.asarray(old_bits) != np.asarray(new_bits), axis=-1)
    if not np.all(differs):
        raise AssertionError("replacement key equals the original in some element")
    return jax.device_put(new, key.sharding)


def _host(leaf) -> np.ndarray:
    if _is_typed_key(leaf):
        leaf = jax.random.key_data(leaf)
    return np.asarray(jax.device_get(leaf))


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def _fresh(leaves):
    """A copy of every array leaf, so a donating step cannot consume the caller's arrays."""
    return [leaf.copy() if isinstance(leaf, jax.Array) else leaf for leaf in leaves]


def _argument_names(step, count: int) -> tuple[str, ...]:
    try:
        params = list(inspect.signature(step).parameters)
    except (TypeError, ValueError):
        params = []
    return tuple(params[i] if i < len(params) else f"arg{i}" for i in range(count))


def _flatten(step, args, arg_names, state_outputs):
    """(argument names, state outputs, treedef, leaves, [(names, leaf)]) with the defaults filled in."""
    args = tuple(args)
    arg_names = tuple(arg_names) if arg_names is not None else _argument_names(step, len(args))
    state_outputs = {0: 0} if state_outputs is None else dict(state_outputs)
    pairs, treedef = jax.tree_util.tree_flatten_with_path(args)
    leaves = [leaf for _, leaf in pairs]
    return arg_names, state_outputs, treedef, leaves, [(_names(path), leaf) for path, leaf in pairs]


def _lone(flat, arg_names, keys: Sequence[str]) -> frozenset[tuple[str, ...]]:
    """The leaves ``keys`` name (paths as ``EntryParam.path``: ``state.key``), as (names, argument index first)."""
    by_path = {".".join((arg_names[int(names[0])],) + names[1:]): names for names, _ in flat}
    missing = [k for k in keys if k not in by_path]
    if missing:
        raise AssertionError(f"no leaf at {missing}")
    return frozenset(by_path[k] for k in keys)


def stream_effects(
    step: Callable,
    args: Sequence,
    *,
    arg_names: Sequence[str] | None = None,
    state_outputs: dict[int, int] | None = None,
    keys: Sequence[str] = (),
) -> dict[str, tuple[str, ...]]:
    """Stream path -> the output leaves that change when only that stream's key is replaced.

    ``step`` is the jitted function and ``args`` its concrete positional arguments (pytrees). ``arg_names``
    name the arguments as jax names the entry parameters (default: ``step``'s signature). ``state_outputs``
    maps an argument index to the index of the output that returns its new value (default ``{0: 0}``: the
    step returns ``(new_state, ...)`` for ``state`` = argument 0); the stream's own key and count leaves there
    are not compared. Output paths in the result look like ``out[0].layers_0.linear.kernel``. ``keys``: paths of
    leaves that are keys of their own (``_find_streams``' ``lone``).
    """
    arg_names, state_outputs, treedef, leaves, flat = _flatten(step, args, arg_names, state_outputs)
    streams = _find_streams(flat, _lone(flat, arg_names, keys))

    def run(new_leaves):
        out = step(*jax.tree_util.tree_unflatten(treedef, _fresh(new_leaves)))
        out_pairs = jax.tree_util.tree_flatten_with_path(out)[0]
        return {_names(path): _host(leaf) for path, leaf in out_pairs}

    baseline = run(leaves)
    again = run(leaves)
    if again.keys() != baseline.keys() or any(not _same(a, baseline[k]) for k, a in again.items()):
        raise AssertionError("the step is not deterministic: two runs on the same arguments differ")

    effects = {}
    for names, (key_index, count_index) in sorted(streams.items()):
        arg = int(names[0])
        own = set()
        if arg in state_outputs:
            rel = lambda i: (str(state_outputs[arg]),) + flat[i][0][1:]  # noqa: E731
            own.add(rel(key_index))
            if count_index is not None:
                own.add(rel(count_index))
        changed = list(leaves)
        changed[key_index] = _replacement(leaves[key_index])
        outputs = run(changed)
        if outputs.keys() != baseline.keys():
            raise AssertionError(f"output structure changed when perturbing {names}")
        diff = tuple(
            f"out[{p[0]}]" + "".join(f".{n}" for n in p[1:])
            for p, a in outputs.items()
            if p not in own and not _same(a, baseline[p])
        )
        effects[".".join((arg_names[arg],) + names[1:])] = diff
    return effects


def count_increments(step: Callable, args: Sequence, *, arg_names: Sequence[str] | None = None,
                     state_outputs: dict[int, int] | None = None, keys: Sequence[str] = ()) -> dict[str, int]:
    """Stream path -> the sum over its count's elements of (returned count - given count) for one step."""
    arg_names, state_outputs, treedef, leaves, flat = _flatten(step, args, arg_names, state_outputs)
    out = step(*jax.tree_util.tree_unflatten(treedef, _fresh(leaves)))
    returned = {_names(path): _host(leaf) for path, leaf in jax.tree_util.tree_flatten_with_path(out)[0]}
    increments = {}
    for names, (_, count_index) in sorted(_find_streams(flat, _lone(flat, arg_names, keys)).items()):
        arg = int(names[0])
        if count_index is None or arg not in state_outputs:
            continue
        given = _host(leaves[count_index]).astype(np.int64)
        new = returned[(str(state_outputs[arg]),) + flat[count_index][0][1:]].astype(np.int64)
        increments[".".join((arg_names[arg],) + names[1:])] = int((new - given).sum())
    return increments


def stream_truth(step: Callable, args: Sequence, **kwargs) -> dict[str, bool]:
    """Stream path -> True iff replacing that stream's key changes any output other than its own key/count."""
    return {stream: bool(diff) for stream, diff in stream_effects(step, args, **kwargs).items()}


def _case(name: str, lowered, step, args, t0: float, **kwargs) -> OracleCase:
    text = lowered.as_text(dialect="hlo")
    keys = lowered_arg_keys(lowered)
    effects = stream_effects(step, args, **kwargs)
    truth = {stream: bool(diff) for stream, diff in effects.items()}
    analyzed = analyzed_streams(text, keys, lowered_arg_leaves(lowered))
    if analyzed != set(truth):
        raise AssertionError(
            f"{name}: the oracle's streams differ from analyze()'s rng_key params:\n"
            f"  only in the oracle: {sorted(set(truth) - analyzed)}\n"
            f"  only in analyze(): {sorted(analyzed - set(truth))}"
        )
    increments = count_increments(step, args, **kwargs)
    return OracleCase(name=name, text=text, arg_keys=keys, truth=truth, effects=effects, increments=increments,
                      seconds=time.perf_counter() - t0)


# --------------------------------------------------------------------------------------------------------------
# Small NNX models (tests/nnx_models.py)
# --------------------------------------------------------------------------------------------------------------


def nnx_specs():
    """The specs the tests run the oracle on: every RNG pattern of nnx_models, unrolled and scanned."""
    from nnx_models import ModelSpec

    return (
        ModelSpec(layers=2, dropout_rate=0.0),
        ModelSpec(layers=2, dropout_rate=0.5),
        ModelSpec(layers=3, scan=True, dropout_rate=0.0),
        ModelSpec(layers=3, scan=True, dropout_rate=0.5),
        ModelSpec(layers=2, bridge="draws"),
        ModelSpec(layers=2, bridge="nodraw"),
        ModelSpec(layers=3, scan=True, bridge="draws"),
        ModelSpec(layers=3, scan=True, bridge="nodraw"),
        ModelSpec(layers=2, dropout_rate=0.5, bridge="nodraw"),
        ModelSpec(layers=2),  # top-level Rngs only
    )


def nnx_case(spec) -> OracleCase:
    """The oracle on ``nnx_models``' real jitted step (state donated) for ``spec``, with its HLO text."""
    import nnx_models

    t0 = time.perf_counter()
    step, state, x = nnx_models._setup(spec)
    # As nnx_models.lower does: without it, names inside nested computations depend on the random ops run
    # eagerly before (here: the model's init), and the text would differ from nnx_models.hlo_text(spec).
    jax.clear_caches()
    lowered = step.trace(state, x).lower(lowering_platforms=("cpu",))
    return _case(nnx_models.spec_name(spec), lowered, step, (state, x), t0)


# --------------------------------------------------------------------------------------------------------------
# RNG state through XLA's pass-through constructs (tests/rng_constructs.py)
# --------------------------------------------------------------------------------------------------------------


def construct_case(spec) -> OracleCase:
    """The oracle on ``rng_constructs``' real jitted step (state donated) for ``spec``, with its HLO text."""
    import rng_constructs

    t0 = time.perf_counter()
    lowered = rng_constructs.lower(spec)
    step = rng_constructs.jitted(spec)
    return _case(spec.name, lowered, step, (rng_constructs.initial_state(spec), rng_constructs.batch()), t0)


# --------------------------------------------------------------------------------------------------------------
# Keys in a linen TrainState, linen's rngs, a plain pytree (tests/linen_trainer.py)
# --------------------------------------------------------------------------------------------------------------


def trainer_case(spec) -> OracleCase:
    """The oracle on ``linen_trainer``'s real jitted step (state donated) for ``spec``, with its HLO text; each key
    the spec holds is a stream of its own (``rngs``: the step's last argument, handed back split as output 2)."""
    import linen_trainer

    t0 = time.perf_counter()
    lowered = linen_trainer.lower(spec)
    args = linen_trainer.initial_args(spec)
    state_outputs = {0: 0, 3: 2} if spec.use == "rngs" else {0: 0}
    return _case(spec.name, lowered, linen_trainer.jitted(spec), args, t0, state_outputs=state_outputs,
                 keys=tuple(linen_trainer.expected(spec)))


# --------------------------------------------------------------------------------------------------------------
# MaxText's real train step, tiny, executed on the CPU
# --------------------------------------------------------------------------------------------------------------

# MaxText's "default" model (base.yml alone: llama2-style decoder, enable_dropout true) shrunk so that a step
# runs on this CPU in well under a second. Strings, as on MaxText's command line.
MAXTEXT_MODEL = "default"
MAXTEXT_SEQ = 16
MAXTEXT_TINY = {
    "base_emb_dim": "16",
    "base_mlp_dim": "32",
    "base_num_query_heads": "2",
    "base_num_kv_heads": "2",
    "head_dim": "8",
    "vocab_size": "64",
    "attention": "dot_product",
    "dtype": "float32",
    "weight_dtype": "float32",
    "steps": "4",
}
MAXTEXT_CASES = {
    # name: (scan_layers, quantization, layers, extra overrides)
    "maxtext_int8_unrolled": (False, "int8", 2, {}),
    "maxtext_int8_unrolled_dropout": (False, "int8", 2, {"dropout_rate": "0.5"}),
    "maxtext_none_unrolled": (False, "", 2, {}),
    "maxtext_int8_scan": (True, "int8", 2, {}),
}


def maxtext_overrides(name: str) -> dict[str, str]:
    """Every setting ``maxtext_case(name)`` passes to MaxText's config system (on top of base.yml)."""
    from hlo_audit.targets import maxtext_config

    scan, quant, layers, extra = MAXTEXT_CASES[name]
    return maxtext_config.train_settings(
        MAXTEXT_MODEL, scan_layers=scan, quantization=quant, num_layers=layers,
        per_device_batch_size=1, max_target_length=MAXTEXT_SEQ, overrides={**MAXTEXT_TINY, **extra},
    )


def maxtext_case(name: str = "maxtext_int8_unrolled") -> OracleCase:
    """The oracle on MaxText's functional NNX train step for ``MAXTEXT_CASES[name]``, executed on the CPU.

    The configuration, mesh, step and jit arguments are hlo_audit.targets.maxtext's (the path ``lower_train_step``
    lowers, from MaxText's train_compile); the state is MaxText's own init (``TrainStateNNX(model, Optimizer)``,
    as ``train_compile.get_shaped_inputs`` and ``maxtext_utils.setup_initial_state`` build it) made concrete
    under the mesh, and the batch is a fixed synthetic one with the shapes of ``get_shaped_batch``.
    """
    from hlo_audit.targets import maxtext as target
    from hlo_audit.targets import maxtext_config

    t0 = time.perf_counter()
    mt = maxtext_config.load_maxtext()
    config = maxtext_config.hyperparameters(maxtext_overrides(name))
    with contextlib.ExitStack() as stack:
        stack.enter_context(maxtext_config.trainer_jax_flags(config))
        mesh = mt.maxtext_utils.get_mesh_from_config(config, jax.devices())
        step, abstract_args, jit_kwargs = target._train_step_and_args(config, mesh)
        state = _maxtext_concrete_state(config, mesh, jit_kwargs["in_shardings"][0])
        batch = _maxtext_batch(abstract_args[1])
        _check_matches(abstract_args[0], state, "state")
        _check_matches(abstract_args[1], batch, "batch")
        from flax.core.spmd import logical_axis_rules

        stack.enter_context(jax.set_mesh(mesh))
        stack.enter_context(logical_axis_rules(config.logical_axis_rules))
        jitted = jax.jit(step, **jit_kwargs)
        lowered = jitted.trace(state, batch).lower(lowering_platforms=("cpu",))
        return _case(name, lowered, jitted, (state, batch), t0, arg_names=target.TRAIN_STEP_ARG_NAMES)


def _maxtext_concrete_state(config, mesh, shardings):
    """MaxText's initial NNX train state, concrete, as ``setup_initial_state`` builds it (no checkpoint)."""
    from flax import nnx
    from flax.core.spmd import logical_axis_rules
    from maxtext.common import train_state_nnx
    from maxtext.optimizers import optimizers
    from maxtext.utils import maxtext_utils, model_creation_utils

    create_model, model = model_creation_utils.create_nnx_abstract_model(config, mesh)
    tx = optimizers.get_optimizer(config, maxtext_utils.create_learning_rate_schedule(config), model, mesh=mesh)

    def init_state():
        nnx_model = create_model()
        return train_state_nnx.TrainStateNNX(nnx_model, nnx.Optimizer(nnx_model, tx, wrt=nnx.Param))

    with jax.set_mesh(mesh), logical_axis_rules(config.logical_axis_rules):
        return jax.jit(lambda: nnx.state(init_state()), out_shardings=shardings)()


def _maxtext_batch(abstract_batch):
    """A fixed synthetic batch with ``get_shaped_batch``'s shapes: random tokens, positions, one segment."""
    batch = {}
    rng = np.random.default_rng(0)
    for k, a in abstract_batch.items():
        shape, dtype = a.shape, a.dtype
        if k.endswith("position"):
            value = np.broadcast_to(np.arange(shape[-1]), shape)
        elif k.endswith("segmentation"):
            value = np.ones(shape)
        else:
            value = rng.integers(1, 64, size=shape)
        batch[k] = jax.device_put(np.asarray(value, dtype=dtype), a.sharding)
    return batch


def _check_matches(abstract, concrete, what: str) -> None:
    a = jax.tree_util.tree_flatten_with_path(abstract)
    c = jax.tree_util.tree_flatten_with_path(concrete)
    if a[1] != c[1]:
        raise AssertionError(f"concrete {what} has another tree structure than the lowered one")
    for (path, x), (_, y) in zip(a[0], c[0]):
        if (x.shape, x.dtype) != (y.shape, y.dtype):
            raise AssertionError(f"{what}{jax.tree_util.keystr(path)}: {y.dtype}{y.shape} vs abstract {x.dtype}{x.shape}")
