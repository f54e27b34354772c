"""One accept command per failing check (issue 40 item 2): a check prints one `golden update` that accepts every
failing cell it listed (a series' depths together), and `golden update --failing` accepts exactly the cells that
failed in the last check.

A project of its own: a jitted step whose variants (quant) named in ACCEPT_CHANGED compute one more sine (the edit
a pull request makes), through the real CLI in this process.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from in_process import Ran, hlo_audit_here
from projects import project

pytestmark = pytest.mark.xdist_group("accept")
TARGET = """
import os

import jax
import jax.numpy as jnp


def lower(cell):
    changed = cell.quant in os.environ.get("ACCEPT_CHANGED", "").split(",")

    def step(x):
        y = jnp.sin(x) * 3.0
        return jnp.sin(y) * 3.0 if changed else y

    return jax.jit(step).trace(jnp.ones((8,), jnp.float32))
"""
QUANTS = ["a", "b", "c", "d"]


def run(folder: Path, *args: str, changed: str = "") -> Ran:
    return hlo_audit_here(folder, *args, env={"ACCEPT_CHANGED": changed})


@pytest.fixture
def accepted(tmp_path) -> Path:
    """Goldens of four variants, one with a series of two depths (a), the others at one depth."""
    folder = project(tmp_path / "p", {"accept_target.py": TARGET}, target="accept_target:lower", models=["m"],
                     quant=["b", "c", "d"], layers=[1], scan=["off"],
                     matrix=[{"quant": ["a"], "layers": [1, 2]}])
    result = run(folder, "golden", "update")
    assert result.returncode == 0 and "5 written" in result.stdout, result.stdout + result.stderr
    return folder


def accept_commands(stdout: str) -> list[str]:
    return [line.strip() for line in stdout.splitlines() if "hlo-audit golden update" in line]


def test_a_check_with_three_failing_cells_prints_one_command_that_accepts_them_all(accepted):
    """Issue 40: MaxText's PR 89b8bf976 printed nine `golden update --only id=...` lines. Three variants changed
    (one of them a series of two depths: both accepted together): one command, and run as printed it clears all."""
    checked = run(accepted, "check", changed="a,b,c")
    assert checked.returncode == 1
    (command,) = accept_commands(checked.stdout)
    assert command == ("hlo-audit golden update --only id=m/scan-off/a/L1,id=m/scan-off/a/L2,id=m/scan-off/b/L1,"
                       "id=m/scan-off/c/L1"), checked.stdout
    assert "If every change above is intended, accept all 4 cells at once:" in checked.stdout
    # Each finding is still listed (its words without a command of its own), and JSON keeps each one's command.
    assert checked.stdout.count("regression  m/scan-off/") >= 4
    doc = json.loads(run(accepted, "check", "--format", "json", changed="a,b,c").stdout)
    assert doc["accept"] == {"command": command, "cells": ["m/scan-off/a/L1", "m/scan-off/a/L2", "m/scan-off/b/L1",
                                                           "m/scan-off/c/L1"]}
    assert all(f["details"]["regenerate"].startswith("hlo-audit golden update --only id=m/scan-off/")
               for f in doc["findings"] if f["severity"] == "regression")
    markdown = accepted / "summary.md"
    run(accepted, "check", "--markdown", str(markdown), changed="a,b,c")
    assert f"```\n{command}\n```" in markdown.read_text() and markdown.read_text().count("golden update") == 1
    # CI's merged shards print the same one command (the shards' findings read back from their JSON), a cell
    # without a golden included.
    (accepted / "golden/m/scan-off/d/L1.json").unlink()
    # Both reports written once both shards ran: a file left in the project folder is one of the tree the next
    # shard judges (merge compares its digest), as a CI job's checkout holds no other job's report.
    reports = {k: run(accepted, "check", "--shard", f"{k}/2", "--format", "json", changed="a,b,c").stdout
               for k in (1, 2)}
    for k, text in reports.items():
        (accepted / f"shard{k}.json").write_text(text)
    merged = run(accepted, "merge", "shard1.json", "shard2.json")
    (merged_command,) = accept_commands(merged.stdout)
    assert set(merged_command.split("--only ")[1].split(",")) == {
        *command.split("--only ")[1].split(","), "id=m/scan-off/d/L1"}, merged.stdout
    # Run as printed, it accepts all of them; the unchanged one is not rewritten.
    updated = run(accepted, *shlex.split(command)[1:], changed="a,b,c")
    assert updated.returncode == 0 and "4 written" in updated.stdout, updated.stdout + updated.stderr
    assert run(accepted, "golden", "update", "--only", "id=m/scan-off/d/L1").returncode == 0
    again = run(accepted, "check", changed="a,b,c")
    assert again.returncode == 0 and accept_commands(again.stdout) == [], again.stdout


def test_golden_update_failing_accepts_exactly_the_cells_that_failed_in_the_last_check(accepted):
    """The last check covered a and b (c changed too, outside it): --failing accepts a's series and b, not c, not
    d; the next check fails c alone."""
    assert run(accepted, "check", "--only", "quant=a,quant=b", changed="a,b,c").returncode == 1
    updated = run(accepted, "golden", "update", "--failing", changed="a,b,c")
    assert updated.returncode == 0, updated.stdout + updated.stderr
    assert "accepting the 3 cells that failed in the last check: m/scan-off/a/L1, m/scan-off/a/L2, m/scan-off/b/L1" \
        in updated.stderr and "3 written" in updated.stdout, updated.stdout + updated.stderr
    after = json.loads(run(accepted, "check", "--format", "json", changed="a,b,c").stdout)
    assert after["exit_code"] == 1 and {c for c, v in after["verdicts"].items() if v == "regression"} == {
        "m/scan-off/c/L1"}
    # That check failed c only: --failing now accepts c, and a check then passes.
    assert "1 written" in run(accepted, "golden", "update", "--failing", changed="a,b,c").stdout
    assert run(accepted, "check", changed="a,b,c").returncode == 0
    nothing = run(accepted, "golden", "update", "--failing", changed="a,b,c")
    assert nothing.returncode == 0 and "nothing to accept: no cell failed in the last check" in nothing.stdout


def one_line_error(result: Ran, *must: str) -> None:
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hlo-audit: error: ") and "Traceback" not in result.stderr
    for text in must:
        assert text in lines[0], (text, lines[0])


def test_failing_without_a_report_of_this_config_is_one_line(accepted):
    one_line_error(run(accepted, "golden", "update", "--failing"), "last-check.json: no check report here",
                   "run `hlo-audit check` first")
    assert run(accepted, "check", changed="b").returncode == 1
    one_line_error(run(accepted, "golden", "update", "--failing", "--only", "quant=b"), "give it, or --only")
    config = accepted / "hlo-audit.toml"
    config.write_text(config.read_text().replace('quant = ["b", "c", "d"]', 'quant = ["b", "c"]'))
    one_line_error(run(accepted, "golden", "update", "--failing"), "the last check was of another config")
    (accepted / ".hlo-audit-cache/last-check.json").write_text("{")
    one_line_error(run(accepted, "golden", "update", "--failing"), "not a check JSON report")
