"""MaxText's real train step AOT-compiled for TPU v6e-4 on this CPU host, against MaxText's own train_compile.

llama3-8b at 4 layers, scanned. Two full compiles (about a minute of CPU each): hlo-audit's compiled TPU cell and
MaxText's own ``train_compile`` with its dump (the path its hlo_diff_test takes). Two optimized cells (seconds
each: XLA stopped before codegen): the shipped series' stage, released and with seed 000's fixes reverted
(tests/injected_maxtext.py). Each is shared by the tests here through its project's cache.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hlo_audit.cache import Cache
from hlo_audit.hlo.analysis import analyze
from in_process import hlo_audit_here
from xla_oracle import xla_counts

pytestmark = [pytest.mark.maxtext, pytest.mark.xdist_group("tpu")]

ROOT = Path(__file__).resolve().parents[1]
CELL = "llama3-8b/scan-on/none/L4/tpu-v6e-4/compiled"
OPTIMIZED_CELL = "llama3-8b/scan-on/none/L4/tpu-v6e-4/optimized"  # the shipped TPU series' cell
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
OPTIMIZED = ACCEPTANCE.replace('stage = "compiled"', 'stage = "optimized"')


def hlo_audit(cwd: Path, *args, env=None) -> subprocess.CompletedProcess:
    """A process of its own: the full TPU compiles (~1.4 GB a process, a minute or more each: the long tests)."""
    return subprocess.run([sys.executable, "-m", "hlo_audit", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=1500)


def _run_cell(project: Path, config: str, cell_id: str, cli=hlo_audit):
    (project / "hlo-audit.toml").write_text(config)
    run = cli(project, "run", "--format", "json")
    assert run.returncode == 0, run.stdout + run.stderr
    cell = {c["id"]: c for c in json.loads(run.stdout)["cells"]}[cell_id]
    text, meta = Cache(project / ".hlo-audit-cache", project=project).get_lowering(_only_key(project / ".hlo-audit-cache"))
    return project, cell, text, meta


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    return _run_cell(tmp_path_factory.mktemp("tpu"), ACCEPTANCE, CELL)


@pytest.fixture(scope="module")
def optimized(tmp_path_factory):
    return _run_cell(tmp_path_factory.mktemp("tpu-optimized"), OPTIMIZED, OPTIMIZED_CELL, hlo_audit_here)


@pytest.fixture(scope="module")
def maxtext_dump(tmp_path_factory):
    """MaxText's own train_compile of the same config, with the dump its hlo_diff_test reads; XLA's counts of it."""
    dump = tmp_path_factory.mktemp("maxtext") / "dump"
    maxtext = subprocess.run([sys.executable, str(ROOT / "scripts" / "train_compile_dump.py"), "--model", "llama3-8b",
                              "--layers", "4", "--topology", "v6e-4", "--dump", str(dump)],
                             capture_output=True, text=True, timeout=1500)
    assert maxtext.returncode == 0, maxtext.stderr[-3000:]
    return json.loads(maxtext.stdout)


@pytest.mark.long  # a full TPU compile and MaxText's own train_compile, minutes each
def test_entry_params_equal_xla_count_of_maxtexts_own_train_compile_dump(released, maxtext_dump):
    _, cell, text, meta = released
    assert (cell["status"], cell["stage"], cell["platform"], cell["topology"]) == ("ok", "compiled", "tpu", "v6e-4")
    assert cell["memory"]["argument_bytes"] > 0 and cell["cost"]["flops"] > 0
    xla = maxtext_dump
    assert xla["module"].endswith(".after_optimizations.txt")
    assert (cell["entry_params"], cell["by_dtype"]) == (xla["entry_params"], xla["by_dtype"])
    assert cell["by_dtype"]["u32"] == 13  # the optimizer step and MaxText 0.2.5's two never-drawn Rngs
    # `hlo-audit count` on MaxText's own dump files, before and after optimizations: XLA's parser's numbers.
    after = Path(xla["module"])
    before = after.with_name(after.name.replace(".after_optimizations.txt", ".before_optimizations.txt"))
    for dumped in (before, after):
        count = hlo_audit(ROOT, "count", str(dumped), "--format", "json")
        assert count.returncode == 0, count.stderr
        [ours] = json.loads(count.stdout)["modules"]
        theirs = xla_counts(dumped.read_text())
        assert (ours["entry_params"], ours["by_dtype"]) == (theirs["entry_params"], theirs["by_dtype"]), dumped.name
    # SPMD-partitioned for the topology's 4 chips: parameters hold one device's shard (embed sharded 4 ways).
    assert "num_partitions=4" in text.split("\n", 1)[0]
    embedding = next(p for p in analyze(text).params if p.path == "state.model.token_embedder.embedding")
    assert embedding.shape.dims == (128256, 1024)  # 128256 x 4096, sharded on the embed axis
    # jax's args_info passed the order check against XLA's compiled parameters and names what the text names.
    assert meta["arg_keys"] is not None
    assert [p.path for p in analyze(text, arg_keys=meta["arg_keys"]).params] == [p.path for p in analyze(text).params]


@pytest.mark.long  # a full TPU compile and MaxText's own train_compile, minutes each
def test_optimized_cell_is_the_compiled_module_before_codegen(released, optimized, maxtext_dump):
    """The shipped series' stage: the after-optimizations module MaxText's hlo_diff_test diffs, without codegen."""
    _, cell, text, meta = optimized
    assert (cell["status"], cell["stage"]) == ("ok", "optimized")
    assert (cell["entry_params"], cell["by_dtype"]) == (maxtext_dump["entry_params"], maxtext_dump["by_dtype"])
    compiled_cell, compiled_text = released[1], released[2]
    assert cell["by_role"] == compiled_cell["by_role"] and meta["arg_keys"] is not None

    def params(hlo: str, keys):
        return [(p.path, p.dtype, p.shape.dims, p.sharding) for p in analyze(hlo, arg_keys=keys).params]

    assert params(text, meta["arg_keys"]) == params(compiled_text, released[3]["arg_keys"])
    for kind in ("argument_bytes", "output_bytes", "alias_bytes"):
        assert cell["memory"][kind] == compiled_cell["memory"][kind], kind
    assert 0 <= compiled_cell["memory"]["temp_bytes"] - cell["memory"]["temp_bytes"] <= 64 << 10  # codegen scratch
    assert cell["cost"]["flops"] == compiled_cell["cost"]["flops"]


@pytest.fixture(scope="module")
def reverted(optimized, tmp_path_factory):
    """MaxText before seed 000 (its Dropout and AttentionOp fixes reverted), checked against the committed golden."""
    folder = tmp_path_factory.mktemp("reverted")
    (folder / "reverted.toml").write_text(
        f'target = "injected_maxtext:lower"\ngolden_dir = "{ROOT / "golden"}"\n' + OPTIMIZED)
    check = hlo_audit_here(folder, "check", "--config", "reverted.toml", env={"HLO_AUDIT_INJECT": "prefix"})
    text = Cache(folder / ".hlo-audit-cache").hlo_text(_only_key(folder / ".hlo-audit-cache"))
    (folder / "reverted.hlo.txt").write_text(text)
    (folder / "released.hlo.txt").write_text(optimized[2])
    diff = hlo_audit_here(folder, "diff", "reverted.hlo.txt", "released.hlo.txt", "--format", "json")
    return check, json.loads(diff.stdout), text, diff.returncode


def test_committed_tpu_golden_passes_and_reverted_seed_000_fixes_fail_it(optimized, reverted, tmp_path):
    project = optimized[0]
    # The shipped matrix's cell (same key: its module is in the cache) against the repository's golden.
    (tmp_path / "default.toml").write_text(f'golden_dir = "{ROOT / "golden"}"\ncache_dir = "{project / ".hlo-audit-cache"}"\n')
    check = hlo_audit_here(tmp_path, "check", "--config", "default.toml", "--only", f"id={OPTIMIZED_CELL}",
                           "--format", "json")
    doc = json.loads(check.stdout)
    assert check.returncode == 0, doc["findings"]
    assert [c["cached"] for c in doc["cells"]] == [True], [c["relowered_because"] for c in doc["cells"]]

    failed = reverted[0]
    assert failed.returncode == 1, failed.stdout + failed.stderr
    out = " ".join(failed.stdout.split())
    assert f"regression {OPTIMIZED_CELL} count" in out
    assert "u32 +18 (rng_count +9, rng_key +9)" in out  # 9 streams: 3 Dropouts' forks of (params, dropout, aqt)
    assert "+6 state.model.decoder.layers.mlp.dropout.rngs.* (rng_count +3, rng_key +3)" in out


def test_diff_names_what_the_fixes_dropped_and_the_seeds_count(optimized, reverted):
    """hlo-audit diff of the reverted module against the released one: 18 u32 parameters, in three Dropouts.

    Seed 000's review table said 30 for llama3_8b: the u32 arrays (rank >= 1: keys, and counts stacked by
    scan) the fixes removed from the HloModule header's entry_computation_layout, parameters and results
    together, the only place MaxText's 2000-line reference files show entry parameters. Both numbers come out.
    """
    _, record, reverted_text, _ = reverted
    assert record["entry_params"] == {"old": 74, "new": 56}
    assert record["by_dtype_delta"] == {"u32": -18}
    # AttentionOp's Rngs is the layer's own (one object, one state path): released, it is named from the layer.
    assert by_pattern(record["params_removed"]) == {
        "state.model.decoder.dropout.rngs.*": -6, "state.model.decoder.layers.dropout.rngs.*": -6,
        "state.model.decoder.layers.mlp.dropout.rngs.*": -6,
        "state.model.decoder.layers.self_attention.attention_op.rngs.*": -6}
    assert by_pattern(record["params_added"]) == {"state.model.decoder.layers.self_attention.rngs.*": 6}

    def header_u32_arrays(text: str) -> int:
        entry = analyze(text).module.entry
        shapes = [p.shape for p in entry.parameters] + list(entry.root.shape.elements)
        return sum(1 for shape in shapes if shape.dtype == "u32" and shape.dims)

    assert header_u32_arrays(reverted_text) - header_u32_arrays(optimized[2]) == 30


def test_diff_of_reverted_vs_released_optimized_modules_is_rng_state_only(reverted):
    """After optimization the header lists every parameter and output (aliases, layouts, propagation flags,
    PJRT's per-argument lists): stripped of the RNG state's entries and renumbered, nothing else differs."""
    _, record, _, returncode = reverted
    assert (record["verdict"], record["changes"], returncode) == ("rng-state-only", [], 1)
    assert record["by_dtype_delta"] == {"u32": -18}
    assert record["by_role_delta"] == {"rng_count": -9, "rng_key": -9}


def by_pattern(groups: list[dict]) -> dict[str, int]:
    """The diff's parameter groups (per pattern, role and dtype) summed per pattern."""
    counts: dict[str, int] = {}
    for group in groups:
        counts[group["pattern"]] = counts.get(group["pattern"], 0) + group["count"]
    return counts


def _only_key(cache: Path) -> str:
    """The key of the one lowering a private cache holds."""
    [meta] = list(cache.rglob("*.lowering.json"))
    return meta.name.removesuffix(".lowering.json")
