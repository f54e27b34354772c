"""MaxText's vocabulary, as the config validates it and the MaxText target lowers it: quantizations, Transformer
Engine recipes, AQT's modes, the steps. Data only (no MaxText import), so validating a config costs nothing.
"""

from __future__ import annotations

# MaxText 0.2.5's QuantizationType values ("" spelled "none"); a test keeps this equal to MaxText's enum.
MAXTEXT_QUANTIZATIONS = (
    "none", "fp4", "int4", "int8", "intmp", "fp8_e5m2", "fp8_e4m3", "fp8", "nanoo_fp8", "fp8_nanoo", "fp8_gpu",
    "fp8_full", "te_no_quant", "te_fp8_delayedscaling", "te_fp8_currentscaling", "te_mxfp8", "te_nvfp4",
    "te_nvfp4_no_rht", "serve_fp8_weight",
)
TE_RECIPES = ("te_fp8_currentscaling", "te_fp8_delayedscaling", "te_mxfp8", "te_nvfp4", "te_nvfp4_no_rht")
TRAIN_STEP = "train"
# MaxEngine's steps (maxtext.inference.maxengine): what an inference cell lowers.
INFERENCE_STEPS = ("prefill", "generate", "insert")
STEPS = (TRAIN_STEP, *INFERENCE_STEPS)
# AQT's modes as MaxEngine selects them: "serve" when the checkpoint is already quantized
# (checkpoint_is_quantized -> quant_mode_str "serve"), else "train". ("convert" is a checkpoint-conversion
# utility's mode, not a step MaxEngine runs.)
QUANT_MODES = ("train", "serve")
# MaxText 0.2.5's quantizations that configure_quantization backs with AQT, the only ones with a serve mode.
AQT_QUANTIZATIONS = ("int8", "intmp")
# MaxText's max_prefill_predict_length default (base.yml): the prompt length an inference cell prefills.
DEFAULT_PREFILL = 64


def is_transformer_engine(quant: str) -> bool:
    """MaxText's Transformer Engine quantizations (te_no_quant included): they exist only for CUDA."""
    return quant.startswith("te_")
