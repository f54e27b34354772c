"""Findings that say what happened, in the model's terms (issue 38): a small MoE train step (microbatch scan, loss
scaling, a cond-skipped update, a load-balancing aux loss) and a KV-cache decode step (tests/moe_steps.py) as a
callable target, each change checked against its base's golden through `hlo-audit check` (or the diff of the two
lowerings, as `hlo-audit diff` reads them): growth is never an improvement, a finding's numbers agree with the
model (2 layers are 2 layers), and each change is named as its own kind.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import moe_steps as ms
from in_process import hlo_audit_here

pytestmark = pytest.mark.xdist_group("model_terms")

CONFIG = """target = "moe_steps:target"
models = ["{model}"]
scan = ["off"]
quant = {quants}
layers = [{layers}]
{extra}"""


def cell(model: str, variant: str, layers: int) -> str:
    return f"{model}/scan-off/{variant}/L{layers}"


def write_config(project: Path, model: str, quants, layers: int, extra: str = "") -> None:
    (project / "hlo-audit.toml").write_text(CONFIG.format(model=model, quants=json.dumps(list(quants)),
                                                          layers=layers, extra=extra))


def golden_of_base_for(golden: Path, base: str, variant: str, suffix: str = "") -> None:
    """The base cell's golden (record and text) as the variant's: the change checked against what its base accepted.
    ``suffix``: ``/compiled`` for a compiled stage's golden."""
    record = json.loads((golden / f"{base}{suffix}.json").read_text())
    mine = golden / f"{variant}{suffix}.json"
    mine.parent.mkdir(parents=True, exist_ok=True)
    mine.write_text(json.dumps({**record, "cell": f"{variant}{suffix}"}, indent=1) + "\n")
    shutil.copy(golden / f"{base}{suffix}.hlo.txt", golden / f"{variant}{suffix}.hlo.txt")


def check(project: Path) -> tuple[int, dict]:
    ran = hlo_audit_here(project, "check", "--format", "json")
    assert ran.returncode in (0, 1), ran.stderr[-3000:]
    return ran.returncode, json.loads(ran.stdout)


def test_a_donated_kv_cache_that_doubled_is_no_donation_improvement(tmp_path):
    """The decode step's donated KV cache of twice the length, compiled: alias bytes double because the donated
    buffers did (no parameter newly donated). That is the cache's shapes and the memory that grew, regressions;
    never "[improvement donation]". Without a text compared, the arguments that grew by as much say the same."""
    shutil.copy(ms.__file__, tmp_path / "moe_steps.py")
    extra = 'stage = "compiled"\n[policy]\nmemory = "fail"\n'
    write_config(tmp_path, "decode", ["base"], 1, extra)
    assert hlo_audit_here(tmp_path, "golden", "update").returncode == 0
    golden, base, doubled = tmp_path / "golden", cell("decode", "base", 1), cell("decode", "cache_doubled", 1)
    golden_of_base_for(golden, base, doubled, "/compiled")
    alias = json.loads((golden / f"{base}/compiled.json").read_text())["memory"]["alias_bytes"]
    assert alias >= 2 * 16 * 2 * 8 * 4  # the two donated caches, f32[16,2,8] each
    write_config(tmp_path, "decode", ["base", "cache_doubled"], 1, extra)
    for with_text in (True, False):
        if not with_text:
            record = json.loads((golden / f"{doubled}/compiled.json").read_text())
            (golden / f"{doubled}/compiled.json").write_text(json.dumps({**record, "hlo": None}))
            (golden / f"{doubled}/compiled.hlo.txt").unlink()
        code, report = check(tmp_path)
        mine = [f for f in report["findings"] if f["cell"] == f"{doubled}/compiled" and f["severity"] != "ok"]
        assert code == 1 and report["verdicts"][f"{doubled}/compiled"] == "regression", mine
        assert not [f for f in mine if f["severity"] == "improvement"], mine
        assert not [f for f in mine if f["rule"] == "donation"], mine
        (memory,) = [f for f in mine if f["rule"] == "memory"]
        assert memory["severity"] == "regression", memory
        if with_text:
            (shapes,) = [f for f in mine if f["rule"] == "shapes"]
            inputs = [c for c in shapes["details"]["changes"] if c["subject"] == "inputs"]
            assert inputs and set(inputs[0]["place"]["paths"]) == {"cache.k", "cache.v"}, shapes
