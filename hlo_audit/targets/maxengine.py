"""Lower MaxText's inference steps (MaxEngine's prefill, generate and insert) to HLO, from shapes alone.

Why it is done this way:

* The steps are MaxEngine's own jitted methods (``_prefill_jit``, ``_generate_jit``, ``_insert_jit`` of
  ``maxtext.inference.maxengine``, the engine MaxText serves with), traced and lowered as they are. The
  configuration goes through the train target's path (base.yml, the model's yml, the cell's settings) plus
  the inference keys: ``max_prefill_predict_length`` (the cell's prefill), and ``checkpoint_is_quantized``
  for AQT's serve mode, from which MaxEngine itself picks ``quant_mode_str="serve"``.
* ``load_params`` would build the concrete model (every weight allocated) before abstracting it. The params
  are abstract from the start instead: ``nnx.split(model, nnx.Param, nnx.Cache, ...)`` of MaxEngine's own
  abstract model, as ShapeDtypeStructs with MaxText's NamedShardings; the decode state is
  ``jax.eval_shape(init_decode_state)`` and insert's prefix is the shape of what prefill returns.
* MaxEngine does not pass its model's non-parameter state (``_nnx_rest_state``: RNG streams and, in serve
  mode, the quantized weights) to the jitted steps; they close over it. That state has to be concrete, and it
  is what the audit reports as captured (``hlo_audit.capture``), so it is built the way ``load_params``
  builds it, by MaxText's own model constructor under jit, keeping only the rest. XLA's constant folding is
  off for that one computation: all its inputs are constants, and folding AQT's quantization of a 4096 x 14336
  kernel through XLA's evaluator takes ten minutes where computing it takes a second.
* jetstream is an optional package MaxText replaces with stubs when it is missing. Its stub ``ResultTokens``
  is a plain class, which a jitted step may not return; ``_register_stub_result_tokens`` makes it a pytree,
  once, and only when the stub is in use.
* An engine depends on everything but the step, so the last one built is kept: a worker that lowers a
  config's prefill and then its generate builds it once.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from hlo_audit.capture import captured_arrays
from hlo_audit.hlo.constants import CapturedArray
from hlo_audit.targets.maxtext_config import (
    captured_stdout,
    hyperparameters,
    load_maxtext,
    train_settings,
    trainer_jax_flags,
)
from hlo_audit.targets.vocab import INFERENCE_STEPS

__all__ = ["InferenceStep", "inference_settings", "inference_step", "lower_inference_step"]


@dataclass(frozen=True)
class InferenceStep:
    """One MaxEngine step ready to trace: the jitted method and its abstract arguments (the engine first)."""

    engine: object  # maxtext.inference.maxengine.MaxEngine, prepared (see _prepare)
    jitted: object  # MaxEngine._prefill_jit / _generate_jit / _insert_jit (unbound: the engine is args[0], static)
    args: tuple
    kwargs: dict

    @property
    def rest_state(self):
        """The model state the step closes over instead of taking as an argument."""
        return self.engine._nnx_rest_state  # noqa: SLF001

    def trace(self) -> jax.stages.Traced:
        with _quiet_tracing():
            return self.jitted.trace(*self.args, **self.kwargs)


def lower_inference_step(
    model: str,
    step: str,
    *,
    scan_layers: bool,
    quantization: str = "",
    quant_mode: str = "train",
    num_layers: int | None = None,
    per_device_batch_size: int = 1,
    max_target_length: int = 128,
    max_prefill_length: int = 64,
    platform: str = "cpu",
    overrides: dict[str, str] | None = None,
) -> tuple[jax.stages.Lowered, tuple[CapturedArray, ...]]:
    """Lower one MaxEngine step for `platform`; also what it closes over (paths under ``model.``).

    Arguments as for ``lower_train_step``, plus `quant_mode` ("serve": AQT on pre-quantized weights) and
    `max_prefill_length` (the prompt length prefill takes). Raises MaxTextConfigError when MaxText rejects
    the configuration.
    """
    cell_settings = inference_settings(
        model, scan_layers=scan_layers, quantization=quantization, quant_mode=quant_mode, num_layers=num_layers,
        per_device_batch_size=per_device_batch_size, max_target_length=max_target_length,
        max_prefill_length=max_prefill_length, overrides=overrides)
    call = inference_step(cell_settings, step)
    with trainer_jax_flags(call.engine.config):
        traced = call.trace()
        captured = captured_arrays(traced, {"model": call.rest_state})
        with _quiet_tracing():
            return traced.lower(lowering_platforms=(platform,)), captured


def inference_settings(model: str, *, scan_layers: bool, quantization: str, quant_mode: str, num_layers: int | None,
                       per_device_batch_size: int, max_target_length: int, max_prefill_length: int,
                       overrides: dict[str, str] | None) -> dict[str, str]:
    """MaxText config keys of an inference cell: the train target's, the prompt length and AQT's mode."""
    cell_settings = train_settings(model, scan_layers=scan_layers, quantization=quantization, num_layers=num_layers,
                                   per_device_batch_size=per_device_batch_size, max_target_length=max_target_length)
    cell_settings["max_prefill_predict_length"] = str(max_prefill_length)
    # MaxEngine reads AQT's mode from the checkpoint: pre-quantized means serve (maxengine.MaxEngine.__init__).
    cell_settings["checkpoint_is_quantized"] = str(quant_mode == "serve")
    cell_settings.update(overrides or {})
    return cell_settings


def inference_step(settings: dict[str, str], step: str) -> InferenceStep:
    """The jitted MaxEngine method for `step`, with abstract arguments shaped as MaxEngine's own callers pass them.

    `settings` are MaxText config keys (as on its command line); the engine built for them is reused.
    """
    engine = _engine(tuple(sorted(settings.items())))
    methods = type(engine)
    key = jax.ShapeDtypeStruct((2,), jnp.uint32)  # MaxEngine's own: jax.random.PRNGKey(0), split per call
    position = jax.ShapeDtypeStruct((), jnp.int32)  # prefill's true_length, insert's slot: traced ints
    with trainer_jax_flags(engine.config):
        if step == "prefill":
            tokens = jax.ShapeDtypeStruct((int(engine.config.max_prefill_predict_length),), jnp.int32)
            return InferenceStep(engine, methods._prefill_jit, (engine,), {  # noqa: SLF001
                "params": engine.abstract_params, "padded_tokens": tokens, "true_length": position, "rng": key})
        decode_state = jax.eval_shape(engine.init_decode_state)  # also records the cache annotations insert reads
        if step == "generate":
            return InferenceStep(engine, methods._generate_jit,  # noqa: SLF001
                                 (engine, engine.abstract_params, decode_state), {"rng": key})
        if step == "insert":
            prefill = inference_step(settings, "prefill").trace()
            prefix = jax.tree.map(lambda o: jax.ShapeDtypeStruct(o.shape, o.dtype, sharding=o.sharding),
                                  prefill.out_info[0])
            return InferenceStep(engine, methods._insert_jit, (engine, prefix, decode_state, position), {})  # noqa: SLF001
    raise ValueError(f"not a MaxEngine step: {step!r} (known: {', '.join(INFERENCE_STEPS)})")


@functools.lru_cache(maxsize=1)
def _engine(settings: tuple[tuple[str, str], ...]):
    """A MaxEngine for `settings`, prepared to trace its steps (the last one is kept; see the module doc)."""
    maxengine = _load_maxengine()
    config = hyperparameters(dict(settings))
    with trainer_jax_flags(config):
        engine = maxengine.MaxEngine(config, jax.devices())
        _prepare(engine, config)
    return engine


@functools.cache
def _load_maxengine():
    load_maxtext()  # MaxText's import noise handled once, the train target's way
    with captured_stdout():
        from maxtext.inference.maxengine import maxengine  # noqa: PLC0415 (heavy, import on demand)
    _register_stub_result_tokens(maxengine.engine_api)
    return maxengine


def _register_stub_result_tokens(engine_api) -> None:
    """Make jetstream's stand-in ``ResultTokens`` a pytree, so the steps that return one can be traced.

    Without jetstream, MaxText's gcloud_stub hands MaxEngine a plain class, and jit rejects it as an output
    ("... ResultTokens'> at output component [1], which is not a valid JAX type"). jetstream's real class is
    a pytree with the token arrays (``data``, ``log_prob``) as children and the index fields static; the stub
    gets the same structure. Nothing is registered when the real jetstream is installed.
    """
    if not getattr(engine_api, "_IS_STUB", False):
        return
    stub = engine_api.ResultTokens
    static = ("tokens_idx", "valid_idx", "length_idx", "samples_per_slot")
    jax.tree_util.register_pytree_node(
        stub,
        lambda tokens: ((tokens.data, tokens.log_prob), tuple(getattr(tokens, f) for f in static)),
        lambda fields, children: stub(data=children[0], log_prob=children[1], **dict(zip(static, fields))),
    )


def _prepare(engine, config) -> None:
    """What the three steps read of what ``MaxEngine.load_params`` sets up: abstract params, the rest state
    as MaxText initializes it, and the decode KV cache's partition specs (of the AR-mode model, as there)."""
    from flax import nnx  # noqa: PLC0415
    from flax.core.spmd import logical_axis_rules  # noqa: PLC0415

    mt = load_maxtext()
    mesh = engine.mesh
    with logical_axis_rules(config.logical_axis_rules):
        _, params, _, _ = nnx.split(engine.model, nnx.Param, nnx.Cache, ...)
        shardings = mt.sharding.nnx_construct_named_sharding(params, mesh)
        engine.abstract_params = jax.tree.map(
            lambda leaf, sharding: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding), params, shardings)
        engine._nnx_rest_state = _initial_rest_state(engine._create_model_fn, mesh)  # noqa: SLF001
    engine.kv_cache_annotations = mt.maxtext_utils.get_kv_cache_annotations_nnx(engine.model_ar, config, mesh)
    engine.kv_cache_shardings = jax.tree.map(lambda spec: jax.sharding.NamedSharding(mesh, spec),
                                             engine.kv_cache_annotations)


def _initial_rest_state(create_model, mesh):
    """The model's non-Param, non-Cache state as MaxText initializes it (RNG streams, AQT's frozen weights)."""
    from flax import nnx  # noqa: PLC0415

    def rest():
        _, _, _, rest_state = nnx.split(create_model(), nnx.Param, nnx.Cache, ...)
        return rest_state

    with jax.set_mesh(mesh):
        compiled = jax.jit(rest).lower().compile(compiler_options={"xla_disable_hlo_passes": "constant_folding"})
        return compiled()


@contextlib.contextmanager
def _quiet_tracing():
    """MaxEngine's generate and insert donate their decode state; lowered for shapes only, jax warns the
    donation is unusable on every call. Nothing is executed, so there is nothing to warn about."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
        yield
