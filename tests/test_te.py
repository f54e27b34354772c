"""The Transformer Engine platform module (hlo_audit/targets/te.py) against the real TE that `make setup` installs."""

from __future__ import annotations

import importlib
import importlib.util

import pytest

from hlo_audit.lowering import Unavailable
from hlo_audit.matrix import Cell
from hlo_audit.platforms.cuda import compute_capability
from hlo_audit.targets import te

TE_CELL = Cell("llama3-8b", False, "te_nvfp4_no_rht", 2, platform="cuda", device="sm_90")


@pytest.mark.parametrize("arch, number", [("sm_90", 90), ("sm_90a", 90), ("sm_100", 100), ("sm_120", 120)])
def test_compute_capability_is_the_number_te_compares(arch, number):
    assert compute_capability(arch) == number


def test_a_te_cell_without_transformer_engine_is_unavailable_saying_how_to_get_it(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "transformer_engine" else real(name, *a))
    with pytest.raises(Unavailable, match=r"Transformer Engine is not installed \(`make setup` installs it"):
        te.check_available(TE_CELL)
    te.check_available(Cell("llama3-8b", False, "int8", 2))  # other cells do not care


@pytest.mark.te
def test_te_answers_the_declared_architecture_only_while_a_cell_lowers():
    """TE's query is redirected everywhere TE bound it, then restored: outside, there is no device to ask."""
    loaded = te.load()
    gemm = importlib.import_module("transformer_engine.jax.cpp_extensions.gemm")  # the package exports gemm()
    from transformer_engine.jax.quantize import device_utils

    for arch, workspace in (("sm_90", 33_554_432), ("sm_80", 4_194_304)):  # TE: 32 MiB cuBLAS workspace from Hopper
        with te.cross_lowering(Cell("llama3-8b", False, "te_fp8_currentscaling", 2, platform="cuda", device=arch)):
            assert loaded.extension.get_device_compute_capability(0) == compute_capability(arch)
            assert gemm.get_device_compute_capability(0) == compute_capability(arch)
            assert gemm.get_cublas_workspace_size_bytes() == workspace
            assert device_utils.is_fp8_gemm_with_all_layouts_supported() is False
    with pytest.raises(RuntimeError, match="CUDA"):
        loaded.extension.get_device_compute_capability(0)


@pytest.mark.te
@pytest.mark.parametrize("quant, arch, says", [
    ("te_nvfp4_no_rht", "sm_90", "10.0 or higher required for NVFP4"),
    ("te_mxfp8", "sm_90", "9.9 or higher required for MXFP8"),
    ("te_fp8_currentscaling", "sm_90", ""),
    ("te_nvfp4", "sm_100", ""),
])
def test_the_note_is_te_s_own_support_check_for_the_declared_architecture(quant, arch, says):
    from hlo_audit.targets.maxtext import te_recipe

    with te.cross_lowering(Cell("llama3-8b", False, quant, 2, platform="cuda", device=arch), te_recipe) as notes:
        pass
    assert (says in notes[0]) if says else notes == []
