"""Did the gate see the change (issue 46, items 1, 2 and 4): `check --changes PATCH` says which changed lines each
cell's lowering reached and which of them its program names, and the changed lines of model code no cell reached
are the ``unreached`` rule's finding (advisory by default, ``fail`` for a gate that must see every line, waived by
path), with what would reach them where that is plain.

The model of the issue: a block whose second path runs only from layer 4 on, a gate matrix of 2 layers; every diff
here is git's own, of a real edit to a real repository.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from in_process import hlo_audit_here
from projects import config
from projects import edit as _edit
from projects import git as _git

MODEL = """\
import pathlib

import jax
import jax.numpy as jnp

SETTINGS = pathlib.Path(__file__).with_name("settings.yml")


def block(h, kernel, layer_index):
    h = jnp.tanh(h @ kernel)
    if layer_index >= 3:
        h = h * 0.5
        h = jnp.sin(h)
    return h


def unused_helper(h):
    return h * 3.0


def loss(params, x):
    h = x
    for layer_index, layer in enumerate(params):
        h = block(h, layer["kernel"], layer_index)
    return jnp.mean(h ** 2)


def lower(cell):
    width = int(SETTINGS.read_text().split("width:")[1].split()[0])

    def step(params, x):
        value, grads = jax.value_and_grad(loss)(params, x)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), value

    params = [{"kernel": jnp.zeros((width, width))} for _ in range(cell.layers)]
    return jax.jit(step).lower(params, jnp.ones((2, width)))
"""
SETTINGS = "# the model's settings\nwidth: 8\nname: tiny\n"
# What ran is heard line by line through sys.monitoring (Python 3.12+); on 3.11 a used module counts whole.
LINES = pytest.mark.skipif(sys.version_info < (3, 12), reason="lines are heard through sys.monitoring (3.12+)")
DEEP_LINE = 12  # `h = h * 0.5`: under `if layer_index >= 3` (line 11), run by a 4-layer cell only
TANH_LINE = 10  # `h = jnp.tanh(h @ kernel)`: every cell runs it


def _committed(folder: Path, files: dict[str, str], **settings) -> Path:
    """``folder`` as a git repository holding ``files``, an hlo-audit.toml of ``config(**settings)`` and the goldens
    it makes, committed: the base a pull request is made against."""
    for name, text in {**files, ".gitignore": ".hlo-audit-cache/\n"}.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    (folder / "hlo-audit.toml").write_text(config(**settings))
    made = hlo_audit_here(folder, "golden", "update")
    assert made.returncode == 0, made.stderr
    _git(folder, "init", "-q", ".")
    _git(folder, "add", "-A")
    _git(folder, "commit", "-qm", "base")
    return folder


@pytest.fixture()
def repo(tmp_path: Path) -> Path:
    """A git repository holding the model, its settings and a gate of 2 layers (matrix 2 and 4), goldens made at
    both depths and committed: the base a pull request is made against."""
    return _committed(tmp_path, {"model.py": MODEL, "settings.yml": SETTINGS, "README.md": "# tiny\n",
                                 "tests/test_model.py": "def test_nothing():\n    assert True\n"},
                      target="model:lower", models=["m"], layers=[2, 4], scan=["off"])


def _check(repo: Path, *args: str) -> tuple[int, dict]:
    (repo / "pr.diff").write_text(_git(repo, "diff", "HEAD"))
    ran = hlo_audit_here(repo, "check", "--changes", "pr.diff", "--format", "json", *args)
    assert ran.returncode in (0, 1), ran.stderr
    return ran.returncode, json.loads(ran.stdout)


def _unreached(report: dict) -> list[dict]:
    return [f for f in report["findings"] if f["rule"] == "unreached"]


@LINES
def test_a_line_only_a_deeper_cell_runs_is_unreached_by_the_2_layer_gate(repo):
    """The issue's case: the pull request edits the path from layer 4 on; the gate lowers 2 layers. The check is
    green, and says the line reached no cell, where it is and what would reach it."""
    _edit(repo / "model.py", "h = h * 0.5", "h = h * 0.25")
    code, report = _check(repo, "--layers", "2")
    assert code == 0
    coverage = report["coverage"]
    assert coverage["unreached"] == [f"model.py:{DEEP_LINE}"]
    assert coverage["reached"] == {"m/scan-off/none/L2": []} and coverage["in_program"] == {"m/scan-off/none/L2": []}
    [finding] = _unreached(report)
    assert finding["severity"] == "advisory"
    assert finding["message"].startswith(f"1 changed line of model code reached no cell's lowering (of 1 cell): "
                                         f"model.py:{DEEP_LINE} (under `if layer_index >= 3` at model.py:11: "
                                         f"m/scan-off/none/L2 ran it, none taking the branch: a deeper cell of that "
                                         f"series would reach it (m/scan-off/none/L4 in the matrix))"), finding
    hint = coverage["runs"][0]["hint"]
    assert (hint["kind"], hint["axis"], hint["deeper"]) == ("branch", "layers", ["m/scan-off/none/L4"])


@LINES
def test_the_deeper_cell_reaches_it_and_its_program_shows_it(repo):
    """With the 4-layer cell in the run, the line is reached and named by its program, which changed: the check
    fails on that cell's golden, and no line is unreached."""
    _edit(repo / "model.py", "h = h * 0.5", "h = h * 0.25")
    code, report = _check(repo)
    assert code == 1
    coverage = report["coverage"]
    assert coverage["unreached"] == [] and not _unreached(report)
    assert coverage["reached"] == {"m/scan-off/none/L2": [], "m/scan-off/none/L4": [f"model.py:{DEEP_LINE}"]}
    assert coverage["in_program"]["m/scan-off/none/L4"] == [f"model.py:{DEEP_LINE}"]


