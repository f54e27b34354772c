"""MaxText's train step with one of seed 000's RNG fixes reverted on demand, for the gate's end-to-end test.

With ``HLO_AUDIT_INJECT=fp8-keeps-rngs`` the fp8 backend (which never draws at apply time) claims it needs
its RNGs again, so every quantized dot's ToNNX wrapper keeps its forked Rngs: the regression seed 000 fixed.
"""

from __future__ import annotations

import os

from hlo_audit.targets.maxtext import lower_train_step, model_num_layers

INJECT = "HLO_AUDIT_INJECT"


def lower(cell):
    if os.environ.get(INJECT) == "fp8-keeps-rngs":
        from maxtext.layers import quantizations

        quantizations.Fp8Quantization.needs_apply_rngs = True
    return lower_train_step(cell.model, scan_layers=cell.scan, quantization=cell.quant, num_layers=cell.layers,
                            per_device_batch_size=cell.batch, max_target_length=cell.seq, platform=cell.platform,
                            overrides=dict(cell.overrides))


lower.full_depth = model_num_layers
