"""MaxText's real train step AOT-compiled for TPU v6e-4 on this CPU host, against MaxText's own train_compile.

Three compiles in all (about a minute of CPU each): llama3-8b at 4 layers, scanned, as hlo-audit's TPU cell
(shared by every test here through one cache), as MaxText's own ``train_compile`` with its dump (the path its
hlo_diff_test takes), and with seed 000's fixes reverted (tests/injected_maxtext.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hlo_audit.cache import Cache, lowering_key
from hlo_audit.hlo.analysis import analyze
from hlo_audit.matrix import Cell
from hlo_audit.targets.maxtext import MaxTextTarget

pytestmark = [pytest.mark.maxtext, pytest.mark.xdist_group("tpu")]

ROOT = Path(__file__).resolve().parents[1]
CELL = "llama3-8b/scan-on/none/L4/tpu-v6e-4/compiled"
# The acceptance configuration, word for word.
ACCEPTANCE = """
models = ["llama3-8b"]
scan = ["on"]
quant = ["none"]
layers = [4]
platform = "tpu"
topology = "v6e-4"
stage = "compiled"
"""


def hlo_audit(cwd: Path, *args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hlo_audit", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=1500)


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    project = tmp_path_factory.mktemp("tpu")
    (project / "hlo-audit.toml").write_text(ACCEPTANCE)
    run = hlo_audit(project, "run", "--format", "json")
    assert run.returncode == 0, run.stdout + run.stderr
    cell = {c["id"]: c for c in json.loads(run.stdout)["cells"]}[CELL]
    key = lowering_key(Cell("llama3-8b", True, "none", 4, platform="tpu", topology="v6e-4", stage="compiled"),
                       MaxTextTarget().fingerprint())
    text, meta = Cache(project / ".hlo-audit-cache").get_lowering(key)
    return project, cell, text, meta


def test_entry_params_equal_xla_count_of_maxtexts_own_train_compile_dump(released, tmp_path):
    _, cell, text, meta = released
    assert (cell["status"], cell["stage"], cell["platform"], cell["topology"]) == ("ok", "compiled", "tpu", "v6e-4")
    assert cell["memory"]["argument_bytes"] > 0 and cell["cost"]["flops"] > 0
    maxtext = subprocess.run([sys.executable, str(ROOT / "scripts" / "train_compile_dump.py"), "--model", "llama3-8b",
                              "--layers", "4", "--topology", "v6e-4", "--dump", str(tmp_path / "dump")],
                             capture_output=True, text=True, timeout=1500)
    assert maxtext.returncode == 0, maxtext.stderr[-3000:]
    xla = json.loads(maxtext.stdout)
    assert xla["module"].endswith(".after_optimizations.txt")
    assert (cell["entry_params"], cell["by_dtype"]) == (xla["entry_params"], xla["by_dtype"])
    assert cell["by_dtype"]["u32"] == 13  # the optimizer step and MaxText 0.2.5's two never-drawn Rngs
    # SPMD-partitioned for the topology's 4 chips: parameters hold one device's shard (embed sharded 4 ways).
    assert "num_partitions=4" in text.split("\n", 1)[0]
    embedding = next(p for p in analyze(text).params if p.path == "state.model.token_embedder.embedding")
    assert embedding.shape.dims == (128256, 1024)  # 128256 x 4096, sharded on the embed axis
    # jax's args_info passed the order check against XLA's compiled parameters and names what the text names.
    assert meta["arg_keys"] is not None
    assert [p.path for p in analyze(text, arg_keys=meta["arg_keys"]).params] == [p.path for p in analyze(text).params]


def test_committed_tpu_golden_passes_and_reverted_seed_000_fixes_fail_it(released, tmp_path):
    project, cell, released_text, _ = released
    # The shipped matrix's cell (same key: its compile is in the cache) against the repository's golden.
    (tmp_path / "default.toml").write_text(f'golden_dir = "{ROOT / "golden"}"\ncache_dir = "{project / ".hlo-audit-cache"}"\n')
    check = hlo_audit(tmp_path, "check", "--config", "default.toml", "--only", f"id={CELL}", "--format", "json")
    doc = json.loads(check.stdout)
    assert check.returncode == 0, doc["findings"]
    assert [c["cached"] for c in doc["cells"]] == [True]

    # MaxText before seed 000 (its Dropout and AttentionOp fixes reverted) against the same golden.
    (tmp_path / "reverted.toml").write_text(
        f'target = "injected_maxtext:lower"\ngolden_dir = "{ROOT / "golden"}"\n' + ACCEPTANCE)
    env = {"HLO_AUDIT_INJECT": "prefix", "PYTHONPATH": str(Path(__file__).parent)}
    failed = hlo_audit(tmp_path, "check", "--config", "reverted.toml", env=env)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    out = " ".join(failed.stdout.split())
    assert f"regression {CELL} count" in out
    assert "u32 +18 (rng_count +9, rng_key +9)" in out  # 9 streams: 3 Dropouts' forks of (params, dropout, aqt)
    assert "state.model.decoder.layers.mlp.dropout.rngs.* +6" in out

    # hlo-audit's diff of the two compiled modules: nothing but RNG state changed, 18 u32 dropped.
    reverted_text = Cache(tmp_path / ".hlo-audit-cache").hlo_text(_only_key(tmp_path / ".hlo-audit-cache"))
    (tmp_path / "reverted.hlo.txt").write_text(reverted_text)
    (tmp_path / "released.hlo.txt").write_text(released_text)
    diff = hlo_audit(tmp_path, "diff", "reverted.hlo.txt", "released.hlo.txt", "--format", "json")
    record = json.loads(diff.stdout)
    assert record["verdict"] == "rng-state-only", record["changes"]
    assert record["by_dtype_delta"] == {"u32": -18}
    assert {g["pattern"]: g["count"] for g in record["params_removed"]} == {
        "state.model.decoder.dropout.rngs.*": 6, "state.model.decoder.layers.dropout.rngs.*": 6,
        "state.model.decoder.layers.mlp.dropout.rngs.*": 6}


def _only_key(cache: Path) -> str:
    """The key of the one lowering a private cache holds."""
    [meta] = list(cache.rglob("*.lowering.json"))
    return meta.name.removesuffix(".lowering.json")