@LINES
def test_a_traced_line_edited_to_the_same_program_is_reached_not_unreached(repo):
    _edit(repo / "model.py", "h = jnp.tanh(h @ kernel)", "h = jnp.tanh(jnp.matmul(h, kernel))")
    code, report = _check(repo, "--layers", "2")
    assert code == 0 and not _unreached(report)
    coverage = report["coverage"]
    assert coverage["reached"] == {"m/scan-off/none/L2": [f"model.py:{TANH_LINE}"]}
    assert coverage["in_program"] == {"m/scan-off/none/L2": [f"model.py:{TANH_LINE}"]}
    shown = hlo_audit_here(repo, "check", "--changes", "pr.diff", "--layers", "2")
    assert (f"model.py:{TANH_LINE} ran in 1 of 1 cell (m/scan-off/none/L2), in the program of m/scan-off/none/L2"
            in shown.stdout), shown.stdout


@LINES
@pytest.mark.parametrize("settings, severity, code", [
    ({"policy": {"unreached": "fail"}}, "regression", 1),
    ({"policy": {"unreached": "off"}}, None, 0),
    ({"waive": [{"rule": "unreached", "path": "model.py", "reason": "the deep path is tested elsewhere"}]},
     "waived", 0),
    ({"waive": [{"rule": "unreached", "path": "other/*.py", "reason": "not this file"}],
      "policy": {"unreached": "fail"}}, "regression", 1),
])
def test_the_policy_decides_and_waivers_name_paths(repo, settings, severity, code):
    (repo / "hlo-audit.toml").write_text(config(target="model:lower", models=["m"], layers=[2, 4], scan=["off"],
                                                **settings))
    _git(repo, "commit", "-qam", "policy")
    _edit(repo / "model.py", "h = h * 0.5", "h = h * 0.25")
    got, report = _check(repo, "--layers", "2")
    assert got == code
    assert [f["severity"] for f in _unreached(report)] == ([severity] if severity else [])
    assert not [f for f in report["findings"] if f["rule"] == "stale_waiver"]


def test_a_waiver_of_unreached_names_a_path_not_cells(repo):
    (repo / "hlo-audit.toml").write_text(config(target="model:lower", models=["m"], layers=[2], scan=["off"],
                                                waive=[{"rule": "unreached", "model": "m", "reason": "r"}]))
    ran = hlo_audit_here(repo, "check")
    assert ran.returncode == 2
    assert "waive[0].model: unknown key (match on path)" in ran.stderr, ran.stderr


def test_a_yaml_line_a_cell_read_is_reached(repo):
    _edit(repo / "settings.yml", "name: tiny", "name: small")
    code, report = _check(repo, "--layers", "2")
    assert code == 0 and not _unreached(report)
    assert report["coverage"]["reached"] == {"m/scan-off/none/L2": ["settings.yml:3"]}


