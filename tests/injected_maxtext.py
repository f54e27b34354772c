"""MaxText's train step with one of seed 000's RNG fixes reverted on demand, for the gate's end-to-end tests.

With ``HLO_AUDIT_INJECT=fp8-keeps-rngs`` the fp8 backend (which never draws at apply time) claims it needs
its RNGs again, so every quantized dot's ToNNX wrapper keeps its forked Rngs: the regression seed 000 fixed.
``te-keeps-rngs`` does the same to the Transformer Engine backend (every recipe, not only NVFP4, whose
stochastic rounding is the one that draws); TE cells are lowered the way the maxtext target lowers them.
"""

from __future__ import annotations

import os

from hlo_audit.targets import te
from hlo_audit.targets.maxtext import lower_train_step, model_num_layers, te_recipe

INJECT = "HLO_AUDIT_INJECT"


def lower(cell):
    injected = os.environ.get(INJECT)
    if injected == "fp8-keeps-rngs":
        from maxtext.layers import quantizations

        quantizations.Fp8Quantization.needs_apply_rngs = True
    elif injected == "te-keeps-rngs":
        from maxtext.layers import quantizations

        quantizations.TransformerEngineQuantization.needs_apply_rngs = True
    with te.cross_lowering(cell, te_recipe):
        return lower_train_step(cell.model, scan_layers=cell.scan, quantization=cell.quant, num_layers=cell.layers,
                                per_device_batch_size=cell.batch, max_target_length=cell.seq,
                                platform=cell.platform, overrides=dict(cell.overrides))


lower.full_depth = model_num_layers
