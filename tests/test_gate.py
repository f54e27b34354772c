"""Goldens and the gate, end to end through the CLI, on the example callable target (a small NNX MLP).

The CLI runs in this process (tests/in_process.py); a test starts a process where that is what it tests (a killed
update, the pytest plugin's entry point) or where the project brings its own target module."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from in_process import Ran, hlo_audit_here
from projects import DROPOUT_WAIVER, config

MATRIX = {"quant": ["none", "dropout0", "int8"], "layers": [2, 3]}
CONFIG = config(**MATRIX, waive=[DROPOUT_WAIVER])


def hlo_audit(project: Path, *args, env=None) -> Ran:
    return hlo_audit_here(project, *args, env=env)


def hlo_audit_process(project: Path, *args) -> subprocess.CompletedProcess:
    """A process of its own: the project's own target module (broken.py) is imported fresh, as a user's run does."""
    return subprocess.run([sys.executable, "-m", "hlo_audit", *args], cwd=project, capture_output=True, text=True,
                          timeout=600)


def flat(text: str) -> str:
    """Table output with its wrapping undone: findings wrap inside their column to fit 100 columns."""
    return " ".join(text.split())


def snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def updated(tmp_path_factory):
    """The project after `golden update` (goldens and its cache), made once per worker."""
    folder = tmp_path_factory.mktemp("gate")
    (folder / "hlo-audit.toml").write_text(CONFIG)
    result = hlo_audit(folder, "golden", "update")
    assert result.returncode == 0, result.stderr
    return folder


@pytest.fixture
def project(updated, tmp_path):
    """A copy of the updated project of the test's own."""
    shutil.copytree(updated, tmp_path, dirs_exist_ok=True)
    return tmp_path


@pytest.mark.maxtext  # needs MaxText (make compat's environment has none)
def test_update_twice_is_byte_identical_and_check_passes(project):
    first = snapshot(project / "golden")
    assert "mlp/scan-off/dropout0/L2.json" in first and "mlp/scan-off/dropout0/L2.hlo.txt" in first
    assert "mlp/scan-off/dropout0/L3.hlo.txt" in first  # a text per cell (issue 26)
    assert not any("int8" in name for name in first)  # unavailable cells write nothing
    again = hlo_audit(project, "golden", "update", "--no-cache")
    assert again.returncode == 0 and "0 written, 8 unchanged" in again.stdout
    assert snapshot(project / "golden") == first
    record = json.loads(first["mlp/scan-off/dropout0/L2.json"])
    assert record["environment"]["jax"] == "0.12.0.1" and record["slopes"]["by_role"]["rng_key"] == 1
    result = hlo_audit(project, "check")
    assert result.returncode == 0, result.stdout
    assert "passed" in result.stdout and "8 cells" not in result.stdout  # 12 cells: 8 ok + 4 unavailable


def _edit(path: Path, **changes):
    record = json.loads(path.read_text())
    for key, value in changes.items():
        section, _, name = key.partition("__")
        if name:
            record[section][name] = value
        else:
            record[section] = value
    path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")


def test_count_ratchet(project):
    golden = project / "golden/mlp/scan-off/dropout0/L3.json"
    # The golden's counts edited together (each table adds up to its entry_params: a golden's claims are checked).
    _edit(golden, by_dtype__u32=4, by_role__rng_key=2, by_role__rng_count=2, entry_params=11,
          **{"by_dtype_role__u32:rng_key": 2, "by_dtype_role__u32:rng_count": 2})
    result = hlo_audit(project, "check")
    assert result.returncode == 1
    assert "mlp/scan-off/dropout0/L3" in flat(result.stdout) and "u32 +2" in flat(result.stdout)
    # The accept command names the whole depth series: each depth's golden holds the series' slopes.
    assert ("hlo-audit golden update --only id=mlp/scan-off/dropout0/L2,id=mlp/scan-off/dropout0/L3"
            in flat(result.stdout))
    _edit(golden, by_dtype__u32=8, by_role__rng_key=4, by_role__rng_count=4, entry_params=15,
          **{"by_dtype_role__u32:rng_key": 4, "by_dtype_role__u32:rng_count": 4})
    result = hlo_audit(project, "check")
    out = flat(result.stdout)
    assert result.returncode == 0 and "improvement" in out and "tighten the golden" in out


