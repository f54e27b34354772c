"""A `check` climbs back up the layers at most 5 times (issue 38's acceptance; issue 28 asked the same): the walk
``scripts/layer_walk.py`` records as it runs, on a two-cell project of the example decoder with a warm cache. Each
climb it once made and no longer does is named, so one coming back says which."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from hlo_audit import layers
from in_process import hlo_audit_here

WALK = Path(__file__).resolve().parent.parent / "scripts" / "layer_walk.py"
CONFIG = """target = "hlo_audit.examples.decoder:lower"
models = ["nnxjit"]
quant = ["none", "leak"]
scan = ["off"]
layers = [2]
batch = 2
seq = 16

[overrides]
nnxjit = {d = 32, heads = 2, ffn = 64, vocab = 64}
"""
# Climbs a check once made (issue 38, item 2): the gate calling back a lambda of audit, the shard's record asking
# plan, the formats calling a lazy property of the outcome, keep_check asking the cache before the formats.
GONE = {("judging.gate", "audit"), ("plan", "judging.gate"), ("judging.outcome", "report.words"), ("cache.store", "merge")}


def test_a_check_climbs_back_up_at_most_five_times(tmp_path):
    (tmp_path / "hlo-audit.toml").write_text(CONFIG)
    assert hlo_audit_here(tmp_path, "golden", "update").returncode == 0
    assert hlo_audit_here(tmp_path, "check").returncode == 0  # the walk is of a warm cache
    spec = importlib.util.spec_from_file_location("layer_walk", WALK)
    walk = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(walk)
    visits = walk.walk(str(tmp_path), "check")
    climbs = {(a, b) for a, b in zip(visits, visits[1:]) if layers.layer_of(b) > layers.layer_of(a)}
    assert "judging.gate" in visits and "judging.outcome" in visits and "report.terminal" in visits, visits  # the walk saw a check
    assert len(climbs) <= 5, sorted(climbs)
    assert not climbs & GONE, sorted(climbs & GONE)