def test_comments_docstrings_tests_and_docs_are_not_model_code(repo):
    _edit(repo / "model.py", "def unused_helper(h):\n", "def unused_helper(h):\n    \"\"\"Three times.\"\"\"\n\n"
                                                         "    # scaled\n")
    _edit(repo / "README.md", "# tiny", "# tiny model")
    _edit(repo / "tests" / "test_model.py", "assert True", "assert 1")
    _edit(repo / "settings.yml", "# the model's settings", "# the model's own settings")
    code, report = _check(repo, "--layers", "2")
    assert code == 0 and not _unreached(report)
    assert report["coverage"]["runs"] == []
    assert report["coverage"]["not_model_code"] == ["README.md", "tests/test_model.py"]


@LINES
def test_a_function_no_cell_called_is_named(repo):
    _edit(repo / "model.py", "return h * 3.0", "return h * 4.0")
    _, report = _check(repo, "--layers", "2")
    [finding] = _unreached(report)
    assert "model.py:18 (in unused_helper() at model.py:17, which no cell called)" in finding["message"], finding


def test_a_served_cell_keeps_what_it_reached(repo):
    """The second check is served from the cache: its cells' reach comes with them."""
    _edit(repo / "model.py", "h = jnp.tanh(h @ kernel)", "h = jnp.tanh(jnp.matmul(h, kernel))")
    first = _check(repo, "--layers", "2")[1]["coverage"]
    served = _check(repo, "--layers", "2")[1]
    assert served["cells"][0]["cached"] is True
    assert served["coverage"] == first


@pytest.mark.parametrize("given, said", [
    ("missing.diff", "--changes missing.diff: cannot be read"),
    ("garbage.diff", "garbage.diff: not a unified diff"),
])
def test_a_bad_patch_is_one_line_and_exit_2_before_any_cell_runs(repo, given, said):
    (repo / "garbage.diff").write_text("--- a/model.py\n+++ b/model.py\n@@ -x +y @@\n")
    ran = hlo_audit_here(repo, "check", "--changes", given)
    assert ran.returncode == 2
    assert said in ran.stderr and "lowered" not in ran.stderr, ran.stderr
    assert len(ran.stderr.strip().splitlines()) == 1, ran.stderr


@LINES
def test_merged_shards_say_what_the_whole_matrix_reached(repo):
    """Each shard knows its own cells: a line a cell of another shard ran is unreached in this one. The merge judges
    the union (reached by any shard's cells, unreached where none reached), as the unsharded check does."""
    _edit(repo / "model.py", "h = h * 0.5", "h = h * 0.25")
    _edit(repo / "model.py", "return h * 3.0", "return h * 4.0")
    whole = _check(repo)[1]
    out = repo.parent / f"{repo.name}-reports"  # outside the project: its tree is what each shard records
    out.mkdir()
    shards = []
    for index in (1, 2):
        ran = hlo_audit_here(repo, "check", "--changes", "pr.diff", "--shard", f"{index}/2", "--format", "json")
        assert ran.returncode in (0, 1), ran.stderr
        (out / f"shard{index}.json").write_text(ran.stdout)
        shards.append(json.loads(ran.stdout))
    # The deep line is unreached in the shard without the 4-layer cell: that shard alone would say so.
    assert any(f"model.py:{DEEP_LINE}" in s["coverage"]["unreached"] for s in shards)
    merged = hlo_audit_here(out, "merge", "shard1.json", "shard2.json", "--format", "json")
    assert merged.returncode == 1, merged.stderr  # the 4-layer cell's program changed
    report = json.loads(merged.stdout)
    for key in ("reached", "in_program", "unreached"):
        assert report["coverage"][key] == whole["coverage"][key], key
    assert report["coverage"]["unreached"] == ["model.py:18"]
    assert [(f["severity"], f["message"]) for f in _unreached(report)] == \
        [(f["severity"], f["message"]) for f in _unreached(whole)]
    half = json.loads((out / "shard1.json").read_text())
    (out / "shard1.json").write_text(json.dumps({k: v for k, v in half.items() if k != "coverage"}))
    mixed = hlo_audit_here(out, "merge", "shard1.json", "shard2.json")
    assert mixed.returncode == 2 and "some shards were checked with --changes and some without" in mixed.stderr


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="Python 3.11: no sys.monitoring, files are what is heard")
def test_without_sys_monitoring_a_module_a_cell_used_counts_whole(repo):
    """Conservative where lines cannot be heard: every changed line of a module the cell used is reached, and the
    report says its cells knew files, not lines."""
    _edit(repo / "model.py", "h = h * 0.5", "h = h * 0.25")
    code, report = _check(repo, "--layers", "2")
    assert code == 0 and not _unreached(report)
    assert report["coverage"]["reached"] == {"m/scan-off/none/L2": [f"model.py:{DEEP_LINE}"]}
    assert report["coverage"]["by_file"] == ["m/scan-off/none/L2"]