def test_rng_scaling_waiver_and_policy(project):
    result = hlo_audit(project, "check", "--verbose")
    assert "waived" in flat(result.stdout) and "never-drawn dropout stream on purpose" in flat(result.stdout)
    toml = project / "hlo-audit.toml"
    toml.write_text(config(**MATRIX))
    result = hlo_audit(project, "check")
    assert result.returncode == 1 and "RNG parameters grow by 2 per layer" in flat(result.stdout)
    toml.write_text(config(**MATRIX, policy={"rng_scaling": "warn"}))
    assert hlo_audit(project, "check").returncode == 0


@pytest.mark.maxtext  # needs MaxText (make compat's environment has none)
def test_hlo_text_gate_and_environment(project):
    text = project / "golden/mlp/scan-on/none/L2.hlo.txt"
    text.write_text(text.read_text().replace("multiply(", "add(", 1))
    result = hlo_audit(project, "check")
    assert result.returncode == 1 and "normalized HLO differs from the golden" in flat(result.stdout)
    _edit(project / "golden/mlp/scan-on/none/L2.json", environment__jax="0.11.0")
    result = hlo_audit(project, "check")
    out = flat(result.stdout)
    assert result.returncode == 0 and "advisory" in out and "jax 0.11.0 -> 0.12.0.1" in out


def test_missing_and_stale_goldens(project):
    (project / "golden/mlp/scan-on/none/L3.json").unlink()
    # A golden of a cell no longer in the matrix: one hlo-audit wrote (its "cell" names its path), moved there.
    stale = project / "golden/mlp/scan-on/fp8/L2.json"
    stale.parent.mkdir(parents=True)
    record = json.loads((project / "golden/mlp/scan-on/none/L2.json").read_text())
    stale.write_text(json.dumps({**record, "cell": "mlp/scan-on/fp8/L2", "hlo": None}, indent=1, sort_keys=True))
    not_golden = project / "golden/mlp/scan-on/fp8/L3.json"  # JSON, but not hlo-audit's: never stale, never pruned
    not_golden.write_text("{}\n")
    result = hlo_audit(project, "check", "--format", "json")
    assert result.returncode == 1
    doc = json.loads(result.stdout)
    by_cell = {(f["cell"], f["severity"]) for f in doc["findings"]}
    assert ("mlp/scan-on/none/L3", "regression") in by_cell
    assert ("mlp/scan-on/fp8/L2", "stale") in by_cell and not any(c == "mlp/scan-on/fp8/L3" for c, _ in by_cell)
    pruned = hlo_audit(project, "golden", "update", "--prune")
    assert "1 pruned" in pruned.stdout and f"pruned {stale}" in pruned.stdout and not stale.exists()
    assert not_golden.read_text() == "{}\n"
    assert hlo_audit(project, "check").returncode == 0


def test_ci_outputs(project, tmp_path):
    (project / "golden/mlp/scan-off/none/L2.json").unlink()
    summary = tmp_path / "step-summary.md"
    summary.write_text("before\n")
    result = hlo_audit(project, "check", "--junit", "out.xml", "--markdown", "out.md",
                       env={"GITHUB_STEP_SUMMARY": str(summary)})
    assert result.returncode == 1
    suite = ET.parse(project / "out.xml").getroot()
    assert suite.get("tests") == "12" and suite.get("failures") == "1" and suite.get("skipped") == "4"
    failed = [c for c in suite if c.find("failure") is not None]
    assert failed[0].get("name") == "scan-off/none/L2"
    markdown = (project / "out.md").read_text()
    assert "**failed**" in markdown and "`mlp/scan-off/none/L2`" in markdown
    assert summary.read_text() == "before\n" + markdown


