"""MaxText's steps with a change injected on demand, for the gate's end-to-end tests.

* ``HLO_AUDIT_INJECT=fp8-keeps-rngs``: one of seed 000's RNG fixes reverted. The fp8 backend (which never draws
  at apply time) claims it needs its RNGs again, so every quantized dot's ToNNX wrapper keeps its forked Rngs.
* ``HLO_AUDIT_INJECT=rest-as-args``: MaxEngine's inference steps take the model's rest state (RNG streams, AQT
  serve mode's quantized weights) as a jit argument, as the train step takes its state, instead of closing
  over it: what was captured as constants becomes entry parameters.
"""

from __future__ import annotations

import os

import jax

from hlo_audit.capture import captured_arrays
from hlo_audit.targets.base import Lowering
from hlo_audit.targets.maxengine import inference_settings, inference_step
from hlo_audit.targets.maxtext import _trainer_jax_flags, lower_train_step, model_num_layers

INJECT = "HLO_AUDIT_INJECT"


def lower(cell):
    injected = os.environ.get(INJECT)
    if cell.is_inference:
        if injected == "rest-as-args":
            return _rest_as_arguments(cell)
        from hlo_audit.targets.maxtext import MaxTextTarget

        return MaxTextTarget().lower(cell)
    if injected == "fp8-keeps-rngs":
        from maxtext.layers import quantizations

        quantizations.Fp8Quantization.needs_apply_rngs = True
    return lower_train_step(cell.model, scan_layers=cell.scan, quantization=cell.quant, num_layers=cell.layers,
                            per_device_batch_size=cell.batch, max_target_length=cell.seq, platform=cell.platform,
                            overrides=dict(cell.overrides))


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
    with _trainer_jax_flags(engine.config):
        traced = jax.jit(step).trace(call.rest_state, *call.args[1:], **call.kwargs)
        captured = captured_arrays(traced, {"model": call.rest_state})
        return Lowering.of(traced.lower(lowering_platforms=(cell.platform,)), cell.stage, captured)