@LINES
def test_a_new_call_of_a_helper_the_path_already_calls_is_placed_at_the_new_call(repo):
    """Issue 47, item 1: two identical calls of one helper are told apart by the change alone (which copy a match
    calls inserted is the match's guess); with the pull request's changed lines, the finding is at the new call."""
    _edit(repo / "model.py", '        h = block(h, layer["kernel"], layer_index)\n',
          '        h = block(h, layer["kernel"], layer_index)\n        h = block(h, layer["kernel"], layer_index)\n')
    new_call = 25
    assert (repo / "model.py").read_text().splitlines()[new_call - 1].strip().startswith("h = block(")
    code, report = _check(repo, "--layers", "2")
    assert code == 1
    [size] = [f for f in report["findings"] if f["rule"] == "program_size"]
    assert f"at model.py:{new_call} (" in size["message"], size["message"]
    assert report["coverage"]["in_program"] == {"m/scan-off/none/L2": [f"model.py:{new_call}"]}


def test_a_module_no_cell_loaded_is_unreached_and_said_so(repo):
    """A model's module the matrix never imports (another model's code): its changed lines reached no cell, and the
    finding says no lowering loaded the file."""
    (repo / "other_model.py").write_text("import jax.numpy as jnp\n\n\ndef other(h):\n    return jnp.cos(h)\n")
    _git(repo, "add", "other_model.py")
    _git(repo, "commit", "-qm", "another model")
    _edit(repo / "other_model.py", "jnp.cos(h)", "jnp.sin(h)")
    code, report = _check(repo, "--layers", "2")
    assert code == 0
    [finding] = _unreached(report)
    assert "other_model.py:5 (in a file no cell's lowering loaded)" in finding["message"], finding["message"]


@LINES
def test_every_line_of_a_statement_that_ran_is_reached(repo):
    """Python hears the lines of a statement that hold code, not a closing bracket: a multi-line call that ran is
    reached on each of its lines."""
    _edit(repo / "model.py", "    return jax.jit(step).lower(params, jnp.ones((2, width)))\n",
          "    return jax.jit(step).lower(\n        params,\n        jnp.ones((2, width)),\n    )\n")
    code, report = _check(repo, "--layers", "2")
    assert code == 0 and not _unreached(report), report["coverage"]
    assert report["coverage"]["reached"] == {"m/scan-off/none/L2": ["model.py:36-39"]}


@LINES
def test_a_finding_whose_stacks_pass_no_changed_line_says_so(repo):
    """The pull request changes a config value (settings.yml's width): every instruction's shape changes, and none
    of their stacks passes a changed line. The findings say so, rather than read as if the line they name changed."""
    _edit(repo / "settings.yml", "width: 8", "width: 16")
    code, report = _check(repo, "--layers", "2")
    assert code == 1
    assert report["coverage"]["reached"] == {"m/scan-off/none/L2": ["settings.yml:2"]}
    placed = [f for f in report["findings"] if " at model.py:" in f["message"]]
    assert placed and all("(no changed line in its stack)" in f["message"] for f in placed), placed
    unchanged = hlo_audit_here(repo, "check", "--layers", "2", "--format", "json")
    assert "no changed line" not in unchanged.stdout  # without the diff, nothing is said of changed lines


def test_a_scanned_body_s_change_is_placed_in_the_body_not_at_the_scan_call(tmp_path):
    """Issue 47, item 1: an op added inside a block that nnx.scan runs. Its loop state's get-tuple-elements and calls
    are placed at the scan call (jax's place for them); the program's growth is placed at the block's new line, with
    or without the pull request's diff."""
    source = Path(__file__).resolve().parent.parent / "hlo_audit" / "examples" / "nnx_mlp.py"
    _committed(tmp_path, {"mlp.py": source.read_text()}, target="mlp:lower", models=["mlp"], layers=[2], scan=["on"])
    _edit(tmp_path / "mlp.py", "        x = nnx.relu(self.linear(x))\n",
          "        x = nnx.relu(self.linear(x))\n        x = x * jax.numpy.tanh(x)\n")
    new_line = 1 + (tmp_path / "mlp.py").read_text().splitlines().index("        x = x * jax.numpy.tanh(x)")
    without = json.loads(hlo_audit_here(tmp_path, "check", "--format", "json").stdout)
    with_diff = _check(tmp_path)[1]
    for report in (without, with_diff):
        [size] = [f for f in report["findings"] if f["rule"] == "program_size"]
        # jax 0.10 gives the body's new ops no line of their own: placed near it, by the ops next to them.
        assert re.search(rf"\b(at|near) mlp\.py:{new_line}\b", size["message"]), size["message"]
        assert "mlp.py:38" not in size["message"]  # never at the scan call


