"""The runner on the example callable target: cache, workers, error rows, concurrent runs, scaling."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from typer.testing import CliRunner

from hlo_audit.audit import execute, normalized_text, plan, scaling
from hlo_audit.cache import Cache
from hlo_audit.cli import app
from hlo_audit.files import write_atomic
from hlo_audit.matrix import Cell
from hlo_audit.run import run_cells

TARGET = "hlo_audit.examples.nnx_mlp:lower"


@pytest.fixture
def project(tmp_path):
    (tmp_path / "hlo-audit.toml").write_text(textwrap.dedent(f"""
        target = "{TARGET}"
        models = ["mlp"]
        quant = ["none", "dropout0", "dropout", "int8"]
        layers = [2, 3]
        """))
    return tmp_path


def _run_json(project, *args):
    result = CliRunner().invoke(app, ["run", "--format", "json", "--config", str(project / "hlo-audit.toml"), *args])
    return result.exit_code, json.loads(result.stdout)


def test_run_json_and_cache(project):
    code, doc = _run_json(project)
    assert code == 0
    cells = {c["id"]: c for c in doc["cells"]}
    assert len(cells) == 16
    leak = cells["mlp/scan-off/dropout0/L3"]
    assert (leak["status"], leak["entry_params"], leak["by_dtype"], leak["rng_params"]) == (
        "ok", 13, {"f32": 7, "u32": 6}, 6)
    assert leak["by_role"] == {"input": 1, "rng_count": 3, "rng_key": 3, "weight": 6}
    assert leak["groups"]["state.layers.*.dropout.rngs.*"] == 6
    assert leak["constants"]["captured"]["arrays"] == 0  # a train step takes its state: it closes over none
    assert leak["slope_per_layer"] == 4  # kernel, bias, key, count per unrolled layer
    assert cells["mlp/scan-on/dropout0/L3"]["slope_per_layer"] == 0
    unavailable = cells["mlp/scan-off/int8/L2"]
    assert unavailable["status"] == "unavailable" and "no quantization 'int8'" in unavailable["message"]
    assert not any(c["cached"] for c in doc["cells"])
    # The same run again is served from the cache; --no-cache lowers again.
    code, again = _run_json(project)
    assert all(c["cached"] for c in again["cells"] if c["status"] == "ok")
    assert [c["entry_params"] for c in again["cells"]] == [c["entry_params"] for c in doc["cells"]]
    _, fresh = _run_json(project, "--no-cache", "--only", "quant=none")
    assert not any(c["cached"] for c in fresh["cells"])


def test_jobs_give_the_same_results(project):
    _, serial = _run_json(project, "--only", "scan=off", "--no-cache")
    _, parallel = _run_json(project, "--only", "scan=off", "--no-cache", "--jobs", "2")
    strip = [{k: v for k, v in c.items() if k != "lower_seconds"} for c in serial["cells"]]
    assert strip == [{k: v for k, v in c.items() if k != "lower_seconds"} for c in parallel["cells"]]


def test_broken_cell_is_an_error_row_and_the_rest_completes(tmp_path):
    (tmp_path / "broken.py").write_text(textwrap.dedent(f"""
        from {TARGET.split(':')[0]} import lower as real

        def lower(cell):
            if cell.layers == 3:
                raise RuntimeError("layer 3 is cursed")
            return real(cell)
        """))
    (tmp_path / "hlo-audit.toml").write_text('target = "broken:lower"\nmodels = ["mlp"]\nquant = ["none"]\n'
                                             'scan = ["off"]\nlayers = [2, 3]\n')
    result = subprocess.run([sys.executable, "-m", "hlo_audit", "run", "--format", "json"], cwd=tmp_path,
                            capture_output=True, text=True)
    assert result.returncode == 1
    cells = {c["id"]: c for c in json.loads(result.stdout)["cells"]}
    assert cells["mlp/scan-off/none/L2"]["status"] == "ok"
    assert cells["mlp/scan-off/none/L3"]["status"] == "error"
    assert "RuntimeError: layer 3 is cursed" in cells["mlp/scan-off/none/L3"]["message"]


def test_bad_target_is_a_usage_error(tmp_path):
    (tmp_path / "hlo-audit.toml").write_text('target = "no_such_module:lower"\nmodels = ["m"]\n')
    result = CliRunner().invoke(app, ["run", "--config", str(tmp_path / "hlo-audit.toml")])
    assert result.exit_code in (1, 2)
    assert "no_such_module" in result.output and "Traceback" not in result.output


def test_concurrent_runs_share_a_cache(project):
    """Two runs at once on one cache: both complete, every entry is whole, a third run is all hits."""
    command = [sys.executable, "-m", "hlo_audit", "run", "--format", "json", "--only", "scan=on"]
    procs = [subprocess.Popen(command, cwd=project, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outputs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs
    cache = project / ".hlo-audit-cache"
    assert not list(cache.rglob("*.tmp"))
    for path in cache.rglob("*.json"):
        json.loads(path.read_text())
    _, doc = _run_json(project, "--only", "scan=on")
    assert all(c["cached"] for c in doc["cells"] if c["status"] == "ok")


def test_scaling_projection_equals_a_real_lowering(project):
    p = plan(str(project / "hlo-audit.toml"), only="quant=dropout0", layers="2,3,full")
    results = list(execute(p))
    assert {r.cell.layers for r in results} == {2, 3, 8}
    by_id = {r.cell.id: r for r in results}
    shallow = [r for r in results if r.cell.layers < 8]
    for series in scaling(p, shallow):
        full = by_id[series.cell.id.replace("/L2", "/L8")]
        projected = series.projected()
        assert projected["layers"] == 8
        assert projected["entry_params"] == full.entry_params
        assert projected["by_dtype"] == full.summary.by_dtype
        assert projected["by_role"] == full.summary.by_role


def test_a_cached_result_carries_its_verified_canonical_text(tmp_path):
    """What check and golden update compare and write comes with the result, read and verified with it: they never
    read the cache themselves (a truncated text there is a miss, not a golden)."""
    cell = Cell("mlp", False, "dropout0", 2, target=TARGET)
    (fresh,) = run_cells([cell], Cache(tmp_path))
    (cached,) = run_cells([cell], Cache(tmp_path))
    assert cached.cached and not fresh.cached and cached.key == fresh.key
    assert cached.normalized == fresh.normalized and normalized_text(cached) == fresh.normalized


def test_write_atomic_replaces_whole(tmp_path):
    target = tmp_path / "a" / "b.json"
    write_atomic(target, "one")
    write_atomic(target, "two")
    assert target.read_text() == "two" and [p.name for p in target.parent.iterdir()] == ["b.json"]


def test_compiled_stage_reads_the_optimized_module(tmp_path):
    """stage = "compiled": the post-optimization module (fusions), same entry parameters and attribution."""
    (tmp_path / "hlo-audit.toml").write_text(f'target = "{TARGET}"\nmodels = ["mlp"]\nquant = ["dropout0"]\n'
                                             'scan = ["off"]\nlayers = [2]\nstage = "compiled"\n')
    p = plan(str(tmp_path / "hlo-audit.toml"))
    (result,) = list(execute(p))
    assert result.cell.id == "mlp/scan-off/dropout0/L2/compiled"
    assert result.status == "ok" and result.entry_params == 9
    assert result.summary.groups["state.layers.*.dropout.rngs.*"] == 4
    assert result.opcodes.get("fusion:f32", 0) > 0  # optimized HLO, not the lowering
