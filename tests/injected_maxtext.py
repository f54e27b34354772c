"""MaxText's train step with seed 000's RNG fixes reverted on demand: the regressions the gate and diff must see.

MaxText 0.2.5 carries seed 000's fix in three parts; each can be reverted at run time:

* ``fp8-keeps-rngs``: the quantization bridge. fp8 and nanoo_fp8 (which never draw at apply time) claim they
  need their RNGs again, so every quantized dot's ToNNX wrapper keeps its forked Rngs.
* ``dropout0-forks``: ``Dropout`` keeps its forked Rngs even at rate 0, where it never draws.
* ``attention-holds-rngs``: ``AttentionOp`` holds the layer's Rngs without attention dropout.

``HLO_AUDIT_INJECT`` names the reverts (comma-separated) for the ``lower`` target; ``prefix`` is all three,
MaxText as it was before the fix. ``te-keeps-rngs`` does to the Transformer Engine backend what
``fp8-keeps-rngs`` does to fp8 (every recipe keeps its forked Rngs, not only NVFP4, whose stochastic rounding
draws). ``reverted(...)`` applies them in-process and undoes them on exit; TE cells lower as the maxtext
target lowers them.
"""

from __future__ import annotations

import contextlib
import os

from hlo_audit.targets import te
from hlo_audit.targets.maxtext import lower_cell, model_num_layers, te_recipe

INJECT = "HLO_AUDIT_INJECT"
REVERTS = ("fp8-keeps-rngs", "te-keeps-rngs", "dropout0-forks", "attention-holds-rngs")


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


def lower(cell):
    with reverted(*injected()), te.cross_lowering(cell, te_recipe):
        return lower_cell(cell)  # for the cell's platform: a TPU topology's devices too


def injected() -> list[str]:
    """The reverts HLO_AUDIT_INJECT names."""
    return [n for n in os.environ.get(INJECT, "").split(",") if n]


lower.full_depth = model_num_layers