def test_a_scanned_body_carrying_rng_state_keeps_its_places(tmp_path):
    """A scanned body whose loop carries RNG keys (dropout): stripping the RNG state rewrites the body under a new
    name, and its instructions' places went with the old one, so every change in it read "near" the scan call
    (MaxText's gemma4-26b scan-on at 2c4910630: "near nnx_scan.py:136", never moe.py). Kept through the stripping."""
    source = Path(__file__).resolve().parent.parent / "hlo_audit" / "examples" / "nnx_mlp.py"
    (tmp_path / "mlp.py").write_text(source.read_text())
    (tmp_path / "hlo-audit.toml").write_text(config(target="mlp:lower", models=["mlp"], layers=[2], scan=["on"],
                                                    quant=["dropout"]))
    assert hlo_audit_here(tmp_path, "golden", "update").returncode == 0
    _edit(tmp_path / "mlp.py", "        x = nnx.relu(self.linear(x))\n",
          "        x = nnx.relu(self.linear(x))\n        x = x * jax.numpy.tanh(x)\n")
    new_line = 1 + (tmp_path / "mlp.py").read_text().splitlines().index("        x = x * jax.numpy.tanh(x)")
    report = json.loads(hlo_audit_here(tmp_path, "check", "--format", "json").stdout)
    placed = [f["message"] for f in report["findings"] if f["rule"] in ("program_size", "ops")]
    assert placed and all(re.search(rf"\b(at|near) mlp\.py:{new_line}\b", m) for m in placed), placed
    assert not any("mlp.py:38" in m for m in placed), placed  # the scan call


BRANCHES = """\
import jax
import jax.numpy as jnp


def loss(params, x, scan):
    h = x
    if scan:
        h = h * 3.0
    for kernel in params[:0]:
        h = h @ kernel
    if h.ndim == 2:
        h = jnp.tanh(h @ params[0])
    else:
        h = h * 2.0
    return jnp.mean(h ** 2)


def lower(cell):
    params = [jnp.zeros((8, 8)) for _ in range(cell.layers)]
    return jax.jit(lambda p, x: jax.grad(loss)(p, x, cell.scan)).lower(params, jnp.ones((2, 8)))
"""


@LINES
def test_what_would_reach_a_branch_a_loop_and_an_else_no_cell_took(tmp_path):
    """Issue 46, item 4: the statement around unreached lines that the cells ran, and the axis its condition reads
    (scan: a cell with the other setting); a loop no cell iterated; the else of an if every cell took."""
    _committed(tmp_path, {"model.py": BRANCHES}, target="model:lower", models=["m"], layers=[2], scan=["off"])
    for old, new in (("h * 3.0", "h * 4.0"), ("h = h @ kernel", "h = h @ kernel.T"), ("h * 2.0", "h * 5.0")):
        _edit(tmp_path / "model.py", old, new)
    code, report = _check(tmp_path)
    assert code == 0
    hints = {run["place"]: run["hint"] for run in report["coverage"]["runs"]}
    assert {place: (hint["kind"], hint["axis"], hint["where"]) for place, hint in hints.items()} == {
        "model.py:8": ("branch", "scan", "model.py:7"), "model.py:10": ("loop", "", "model.py:9"),
        "model.py:14": ("else", "", "model.py:11")}
    [finding] = _unreached(report)
    assert "a cell with the other scan setting would reach it" in finding["message"]
    assert "in a loop over `params[:0]` at model.py:9: m/scan-off/none/L2 ran it, none iterating" in \
        finding["message"]
    assert "in the else of `if h.ndim == 2` at model.py:11: m/scan-off/none/L2 ran it, each taking the if" in \
        finding["message"]
