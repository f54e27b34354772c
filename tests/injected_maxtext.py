"""MaxText's train step with seed 000's RNG fixes reverted on demand, for the gate's end-to-end tests.

``HLO_AUDIT_INJECT`` names what to revert, comma-separated (MaxText 0.2.5 carries all three fixes):

* ``fp8-keeps-rngs``: the quantization bridge. The fp8 backend (which never draws at apply time) claims it needs
  its RNGs again, so every quantized dot's ToNNX wrapper keeps its forked Rngs.
* ``dropout-keeps-fork``: Dropout. ``linears.Dropout`` keeps its fork of the caller's Rngs at rate 0 too, where
  ``nnx.Dropout`` returns its input before touching it.
* ``attention-op-keeps-rngs``: AttentionOp holds the Rngs it is given whatever its dropout rate (the fix keeps
  them only where the cudnn_flash_te bridge can draw: attention dropout on).
* ``seed-000``: all three, i.e. MaxText as it was before seed 000's change.

The reverted bodies are MaxText's own code as it stood before the fix (the lines the fix changed), not stand-ins.
"""

from __future__ import annotations

import functools
import inspect
import os

from hlo_audit.targets.maxtext import lower_cell, model_num_layers

INJECT = "HLO_AUDIT_INJECT"
SEED_000 = ("fp8-keeps-rngs", "dropout-keeps-fork", "attention-op-keeps-rngs")


def injected() -> set[str]:
    names = {n.strip() for n in os.environ.get(INJECT, "").split(",") if n.strip()}
    if "seed-000" in names:
        names |= set(SEED_000)
    unknown = names - set(SEED_000) - {"seed-000"}
    if unknown:
        raise ValueError(f"{INJECT}: unknown injection {sorted(unknown)[0]!r} (known: seed-000, {', '.join(SEED_000)})")
    return names


def lower(cell):
    apply()
    return lower_cell(cell)


def apply() -> None:
    """Revert what HLO_AUDIT_INJECT names in the MaxText this process imported."""
    names = injected()
    if "fp8-keeps-rngs" in names:
        from maxtext.layers import quantizations

        quantizations.Fp8Quantization.needs_apply_rngs = True
    if "dropout-keeps-fork" in names:
        _dropout_keeps_its_fork()
    if "attention-op-keeps-rngs" in names:
        _attention_op_keeps_its_rngs()


def _dropout_keeps_its_fork() -> None:
    from flax import nnx
    from maxtext.layers import linears

    def __init__(self, rate, *, broadcast_dims=(), deterministic=False, rng_collection="dropout", rngs=None):
        # linears.Dropout.__init__ before seed 000: the fork is kept whatever the rate.
        self.rate = rate
        self.broadcast_dims = broadcast_dims
        self.deterministic = deterministic
        self.rng_collection = rng_collection
        if not isinstance(rngs, nnx.Rngs):
            raise TypeError(f"rngs must be a Rngs, RngStream or None, but got {type(rngs)}.")
        self.rngs = rngs.fork() if hasattr(type(rngs), "fork") else rngs

    linears.Dropout.__init__ = __init__


def _attention_op_keeps_its_rngs() -> None:
    from flax import nnx
    from maxtext.layers import attention_op

    released = attention_op.AttentionOp.__init__
    if getattr(released, "keeps_rngs", False):
        return
    signature = inspect.signature(released)

    @functools.wraps(released)
    def __init__(self, *args, **kwargs):
        released(self, *args, **kwargs)
        # Before seed 000: `self.rngs = rngs`, held for the cudnn_flash_te bridge even with no dropout to draw.
        # (nnx.data: the released __init__ made the attribute static by assigning None first.)
        self.rngs = nnx.data(signature.bind(self, *args, **kwargs).arguments.get("rngs"))

    __init__.keeps_rngs = True
    attention_op.AttentionOp.__init__ = __init__


lower.full_depth = model_num_layers