def test_shards_merge_to_the_full_report(project):
    (project / "golden/mlp/scan-off/none/L2.json").unlink()
    full = json.loads(hlo_audit(project, "check", "--format", "json").stdout)
    # Written once both ran: a report left in the project folder is a file of the tree the next shard judges.
    reports = {k: hlo_audit(project, "check", "--shard", f"{k}/2", "--format", "json").stdout for k in (1, 2)}
    for k, text in reports.items():
        (project / f"shard{k}.json").write_text(text)
    merged = hlo_audit(project, "merge", "shard1.json", "shard2.json", "--format", "json")
    assert merged.returncode == 1
    doc = json.loads(merged.stdout)

    def key(f):
        return (f["cell"], f["severity"], f["rule"])

    assert sorted(map(key, doc["findings"])) == sorted(map(key, full["findings"]))
    bad = hlo_audit(project, "merge", "hlo-audit.toml")
    assert bad.returncode == 2 and "not a check JSON report" in bad.stderr


def test_a_killed_update_leaves_goldens_intact(project):
    golden = project / "golden"
    # Make every summary stale, so an update that ran to the end would rewrite them all.
    for path in golden.rglob("*.json"):
        _edit(path, opcodes={})
    before = snapshot(golden)
    # The same model, one second slower per cell, so the kill lands while cells are being lowered.
    (project / "slow.py").write_text(textwrap.dedent("""
        import time
        from hlo_audit.examples.nnx_mlp import lower as real

        def lower(cell):
            time.sleep(1)
            return real(cell)
        """))
    (project / "hlo-audit.toml").write_text(config(target="slow:lower", **MATRIX, waive=[DROPOUT_WAIVER]))
    proc = subprocess.Popen([sys.executable, "-m", "hlo_audit", "golden", "update", "--no-cache"], cwd=project,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(6)  # jax imported, some cells lowered, more to go
    assert proc.poll() is None, "update finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert snapshot(golden) == before
    assert not [p for p in project.iterdir() if "staging" in p.name]


def test_failing_cell_writes_nothing(project, tmp_path):
    (project / "broken.py").write_text(textwrap.dedent("""
        from hlo_audit.examples.nnx_mlp import lower as real

        def lower(cell):
            if cell.quant == "dropout0":
                raise RuntimeError("cannot build this one today")
            return real(cell)
        """))
    (project / "hlo-audit.toml").write_text(config(target="broken:lower", **MATRIX, waive=[DROPOUT_WAIVER]))
    before = snapshot(project / "golden")
    for path in (project / "golden").rglob("dropout0/*.json"):
        _edit(path, opcodes={})
    edited = snapshot(project / "golden")
    result = hlo_audit_process(project, "golden", "update")
    assert result.returncode == 1 and "skipped mlp/scan-off/dropout0/L2: error" in flat(result.stdout)
    after = snapshot(project / "golden")
    assert {k for k in after if "dropout0" in k and after[k] != before[k]} == {
        k for k in edited if "dropout0" in k and edited[k] != before[k]}


@pytest.mark.long  # make test's budget (stop 46): each lowers in processes of its own now
def test_pytest_plugin_runs_cells_as_items(project):
    result = subprocess.run([sys.executable, "-m", "pytest", "--hlo-audit", "-n", "2", "-p", "no:cacheprovider",
                             "-q", "-rs"], cwd=project, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:]
    assert "8 passed, 4 skipped" in result.stdout
    (project / "golden/mlp/scan-on/none/L2.json").unlink()
    result = subprocess.run([sys.executable, "-m", "pytest", "--hlo-audit", "-n", "2", "-p", "no:cacheprovider",
                             "-q"], cwd=project, capture_output=True, text=True, timeout=600)
    assert result.returncode == 1 and "FAILED hlo-audit::mlp/scan-on/none/L2" in result.stdout


def test_check_table_is_a_one_screen_summary(project):
    result = hlo_audit(project, "check")
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["series", "entry", "params", "u32", "dead", "rng", "verdict"]
    rows = {line.split()[0]: line.split() for line in lines[1:7]}
    # 2 and 3 unrolled layers: 9 and 13 entry params, 4 and 6 u32, all of it dead (Dropout(0.0) never draws);
    # waived by the config's reason.
    # Depths as L2: 9, L3: 13 (an arrow is golden -> now only).
    assert " ".join(rows["mlp/scan-off/dropout0/L2,3"][1:]) == "L2: 9, L3: 13 L2: 4, L3: 6 L2: 4, L3: 6 waived"
    assert " ".join(rows["mlp/scan-on/none/L2,3"][1:]) == "L2: 3, L3: 3 L2: 0, L3: 0 L2: 0, L3: 0 ok"
    assert "4 cells unavailable: nnx_mlp has no quantization 'int8'" in result.stdout
    assert lines[-1].startswith("hlo-audit check passed: 12 cells")
    assert len(lines) <= 12


def test_a_broken_golden_is_a_finding_and_update_heals_it(project):
    """A damaged golden gates nothing, so it is a failing finding (not a crash, not a pass); `golden update`
    rewrites it. (More damage kinds: tests/test_golden_store.py.)"""
    golden = project / "golden/mlp/scan-on/none/L2.json"
    good = golden.read_text()
    for damage, why in [('{"entry_params": 3}\n', "not a golden summary: missing 'by_dtype'"),
                        ("{not json", "unreadable golden")]:
        golden.write_text(damage)
        result = hlo_audit(project, "check", "--format", "json")
        # Nothing on stderr but the log's lines per cell (piped stderr: docs/ci.md).
        assert result.returncode == 1, result.stderr
        assert all(line.startswith("hlo-audit: cell ") for line in result.stderr.splitlines()), result.stderr
        (finding,) = [f for f in json.loads(result.stdout)["findings"] if f["cell"] == "mlp/scan-on/none/L2"]
        assert (finding["severity"], finding["rule"]) == ("regression", "missing_golden")
        assert f"{golden}: {why}" in finding["message"]
        assert "golden update --only id=mlp/scan-on/none/L2,id=mlp/scan-on/none/L3" in finding["message"]
    healed = hlo_audit(project, "golden", "update")
    assert healed.returncode == 0 and "rewrote mlp/scan-on/none/L2: its golden was damaged" in healed.stdout
    assert golden.read_text() == good


def test_dead_rng_policy_fails_on_never_drawn_streams_unless_a_pattern_waiver_accepts_them(project):
    """The example's dropout0 cells carry a Dropout(0.0) stream per layer that is never drawn."""
    toml = project / "hlo-audit.toml"
    toml.write_text(config(**MATRIX, policy={"dead_rng": "fail"}, waive=[DROPOUT_WAIVER]))
    result = hlo_audit(project, "check", "--format", "json")
    doc = json.loads(result.stdout)
    dead = {f["cell"]: f for f in doc["findings"] if f["rule"] == "dead_rng"}
    assert result.returncode == 1
    assert set(dead) == {"mlp/scan-off/dropout0/L2", "mlp/scan-off/dropout0/L3", "mlp/scan-on/dropout0/L2",
                         "mlp/scan-on/dropout0/L3"}
    assert {f["severity"] for f in dead.values()} == {"regression"}
    # Unrolled, 3 layers: 3 streams, 6 entry parameters and one counter increment per stream per step.
    assert dead["mlp/scan-off/dropout0/L3"]["details"]["dead_params"] == 6
    assert "3 RNG streams never drawn: 6 entry parameters" in dead["mlp/scan-off/dropout0/L3"]["message"]
    toml.write_text(config(**MATRIX, policy={"dead_rng": "fail"}, waive=[DROPOUT_WAIVER, {
        "rule": "dead_rng", "pattern": "layers*.dropout.rngs", "reason": "Dropout(0.0) kept on purpose"}]))
    result = hlo_audit(project, "check", "--format", "json")
    assert result.returncode == 0, result.stdout
    waived = [f for f in json.loads(result.stdout)["findings"] if f["rule"] == "dead_rng"]
    assert len(waived) == 4 and {f["severity"] for f in waived} == {"waived"}
