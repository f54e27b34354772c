"""MaxText's train step with seed 000's RNG fixes reverted on demand: the regressions the gate and diff must see.

MaxText 0.2.5 carries seed 000's fix in three parts; each can be reverted at run time:

* ``fp8-keeps-rngs``: the quantization bridge. fp8 and nanoo_fp8 (which never draw at apply time) claim they
  need their RNGs again, so every quantized dot's ToNNX wrapper keeps its forked Rngs.
* ``dropout0-forks``: ``Dropout`` keeps its forked Rngs even at rate 0, where it never draws.
* ``attention-holds-rngs``: ``AttentionOp`` holds the layer's Rngs without attention dropout.

``HLO_AUDIT_INJECT`` names the reverts (comma-separated) for the ``lower`` target; ``prefix`` is all of them,
MaxText as it was before the fix. ``te-keeps-rngs`` does to the Transformer Engine backend what
``fp8-keeps-rngs`` does to fp8 (every recipe keeps its forked Rngs, not only NVFP4, whose stochastic rounding
draws). ``reverted(...)`` applies them in-process and undoes them on exit; TE cells lower as the maxtext
target lowers them.

``seed-001`` is the other direction: seed 001's fix, which MaxText 0.2.5 does not have, forward-ported (``seed_001``):
the bridged NVFP4 quantizers share the caller's RNG stream instead of each keeping a fork. With ``te-keeps-rngs`` too,
every TE recipe goes onto that shared stream (the seed's own te_fp8_currentscaling experiment): no parameter more,
672 dead counter increments per step more at 32 layers.

``rest-as-args`` changes MaxEngine's inference steps instead: they take the model's rest state (RNG streams, AQT
serve mode's quantized weights) as a jit argument, as the train step takes its state, instead of closing over it,
so what was captured as constants becomes entry parameters.
"""

from __future__ import annotations

import contextlib
import enum
import inspect
import os

import jax

from hlo_audit.capture import captured_arrays
from hlo_audit.lowering import Lowering
from hlo_audit.stages import to_stage
from hlo_audit.targets.maxengine import inference_settings, inference_step
from hlo_audit.targets.maxtext import MaxTextTarget
from hlo_audit.targets.maxtext_config import model_num_layers, trainer_jax_flags

INJECT = "HLO_AUDIT_INJECT"
REST_AS_ARGS = "rest-as-args"
# Seed 000's three parts, then the same bridge revert for Transformer Engine's backend (a no-op for other cells).
SEED_000 = ("fp8-keeps-rngs", "dropout0-forks", "attention-holds-rngs")
REVERTS = (*SEED_000, "te-keeps-rngs")
SEED_001 = "seed-001"


@contextlib.contextmanager
def reverted(*names: str):
    """MaxText with the named parts of seed 000's fix undone (``prefix``: all of them) while inside."""
    from flax import nnx
    from maxtext.layers import attention_op, linears, quantizations

    names = REVERTS if "prefix" in names else names
    unknown = set(names) - set(REVERTS)
    if unknown:
        raise ValueError(f"unknown revert {sorted(unknown)} (known: {', '.join(REVERTS)}, prefix)")
    saved = [(quantizations.Fp8Quantization, "needs_apply_rngs"),
             (quantizations.NANOOFp8Quantization, "needs_apply_rngs"),
             (quantizations.TransformerEngineQuantization, "needs_apply_rngs"),
             (linears.Dropout, "__init__"), (attention_op.AttentionOp, "__init__")]
    saved = [(owner, attr, owner.__dict__[attr]) for owner, attr in saved]
    if "fp8-keeps-rngs" in names:
        quantizations.Fp8Quantization.needs_apply_rngs = True
        quantizations.NANOOFp8Quantization.needs_apply_rngs = True
    if "te-keeps-rngs" in names:
        quantizations.TransformerEngineQuantization.needs_apply_rngs = True
    if "dropout0-forks" in names:
        def init_keeping_fork(self, rate, *, broadcast_dims=(), deterministic=False, rng_collection="dropout",
                              rngs=None):
            # MaxText's Dropout.__init__ before the fix: the fork is kept whatever the rate.
            self.rate, self.broadcast_dims = rate, broadcast_dims
            self.deterministic, self.rng_collection = deterministic, rng_collection
            self.rngs = rngs.fork() if hasattr(type(rngs), "fork") else rngs

        linears.Dropout.__init__ = init_keeping_fork
    if "attention-holds-rngs" in names:
        attention_init = attention_op.AttentionOp.__init__

        def init_holding_rngs(self, *args, rngs=None, **kwargs):
            attention_init(self, *args, rngs=rngs, **kwargs)
            self.rngs = nnx.data(rngs)  # the fixed __init__ made the attribute static (None)

        attention_op.AttentionOp.__init__ = init_holding_rngs
    try:
        yield
    finally:
        for owner, attr, value in saved:
            setattr(owner, attr, value)


class ApplyRngs(enum.Enum):
    """Seed 001's replacement for ``needs_apply_rngs``: what a quantization backend's dot needs at apply time."""

    NONE = "none"  # never draws: the bridge drops its fork after init (seed 000's release_rngs)
    SHARED = "shared"  # draws, but not from a stream of its own: the bridge holds the caller's Rngs
    PRIVATE = "private"  # draws from its own stream (AQT, Qwix): the bridge keeps its fork


