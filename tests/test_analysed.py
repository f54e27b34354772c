"""What a result keeps of its analysis (``hlo_audit.analysed``) is the HLO core's own record, typed: each
``of(core object).to_record()`` equals the core object's ``to_record()`` on real modules, and the results cache's
records (``CellResult.to_record`` / ``from_record``) round-trip, main's included (results.json of the
unchanged-outputs scenario: the example MLP as main 8e0abfb lowered it)."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from hlo_audit.analysed import BY_NAME, Constants, Launches, Param, RngSummary, Role, StreamVerdict
from hlo_audit.hlo.analysis import analyze
from hlo_audit.hlo.launch_model import module_launches
from hlo_audit.results import CellResult, LoweredCell, Status

sys.path.insert(0, str(Path(__file__).resolve().parent))
import unchanged_outputs as scenarios

ROOT = Path(__file__).resolve().parent.parent
GPU_TEXT = ROOT / "golden-gpu/llama3-8b/scan-off/te_fp8_currentscaling/L2/cuda-h100/compiled.hlo.txt"
INT8_TEXT = ROOT / "golden/llama3-8b/scan-off/int8/L2.hlo.txt"


@pytest.mark.parametrize("path", [GPU_TEXT, INT8_TEXT], ids=["gpu-compiled", "int8-lowered"])
def test_each_record_is_the_core_s_own(path):
    analysis = analyze(path.read_text(), path.name)
    assert [Param.of(p).to_record() for p in analysis.params] == [p.to_record() for p in analysis.params]
    rng = RngSummary.of(analysis.rng)
    assert rng.to_record() == analysis.rng.to_record()
    assert rng.to_record(with_streams=False) == analysis.rng.to_record(with_streams=False)
    assert rng.carried and all(p.verdict is StreamVerdict.CARRIED for p in rng.dead_patterns)
    assert Constants.of(analysis.constants).to_record() == analysis.constants.to_record()
    launches = module_launches(analysis.module, analysis.params)
    assert Launches.of(launches).to_record() == launches.to_record()
    for typed in (rng, Constants.of(analysis.constants), Launches.of(launches), *map(Param.of, analysis.params)):
        assert type(typed).from_record(typed.to_record()) == typed


def test_the_results_cache_record_round_trips_main_s_records():
    entries = json.loads((scenarios.DATA / "mlp" / "results.json").read_text())
    assert {e["record"]["status"] for e in entries} == {"ok", "unavailable"}
    for entry in entries:
        result = CellResult.from_record(entry["record"])
        assert result.to_record() == entry["record"]
        assert isinstance(result.status, Status) and isinstance(result, LoweredCell) == (result.status == "ok")
        assert all(isinstance(p.role, Role) for p in getattr(result, "params", ()))
    ok = next(CellResult.from_record(e["record"]) for e in entries if e["record"]["rng"])
    assert ok.rng_params == ok.summary.by_role.get("rng_key", 0) + ok.summary.by_role.get("rng_count", 0) > 0


def test_a_parameter_recorded_without_its_layer_prefix_is_found_by_name():
    param = Param(index=0, path="state.layers_0.w", role="weight", dtype="f32", dims=(2,), bytes=8,
                  pattern="state.layers_*.w", layer_prefix="state.layers_*")
    record = {k: v for k, v in param.to_record().items() if k != "layer_prefix"}
    assert Param.from_record(record).layer_prefix is BY_NAME
    assert replace(param, layer_prefix=None).role is Role.WEIGHT


def test_a_result_is_of_its_kind_and_only_a_lowered_cell_holds_an_analysis():
    """The class is the status: a record reads back as the kind its status names, with what that kind holds; a cell
    that did not lower writes the analysis fields empty, as main did, and holds none of them."""
    from hlo_audit.results import FailedCell, UnavailableCell

    entries = json.loads((scenarios.DATA / "mlp" / "results.json").read_text())
    unavailable = next(e["record"] for e in entries if e["record"]["status"] == "unavailable")
    result = CellResult.from_record(unavailable)
    assert type(result) is UnavailableCell and result.refused and not result.ok
    assert not any(hasattr(result, name) for name in ("summary", "params", "rng", "memory", "text", "host", "cached"))
    failed = FailedCell(cell=result.cell, message="boom", key="k", warnings=("w",), config_refused=True)
    assert failed.status is Status.ERROR and failed.refused
    record = failed.to_record()
    assert record == {**unavailable, "status": "error", "message": "boom", "key": "k", "warnings": ["w"]}
    again = CellResult.from_record(json.loads(json.dumps(record)))
    assert type(again) is FailedCell and not again.config_refused  # what the record never kept
    with pytest.raises(TypeError, match="made as its kind"):
        CellResult(cell=result.cell)
