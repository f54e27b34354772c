"""What known custom calls do with their operands, for the RNG dataflow (rng_flow.py).

A custom call is opaque to HLO: its body is a kernel. The RNG analysis treats an unknown one as a place where
RNG state goes somewhere it cannot follow (``unknown``). A target listed here has had its semantics read from
its implementation's source, so the analysis can follow values through it like any HLO op:

* which operands feed which results as **data** (a deterministic function of them);
* which operands are **seeds** of random-bit generation inside the kernel, and which results those bits reach
  (a stream whose key reaches a seed operand is drawn, as if it went through jax's threefry);
* which operands the kernel does **not read** under the call's attributes.

Each entry cites the source it was read from. Transformer Engine 2.20.2 (the pinned version): the JAX FFI
handlers are in the ``transformer-engine-jax`` sdist, ``csrc/extensions/*.cpp`` (targets registered by name in
``csrc/extensions/pybind.cpp``); the kernels in TE's ``transformer_engine/common``. The other entries come
from jax's own lowering rules.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from hlo_audit.hlo.text import Instruction


@dataclass(frozen=True)
class Flow:
    """One custom call's flow: result index -> operand indices, as data and as random-bit seeds."""

    data: Callable[[int], tuple[int, ...] | None]  # result -> operands it is computed from; None: every operand
    seeds: tuple[tuple[int, tuple[int, ...]], ...] = ()  # (operand, results its random bits decide)


def _every_operand(_result: int) -> None:
    return None


# jax's typed-FFI calls print their attributes as an MLIR dictionary: backend_config={is_dbias = false, ...}.
_FFI_ATTRIBUTE = re.compile(r"\b(\w+)\s*=\s*(true|false|-?\d+)")


def ffi_attributes(instr: Instruction) -> dict[str, str]:
    """A typed-FFI custom call's scalar attributes (``backend_config={name = value ...}``), as printed."""
    return dict(_FFI_ATTRIBUTE.findall(instr.attrs.get("backend_config", "")))


# --- Transformer Engine ----------------------------------------------------------------------------------------
# te_dbias_quantize_ffi -> DBiasQuantizeHandler (pybind.cpp:35; quantization.cpp:263-284). Operands: 0 input,
# 1 scale, 2 amax, 3 sr_rng_state, 4 post-RHT colwise amax, 5 RHT matrix. Results: 0 rowwise output, 1 colwise
# output, 2 scale_inv, 3 colwise scale_inv, 4 updated amax, 5 dbias, 6 workspace.
_QUANTIZE_SR_STATE = 3
_QUANTIZE_DATA_RESULTS = (0, 1)


def _te_dbias_quantize(instr: Instruction) -> Flow:
    """The quantized tensors, rounded stochastically when the call asks for it.

    quantization.cpp:168-178: ``quant_config.set_stochastic_rounding(stochastic_rounding)``, and only when
    ``stochastic_rounding`` is true ``quant_config.set_rng_state(sr_rng_state)``; otherwise operand 3 is never
    read. quantization.cpp:240-246: with ``is_dbias`` the call goes to ``nvte_quantize_dbias``, which takes no
    ``quant_config`` (no rounding mode, no RNG state); without it to ``nvte_quantize_v2(..., quant_config, ...)``
    (and the RHT path, quantization.cpp:180-207, passes the same ``quant_config``). In TE's NVFP4 kernels
    (common/cast/nvfp4/quantize_transpose_nvfp4.cuh:336-341, 558-567) ``rng_state[0]`` seeds and ``rng_state[1]``
    offsets a Philox4x32 generator whose bits (``get_rbits``) decide the rounding of each quantized element: the
    rowwise and colwise outputs. Scales and amaxes are computed from the input alone.
    """
    attributes = ffi_attributes(instr)
    draws = attributes.get("stochastic_rounding") == "true" and attributes.get("is_dbias") != "true"
    operands = tuple(i for i in range(len(instr.operands)) if i != _QUANTIZE_SR_STATE)
    return Flow(data=lambda _result: operands,
                seeds=((_QUANTIZE_SR_STATE, _QUANTIZE_DATA_RESULTS),) if draws else ())


# te_gemm_v2_ffi -> GemmV2Handler (pybind.cpp:80-82; gemm.cpp:406-418): lhs, lhs_scale_inv, rhs, rhs_scale_inv,
# bias, alpha, beta -> output, workspace. A cuBLASLt matmul (gemm.cpp GemmV2FFI): a deterministic function of
# its operands, with no RNG state among them.
# te_rht_amax_ffi -> RHTAmaxCalculationHandler (pybind.cpp:96-98; amax.cpp:65-75): input -> amax, post-RHT
# amax. The Hadamard transform's random sign mask is a compile-time attribute
# (``rht_matrix_random_sign_mask_t``), not drawn: a deterministic function of the input.
# AllocateBuffer: jax's lowering of ``lax.empty`` for GPU and TPU (jax/_src/lax/lax.py, _empty_custom_call_lower):
# no operands, an uninitialized buffer that TE uses for results it does not produce.
_DETERMINISTIC = frozenset({"te_gemm_v2_ffi", "te_rht_amax_ffi", "AllocateBuffer"})

_FLOWS: dict[str, Callable[[Instruction], Flow]] = {
    "te_dbias_quantize_ffi": _te_dbias_quantize,
    **{target: (lambda _instr: Flow(data=_every_operand)) for target in _DETERMINISTIC},
}



def flow(instr: Instruction) -> Flow | None:
    """The flow of a custom call whose semantics are known; None for any other."""
    build = _FLOWS.get(instr.custom_call_target)
    return build(instr) if build else None