@contextlib.contextmanager
def seed_001():
    """MaxText 0.2.5 with seed 001's fix while inside: the bridged NVFP4 quantizers share the caller's RNG stream.

    As the seed describes it: ``Quantization.apply_rngs`` (an ``ApplyRngs``) replaces the boolean; it is ``PRIVATE``
    where a backend needs its RNGs (the default, AQT and Qwix stay there) and ``NONE`` where it does not; Transformer
    Engine derives it from the recipe, ``SHARED`` for NVFP4 with stochastic rounding (TE folds a per-quantizer hash
    into what it draws, so the quantizers never needed streams of their own). ``ToNNX.share_rngs`` swaps the fork
    for the caller's Rngs; ``ToNNX.__init__`` still forks first, so the caller's streams advance as before and
    parameter initialization is unchanged. The two places that bridge a quantized dot (``DenseGeneral`` in
    linears.py, ``GateLogit`` in moe.py) share after init where they would otherwise keep the fork. NNX stores an
    Rngs once however many modules hold it: the layers' own Rngs is already in the state (the attention holds it).
    """
    from maxtext.layers import linears, moe, nnx_wrappers, quantizations

    te_backend = quantizations.TransformerEngineQuantization
    # AQT and Qwix sit outside the Quantization hierarchy and declare needs_apply_rngs themselves.
    backends = (quantizations.Quantization, quantizations.AqtQuantization, quantizations.QwixQuantization)
    saved = [(quantizations, "ApplyRngs"), *((b, "apply_rngs") for b in backends), (te_backend, "apply_rngs"),
             (nnx_wrappers.ToNNX, "share_rngs"), (linears.DenseGeneral, "__init__"), (moe.GateLogit, "__init__")]
    saved = [(owner, attr, owner.__dict__.get(attr)) for owner, attr in saved]

    def backend_apply_rngs(self) -> ApplyRngs:
        return ApplyRngs.PRIVATE if self.needs_apply_rngs else ApplyRngs.NONE

    def te_apply_rngs(self) -> ApplyRngs:
        # needs_apply_rngs is MaxText 0.2.5's own recipe check: NVFP4 with stochastic rounding on.
        return ApplyRngs.SHARED if self.needs_apply_rngs else ApplyRngs.NONE

    def share_rngs(self, rngs):
        """Hold the caller's ``Rngs`` instead of the fork (after the wrapped module is initialized)."""
        self.to_nnx__rngs = rngs

    def sharing_after_init(init):
        signature = inspect.signature(init)

        def init_then_share(self, *args, **kwargs):
            init(self, *args, **kwargs)
            bound = signature.bind(self, *args, **kwargs).arguments
            quant, bridge = bound.get("quant"), self.quant_dot_general
            if bridge is not None and getattr(quant, "apply_rngs", None) is ApplyRngs.SHARED:
                bridge.share_rngs(bound["rngs"])

        return init_then_share

    quantizations.ApplyRngs = ApplyRngs
    for backend in backends:
        backend.apply_rngs = property(backend_apply_rngs)
    te_backend.apply_rngs = property(te_apply_rngs)
    nnx_wrappers.ToNNX.share_rngs = share_rngs
    linears.DenseGeneral.__init__ = sharing_after_init(linears.DenseGeneral.__init__)
    moe.GateLogit.__init__ = sharing_after_init(moe.GateLogit.__init__)
    try:
        yield
    finally:
        for owner, attr, value in saved:
            if value is None:
                delattr(owner, attr)
            else:
                setattr(owner, attr, value)


def lower(cell):
    names = injected()
    if cell.is_inference and REST_AS_ARGS in names:
        return _rest_as_arguments(cell)
    with contextlib.ExitStack() as patches:
        if SEED_001 in names:
            patches.enter_context(seed_001())
        patches.enter_context(reverted(*(n for n in names if n not in (REST_AS_ARGS, SEED_001))))
        return MaxTextTarget().lower(cell)  # as the maxtext target lowers: platform devices, TE declared


def injected() -> list[str]:
    """The changes HLO_AUDIT_INJECT names."""
    return [n for n in os.environ.get(INJECT, "").split(",") if n]


lower.full_depth = model_num_layers


def _rest_as_arguments(cell) -> Lowering:
    settings = inference_settings(cell.model, scan_layers=cell.scan, quantization=cell.quant,
                                  quant_mode=cell.quant_mode, num_layers=cell.layers, per_device_batch_size=cell.batch,
                                  max_target_length=cell.seq, max_prefill_length=cell.prefill,
                                  overrides=dict(cell.overrides))
    call = inference_step(settings, cell.step)
    engine = call.engine

    def with_rest(rest, run):
        saved, engine._nnx_rest_state = engine._nnx_rest_state, rest
        try:
            return run()
        finally:
            engine._nnx_rest_state = saved

    # One wrapper per step, so every argument keeps the name MaxEngine's own method gives it.
    def prefill(rest, *, params, padded_tokens, true_length, rng):
        return with_rest(rest, lambda: call.jitted(engine, params=params, padded_tokens=padded_tokens,
                                                   true_length=true_length, rng=rng))

    def generate(rest, params, decode_state, *, rng):
        return with_rest(rest, lambda: call.jitted(engine, params, decode_state, rng=rng))

    def insert(rest, prefix, decode_state, slot):
        return with_rest(rest, lambda: call.jitted(engine, prefix, decode_state, slot))

    step = {"prefill": prefill, "generate": generate, "insert": insert}[cell.step]
    with trainer_jax_flags(engine.config):
        traced = jax.jit(step).trace(call.rest_state, *call.args[1:], **call.kwargs)
        captured = captured_arrays(traced, {"model": call.rest_state})
        return to_stage(traced.lower(lowering_platforms=(cell.platform,)), cell, captured)
