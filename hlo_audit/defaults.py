"""The built-in default matrix and every config key's default: what a config that leaves a key out gets (and, with
no config at all, the matrix hlo-audit gates MaxText with: 122 cells, ``golden/``)."""

from __future__ import annotations

from hlo_audit import platforms
from hlo_audit.targets.vocab import DEFAULT_PREFILL, TE_RECIPES

DEFAULT_CONFIG_FILE = "hlo-audit.toml"
# The config keys naming a platform's devices (topology; cuda_arch, gpu, gpus, gpu_target), each read by its platform.
DEVICE_KEYS = platforms.CONFIG_KEYS

# The axes of a series: top-level keys give the first series and the defaults of every [[matrix]] entry.
AXIS_KEYS = ("models", "scan", "quant", "quant_mode", "layers", "step", "batch", "seq", "prefill", "platform",
             *DEVICE_KEYS, "stage", "overrides")

DEFAULTS: dict = {
    "target": "maxtext",
    "models": ["llama3-8b", "qwen3-1.7b", "deepseek3-test"],
    "scan": ["on", "off"],
    "quant": ["none", "int8", "fp8", "nanoo_fp8"],
    "quant_mode": ["train"],
    "layers": [2, 4],
    "step": ["train"],
    "batch": 1,
    "seq": 128,
    "prefill": DEFAULT_PREFILL,
    "platform": "cpu",
    **{key: [] for key in DEVICE_KEYS},
    "stage": "lowered",
    "cache_dir": ".hlo-audit-cache",
    "golden_dir": "golden",
    # deepseek3-test keeps its first 3 layers dense; at the matrix's shallow depths that would leave no MoE
    # layer (MaxText fails on a negative MoE count when scanned), so the default matrix keeps one dense.
    # Quantized, its MoE layer's megablox Pallas kernel asserts on the test model's small dims
    # ("v=512 bv=1024"), so the grouped matmul goes through jax's ragged_dot instead.
    "overrides": {"deepseek3-test": {"first_num_dense_layers": "1", "megablox": "False"}},
    # Further series, each a table of axis keys over the top-level ones (the built-in default's; a config that
    # sets its own top-level axes and no `matrix` has none of them).
    "matrix": [
        # Transformer Engine recipes, cross-lowered for CUDA on any host for a declared GPU architecture.
        # Attention is pinned: MaxText's "autoselected" resolves to dot_product on a CPU mesh but to tokamax's
        # Pallas-Triton flash kernel on a GPU one, so unpinned the same cell would be another program on a GPU host.
        {"quant": list(TE_RECIPES), "platform": "cuda", "cuda_arch": ["sm_90"],
         "overrides": {"llama3-8b": {"attention": "dot_product"}, "qwen3-1.7b": {"attention": "dot_product"},
                       "deepseek3-test": {"first_num_dense_layers": "1", "megablox": "False",
                                          "attention": "dot_product"}}},
        # MaxText's own HLO gate (its tests/integration/hlo_diff_test.py): the three stock model configs
        # (deepseek3-test keeps its 3 dense layers) through XLA's TPU compiler for v6e-4 (libtpu) at 4 layers,
        # batch 1, seq 128; scanned as that test runs them, and unrolled, where seed 000's leak grew. Stage
        # optimized: the after-optimizations module that test diffs, without the TPU codegen it never reads.
        {"models": ["deepseek3-test", "llama3-8b", "qwen3-1.7b"], "quant": ["none"], "layers": [4],
         "platform": "tpu", "topology": ["v6e-4"], "stage": "optimized", "overrides": {}},
        # Inference: MaxEngine's prefill and decode step, unquantized and AQT int8 (quantizing on every call),
        # then int8 on pre-quantized weights (serve mode), which needs a series of its own. One depth: what a
        # decode step bakes in is gated per cell, and nothing in it scales with depth the way train RNG state did.
        {"models": ["llama3-8b"], "quant": ["none", "int8"], "step": ["prefill", "generate"], "layers": [2]},
        {"models": ["llama3-8b"], "quant": ["int8"], "quant_mode": "serve", "step": ["prefill", "generate"],
         "layers": [2]},
    ],
    # TE's NVFP4 with the Hadamard transform fuses it into the cast only for rows % 64 and columns % 128, and
    # refuses anything else ("eligible for RHT cast fusion"); deepseek3-test's MoE dims (576) do not fit, on any GPU.
    "exclude": [{"model": "deepseek3-test", "quant": "te_nvfp4"}],
    "policy": {},
    # The stock NNX target's model descriptions (target = "nnx"; targets/nnx_spec.py reads it).
    "nnx": {},
    "waive": [
        {"rule": "rng_scaling", "quant": "int8",
         "reason": "MaxText's AQT int8 keeps a private RNG stream per quantized dot by design: its "
                   "rng_type jax.uniform draws at apply time (seed 000)"},
        *({"rule": "rng_scaling", "model": "deepseek3-test", "quant": quant,
           "reason": "MaxText 0.2.5 leak found by this gate: MoeBlock's quant_einsums (wi_0, wi_1, wo from "
                     "create_fp8_einsum) keep forked RNG streams that fp8 never draws, 18 u32 per MoE layer; "
                     "drop this waiver when MaxText releases them"} for quant in ("fp8", "nanoo_fp8")),
        *({"rule": "rng_scaling", "quant": quant,
           "reason": "MaxText 0.2.5's TE bridge keeps a forked Rngs per NVFP4 dot, and TE draws it: sr_rng seeds "
                     "the stochastic rounding of the DGRAD quantizer (hlo-audit rng: its params streams are drawn "
                     "by te_dbias_quantize_ffi). Drawn, but it need not be per layer: seed 001 (one shared RNG "
                     "stream for the bridged NVFP4 quantizers) takes llama3-8b unrolled from 2231 to 887 entry "
                     "parameters; drop this waiver when MaxText ships it"}
          for quant in ("te_nvfp4", "te_nvfp4_no_rht")),
    ],
}
