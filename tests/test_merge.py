"""`hlo-audit merge` (issue 22 items 4 and 7): it knows how many shards the run had and from which matrix, and every
malformed input is one line and exit 2.

Real shards: `check --shard K/N --format json` of the example callable target (8 cells in 4 depth series) through
the real CLI; the malformed inputs are those shards damaged one way each.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest

from in_process import Ran, hlo_audit_here
from projects import config

# One xdist worker runs the module, so the shards fixture lowers and checks once.
pytestmark = pytest.mark.xdist_group("merge")
CONFIG = config(quant=["none", "dropout0"], layers=[2, 3])


def hlo_audit(project: Path, *args) -> Ran:
    return hlo_audit_here(project, *args)


def one_line_error(result: Ran, *must: str) -> str:
    assert result.returncode == 2, (result.returncode, result.stdout[-2000:], result.stderr[-2000:])
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("hlo-audit: error: "), result.stderr
    for text in must:
        assert text in lines[0], (text, lines[0])
    return lines[0]


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """The example's goldens (one of them removed, so the run has a failing finding) and its check reports: the
    full run, its 2 shards, and the 3 shards of `--only quant=none` (2 series: the dealing leaves shard 3 empty)."""
    project = tmp_path_factory.mktemp("merge")
    (project / "hlo-audit.toml").write_text(CONFIG)
    assert hlo_audit(project, "golden", "update").returncode == 0
    (project / "golden/mlp/scan-off/none/L2.json").unlink()
    runs = {"full": ()} | {f"{k}of2": ("--shard", f"{k}/2") for k in (1, 2)} | {
        f"none{k}of3": ("--only", "quant=none", "--shard", f"{k}/3") for k in (1, 2, 3)}
    reports = {}
    for name, args in runs.items():
        result = hlo_audit(project, "check", *args, "--format", "json")
        assert result.returncode in (0, 1), result.stderr
        reports[name] = result.stdout
    # Written once every shard has run: a report left in the project folder is a file of the tree the next shard
    # judges (its digest, what merge compares), as a CI job's checkout never holds another job's report.
    for name, text in reports.items():
        (project / f"{name}.json").write_text(text)
    return project


def doc(project: Path, name: str) -> dict:
    return json.loads((project / f"{name}.json").read_text())


def test_each_shard_records_k_of_n_and_the_matrix(shards):
    full, one, two = (doc(shards, n) for n in ("full", "1of2", "2of2"))
    assert full["shard"]["index"] == full["shard"]["count"] == 1 and full["shard"]["cells"] == 8
    assert (one["shard"]["index"], one["shard"]["count"], two["shard"]["index"]) == (1, 2, 2)
    assert one["shard"]["matrix"] == two["shard"]["matrix"] == full["shard"]["matrix"]
    assert one["shard"]["cells"] + two["shard"]["cells"] == 8 == len(one["cells"]) + len(two["cells"])
    empty = doc(shards, "none3of3")
    assert empty["shard"]["cells"] == 0 and empty["cells"] == [] and empty["shard"]["matrix"] != full["shard"]["matrix"]


def test_the_shards_merge_to_the_full_report_and_the_merge_merges_again(shards):
    full = doc(shards, "full")
    result = hlo_audit(shards, "merge", "1of2.json", "2of2.json", "--format", "json")
    assert result.returncode == 1  # the removed golden
    merged = json.loads(result.stdout)

    def key(f):
        return f["cell"], f["severity"], f["rule"], f["message"]

    assert sorted(map(key, merged["findings"])) == sorted(map(key, full["findings"]))
    assert sorted(c["id"] for c in merged["cells"]) == sorted(c["id"] for c in full["cells"])
    assert merged["shard"] == full["shard"]
    (shards / "merged.json").write_text(result.stdout)
    assert hlo_audit(shards, "merge", "merged.json").returncode == 1
    assert hlo_audit(shards, "merge", "2of2.json", "1of2.json").returncode == 1  # any order


def test_an_empty_shard_is_fine_when_the_dealing_left_it_empty(shards):
    result = hlo_audit(shards, "merge", "none1of3.json", "none2of3.json", "none3of3.json", "--format", "json")
    assert result.returncode == 1, result.stderr
    assert len(json.loads(result.stdout)["cells"]) == 4
    one_line_error(hlo_audit(shards, "merge", "none1of3.json", "none2of3.json"), "shard 3/3 missing")


def test_a_missing_repeated_or_foreign_shard_is_an_error(shards):
    one_line_error(hlo_audit(shards, "merge", "1of2.json"), "shard 2/2 missing", "given: 1/2")
    one_line_error(hlo_audit(shards, "merge", "1of2.json", "1of2.json"), "shard 1/2 is given twice")
    one_line_error(hlo_audit(shards, "merge", "1of2.json", "2of2.json", "2of2.json"), "shard 2/2 is given twice")
    one_line_error(hlo_audit(shards, "merge", "1of2.json", "none2of3.json"), "none2of3.json", "another shard count")
    other = doc(shards, "2of2")
    other["shard"]["matrix"] = "0123456789abcdef"
    (shards / "foreign.json").write_text(json.dumps(other))
    one_line_error(hlo_audit(shards, "merge", "1of2.json", "foreign.json"), "foreign.json", "another matrix")


def test_a_shard_that_lost_cells_is_an_error(shards):
    lost = doc(shards, "1of2")
    lost["cells"] = lost["cells"][1:]
    (shards / "lost.json").write_text(json.dumps(lost))
    one_line_error(hlo_audit(shards, "merge", "lost.json", "2of2.json"), "lost.json", "says 4 cells but lists 3")
    lost["shard"]["cells"] = 3
    (shards / "lost.json").write_text(json.dumps(lost))
    one_line_error(hlo_audit(shards, "merge", "lost.json", "2of2.json"), "a shard lost or gained cells")
    # A shard emptied by accident (not by the dealing) does not pass as an empty shard.
    lost["cells"], lost["shard"]["cells"], lost["findings"] = [], 0, []
    (shards / "lost.json").write_text(json.dumps(lost))
    one_line_error(hlo_audit(shards, "merge", "lost.json", "2of2.json"), "a shard lost or gained cells")


def _nested(depth: int) -> dict:
    value: object = 0
    for _ in range(depth):
        value = {"x": value}
    return value


def _damage(d: dict, how: str):
    """One way a shard report can be broken; returns bytes or the damaged document."""
    d = copy.deepcopy(d)
    finding, cell = d["findings"][0], d["cells"][0]
    if how == "finding details nested 100 deep":
        finding["details"] = _nested(100)
    steps = {
        "unknown severity": lambda: finding.update(severity="catastrophic"),
        "finding without a rule": lambda: finding.pop("rule"),
        "finding not an object": lambda: d.update(findings=[1]),
        "findings not a list": lambda: d.update(findings={}),
        "message not a string": lambda: finding.update(message=["x"]),
        "cells not a list": lambda: d.update(cells="x"),
        "cell without a model": lambda: cell.pop("model"),
        "layers a string": lambda: cell.update(layers="2"),
        "layers a boolean": lambda: cell.update(layers=True),
        "scan a boolean": lambda: cell.update(scan=True),
        "unknown platform": lambda: cell.update(platform="gpu"),
        "counts not counts": lambda: cell.update(by_dtype={"f32": "many"}),
        "an ok cell without its counts": lambda: cell.update(entry_params=None),
        "counts on an unavailable cell": lambda: cell.update(status="unavailable"),
        "a failed cell from the cache": lambda: cell.update(status="error", entry_params=None, cached=True),
        "id not its fields'": lambda: cell.update(id="mlp/scan-on/none/L9"),
        "model escaping": lambda: cell.update(model="../../x"),
        "no shard record": lambda: d.pop("shard"),
        "no record of what judged it": lambda: d["shard"].pop("judged_by"),
        "judged_by without its policy": lambda: d["shard"]["judged_by"].pop("policy"),
        "judged_by without its tree": lambda: d["shard"]["judged_by"].pop("tree"),
        "tree not a string": lambda: d["shard"]["judged_by"].update(tree=["x"]),
        "shard a string": lambda: d.update(shard="1/2"),
        "shard 3 of 2": lambda: d["shard"].update(index=3),
        "schema missing": lambda: d.pop("schema"),
        "finding details nested 100 deep": lambda: None,
    }
    if how in steps:
        steps[how]()
        return json.dumps(d).encode()
    return {
        "not JSON": b"{",
        "empty": b"",
        "not UTF-8": b'\xff\xfe{"schema": 1}',
        "a JSON list": b"[]",
        "a JSON string": b'"hlo-audit/check/v2"',
        "nested 100000 deep": b"[" * 100000 + b"]" * 100000,
    }[how]


MALFORMED = {
    "not JSON": "not a check JSON report",
    "empty": "not a check JSON report",
    "not UTF-8": "not UTF-8 (byte 0)",
    "a JSON list": "a JSON list, not an object",
    "a JSON string": "a JSON str, not an object",
    "nested 100000 deep": "nested deeper than 64 levels",
    "schema missing": "not a `hlo-audit check --format json` report",
    "findings not a list": "report.findings: expected list, got dict",
    "finding not an object": "findings[0]: expected an object, got int",
    "unknown severity": "findings[0].severity: expected one of ok, improvement",
    "finding without a rule": "findings[0]: missing 'rule'",
    "message not a string": "findings[0].message: expected str, got list",
    "finding details nested 100 deep": "nested deeper than 64 levels",
    "cells not a list": "report.cells: expected list, got str",
    "cell without a model": "cells[0]: missing 'model'",
    "layers a string": "cells[0].layers: expected int, got str",
    "layers a boolean": "cells[0].layers: expected int, got bool",
    "scan a boolean": "cells[0].scan: expected str, got bool",
    "unknown platform": "cells[0].platform: expected one of cpu, cuda",
    "counts not counts": "cells[0].by_dtype: expected a table of counts",
    "an ok cell without its counts": "cells[0].entry_params: null for a cell whose status is ok",
    "counts on an unavailable cell": "for a cell whose status is unavailable",
    "a failed cell from the cache": "cells[0].cached: true for a cell whose status is error",
    "id not its fields'": "cells[0].id: 'mlp/scan-on/none/L9' is not the id its fields give",
    "model escaping": "cells[0].model: '../../x' contains '/'",
    "no shard record": "shard: missing",
    "no record of what judged it": "shard.judged_by: missing (written by an hlo-audit that did not record what "
                                   "judged its cells: run check again)",
    "judged_by without its policy": "shard.judged_by: missing 'policy'",
    "judged_by without its tree": "shard.judged_by: missing 'tree'",
    "tree not a string": "shard.judged_by.tree: expected str, got list",
    "shard a string": "shard: expected an object, got str",
    "shard 3 of 2": "shard: 3/2 is not a shard K/N",
}


@pytest.mark.parametrize("how", list(MALFORMED))
def test_a_malformed_input_is_one_line_and_exit_2(shards, tmp_path, how):
    bad = tmp_path / "bad.json"
    bad.write_bytes(_damage(doc(shards, "1of2"), how))
    one_line_error(hlo_audit(shards, "merge", bad, "2of2.json"), str(bad), MALFORMED[how])


def test_every_shard_records_what_judged_it(shards):
    one, two, full = doc(shards, "1of2"), doc(shards, "2of2"), doc(shards, "full")
    judged = one["shard"]["judged_by"]
    assert judged == two["shard"]["judged_by"] == full["shard"]["judged_by"]
    assert set(judged) == {"commit", "config", "policy", "hlo_audit", "environment", "goldens", "tree"}
    assert len(judged["tree"]) == 64
    assert judged["commit"] == "unknown" and len(judged["goldens"]) == 16  # the project is no git work tree
    assert judged["hlo_audit"].startswith(f"{hlo_audit_version()} (source ") and "python 3." in judged["environment"]
    assert "jax " in judged["environment"] and len(judged["config"]) == len(judged["policy"]) == 16


def hlo_audit_version() -> str:
    from importlib import metadata

    return metadata.version("hlo-audit")


def swapped_shard(shards: Path, name: str, config_text: str) -> str:
    """Shard 2/2 of the same cells checked under ``config_text`` (the project's config restored after)."""
    try:
        (shards / "hlo-audit.toml").write_text(config_text)
        result = hlo_audit(shards, "check", "--shard", "2/2", "--format", "json")
    finally:
        (shards / "hlo-audit.toml").write_text(CONFIG)
    assert result.returncode in (0, 1), result.stderr
    (shards / f"{name}.json").write_text(result.stdout)
    return f"{name}.json"


def test_a_shard_judged_under_another_policy_is_refused(shards):
    """Issue 34: shard 2 checked with hlo_text and missing_golden off (its removed golden then passes) merged with
    the others into "passed". It is refused, in one line naming the shard and what differs."""
    lax = swapped_shard(shards, "lax", config(quant=["none", "dropout0"], layers=[2, 3],
                                             policy={"hlo_text": "off", "missing_golden": "off"}))
    assert doc(shards, "lax")["exit_code"] == 0 != doc(shards, "2of2")["exit_code"]
    one_line_error(hlo_audit(shards, "merge", "1of2.json", lax), f"{lax}: shard 2/2 was judged under another policy "
                   "(rule actions, waivers, tolerances) than 1of2.json (shard 1/2)", "merge only the shards of one run")
    waived = swapped_shard(shards, "waived", CONFIG + '\n[[waive]]\nrule = "missing_golden"\nmodel = "mlp"\nreason = "x"\n')
    one_line_error(hlo_audit(shards, "merge", "1of2.json", waived), "another policy")
    # The shards of one run still merge, in any order.
    assert hlo_audit(shards, "merge", "2of2.json", "1of2.json").returncode == 1


def test_a_shard_judged_under_another_config_hlo_audit_or_environment_is_refused(shards):
    """Another golden folder (same cells); another hlo-audit (its version or source) or environment (another jax)
    in the shard's record: each refused in one line that names what differs and both values where they are
    readable."""
    shutil.copytree(shards / "golden", shards / "golden-copy", dirs_exist_ok=True)
    elsewhere = swapped_shard(shards, "elsewhere", config(quant=["none", "dropout0"], layers=[2, 3],
                                                           golden_dir="golden-copy"))
    one_line_error(hlo_audit(shards, "merge", "1of2.json", elsewhere),
                   "was judged under another config (matrix or golden folder)")
    two = doc(shards, "2of2")
    for key, value, said in (("hlo_audit", "0.0.9 (source 0123456789abcdef)", "another hlo-audit"),
                             ("environment", two["shard"]["judged_by"]["environment"].replace("jax ", "jax 9", 1),
                              "another environment")):
        other = copy.deepcopy(two)
        other["shard"]["judged_by"][key] = value
        (shards / "other.json").write_text(json.dumps(other))
        line = one_line_error(hlo_audit(shards, "merge", "1of2.json", "other.json"), said)
        assert repr(value) in line and repr(two["shard"]["judged_by"][key]) in line, line


def test_paths_that_are_not_reports(shards, tmp_path):
    one_line_error(hlo_audit(shards, "merge", tmp_path / "nope.json"), "nope.json: no such file")
    one_line_error(hlo_audit(shards, "merge", tmp_path), "is a folder")
    one_line_error(hlo_audit(shards, "merge", "/dev/zero"), "/dev/zero: not a regular file")
    one_line_error(hlo_audit(shards, "merge", "hlo-audit.toml"), "not a check JSON report")


def test_a_shard_judged_against_other_goldens_is_refused(shards):
    """Issue 37: the same commit and config, but shard 2's golden folder held other content when it was judged (a
    golden edited, or another checkout's): refused in one line naming both shards and what differs."""
    path = shards / "golden/mlp/scan-off/dropout0/L3.json"
    saved = path.read_bytes()
    try:
        path.write_bytes(saved.replace(b'"cell"', b'"cell" ', 1))
        other = swapped_shard(shards, "other-goldens", CONFIG)
    finally:
        path.write_bytes(saved)
    assert doc(shards, "other-goldens")["shard"]["judged_by"]["goldens"] != doc(shards, "1of2")["shard"]["judged_by"][
        "goldens"]
    one_line_error(hlo_audit(shards, "merge", "1of2.json", other), f"{other}: shard 2/2 was judged against other "
                   "goldens (the golden folder's content differs) than 1of2.json (shard 1/2)")


# A project of its own under git: its target reads ops.txt at every lowering (checked with --no-cache), so a commit
# that edits ops.txt changes the program of cell `a` only.
COMMIT_TARGET = """
from pathlib import Path

import jax
import jax.numpy as jnp


def lower(cell):
    twice = cell.quant == "a" and Path("ops.txt").read_text().strip() == "twice"

    def step(x):
        y = jnp.sin(x) * 3.0
        return jnp.sin(y) * 3.0 if twice else y

    return jax.jit(step).trace(jnp.ones((8,), jnp.float32))
"""


def _git(project: Path, *args: str) -> str:
    import subprocess

    done = subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=project,
                          capture_output=True, text=True, check=True)
    return done.stdout.strip()


def test_a_shard_judged_at_another_commit_is_refused(tmp_path):
    """Issue 37: shard 1 judged at the commit before the regression (its cell passes there), shard 2 at the commit
    with it (its own cell is unchanged): merged, the run passed. Each shard records git's HEAD; the merge refuses
    them in one line naming both shards and both commits. Both shards at the new commit fail, as they must."""
    project = tmp_path / "repo"
    project.mkdir()
    (project / "merge_commit_target.py").write_text(COMMIT_TARGET)
    (project / "ops.txt").write_text("once\n")
    (project / "hlo-audit.toml").write_text(config(target="merge_commit_target:lower", models=["m"],
                                                   quant=["a", "b"], layers=[1]))
    _git(project, "init", "-q")
    assert hlo_audit(project, "golden", "update", "--no-cache").returncode == 0
    _git(project, "add", "-A")
    _git(project, "commit", "-qm", "goldens")
    before = _git(project, "rev-parse", "HEAD")

    def shard(k: int, name: str) -> dict:
        result = hlo_audit(project, "check", "--no-cache", "--shard", f"{k}/2", "--format", "json")
        assert result.returncode in (0, 1), result.stderr
        (tmp_path / name).write_text(result.stdout)  # outside the project: no file of the tree the next shard judges
        return json.loads(result.stdout)

    first = shard(1, "old1.json")
    assert first["shard"]["judged_by"]["commit"] == before
    # The shard holding cell `a` (dealt by series: one cell each).
    a_shard = 1 if any(c["quant"] == "a" for c in first["cells"]) else 2
    other = 3 - a_shard
    shard(a_shard, "old-a.json")
    (project / "ops.txt").write_text("twice\n")
    _git(project, "commit", "-qam", "the step twice")
    after = _git(project, "rev-parse", "HEAD")
    assert shard(other, "new-other.json")["exit_code"] == 0
    line = one_line_error(hlo_audit(tmp_path, "merge", "old-a.json", "new-other.json"),
                          f"new-other.json: shard {other}/2 was judged at another commit than old-a.json "
                          f"(shard {a_shard}/2)", "merge only the shards of one run")
    assert repr(after) in line and repr(before) in line, line
    new_a = shard(a_shard, "new-a.json")
    assert new_a["exit_code"] == 1 and new_a["verdicts"]["m/scan-off/a/L1"] == "regression"
    assert hlo_audit(tmp_path, "merge", "new-a.json", "new-other.json").returncode == 1


def _commit_project(folder: Path, git: bool) -> Path:
    """COMMIT_TARGET's project (cells `a` and `b`, one a shard) with its goldens, under git (committed) or not."""
    folder.mkdir(parents=True)
    (folder / "merge_commit_target.py").write_text(COMMIT_TARGET)
    (folder / "ops.txt").write_text("once\n")
    (folder / "hlo-audit.toml").write_text(config(target="merge_commit_target:lower", models=["m"],
                                                  quant=["a", "b"], layers=[1]))
    if git:
        _git(folder, "init", "-q")
    assert hlo_audit(folder, "golden", "update", "--no-cache").returncode == 0
    if git:
        _git(folder, "add", "-A")
        _git(folder, "commit", "-qm", "goldens")
    return folder


def _shard_of(project: Path, k: int, report: Path) -> dict:
    result = hlo_audit(project, "check", "--no-cache", "--shard", f"{k}/2", "--format", "json")
    assert result.returncode in (0, 1), result.stderr
    report.write_text(result.stdout)
    return json.loads(result.stdout)


def _a_shard(project: Path, reports: Path) -> int:
    """Which shard holds cell `a` (dealt by series: one cell each)."""
    first = _shard_of(project, 1, reports / "probe.json")
    return 1 if any(c["quant"] == "a" for c in first["cells"]) else 2


@pytest.mark.parametrize("git", [True, False], ids=["git", "no-git"])
def test_a_shard_judged_before_an_uncommitted_regression_is_refused(tmp_path, git):
    """Issue 48: one HEAD, a regression left uncommitted between the two shard runs (cell `a`'s shard judged before
    it, the other after): merged, exit 0; the same without git (commit "unknown" on both). Each shard records the
    digest of the project's files it judged; merge refuses them in one line. Both shards of the edited tree merge
    into the regression."""
    project, reports = _commit_project(tmp_path / "repo", git), tmp_path / "reports"
    reports.mkdir()
    a_shard = _a_shard(project, reports)
    other = 3 - a_shard
    old_a = _shard_of(project, a_shard, reports / "old-a.json")
    assert old_a["exit_code"] == 0
    (project / "ops.txt").write_text("twice\n")  # not committed
    new_other = _shard_of(project, other, reports / "new-other.json")
    assert new_other["exit_code"] == 0
    assert old_a["shard"]["judged_by"]["commit"] == new_other["shard"]["judged_by"]["commit"]
    assert (old_a["shard"]["judged_by"]["commit"] == "unknown") is not git
    one_line_error(hlo_audit(reports, "merge", "old-a.json", "new-other.json"),
                   f"new-other.json: shard {other}/2 was judged on another tree (the project's files differ",
                   f"than old-a.json (shard {a_shard}/2)", "merge only the shards of one run")
    assert _shard_of(project, a_shard, reports / "new-a.json")["exit_code"] == 1
    assert hlo_audit(reports, "merge", "new-a.json", "new-other.json").returncode == 1


def test_shards_of_two_trees_without_git_are_refused_and_of_two_copies_merge(tmp_path):
    """Issue 48: cell `a`'s shard of tree A, the other shard of a copy B whose step of `a` regressed, neither under
    git: "2 ok", exit 0 (each shard passes on its own tree). Refused; two copies of one tree in other folders merge
    (the digest is of paths relative to the project, and contents)."""
    tree_a, reports = _commit_project(tmp_path / "a", git=False), tmp_path / "reports"
    reports.mkdir()
    tree_b, tree_c = tmp_path / "b", tmp_path / "c"
    shutil.copytree(tree_a, tree_b)
    shutil.copytree(tree_a, tree_c)
    (tree_b / "ops.txt").write_text("twice\n")
    a_shard = _a_shard(tree_a, reports)
    assert _shard_of(tree_a, a_shard, reports / "a.json")["exit_code"] == 0
    assert _shard_of(tree_b, 3 - a_shard, reports / "b.json")["exit_code"] == 0
    one_line_error(hlo_audit(reports, "merge", "a.json", "b.json"), "b.json: shard", "on another tree")
    assert _shard_of(tree_c, 3 - a_shard, reports / "c.json")["exit_code"] == 0
    assert hlo_audit(reports, "merge", "a.json", "c.json").returncode == 0


def test_a_report_of_the_schema_before_tree_digests_is_refused(shards, tmp_path):
    old = doc(shards, "1of2")
    old["schema"] = "hlo-audit/check/v1"
    del old["shard"]["judged_by"]["tree"]
    (tmp_path / "old.json").write_text(json.dumps(old))
    one_line_error(hlo_audit(shards, "merge", tmp_path / "old.json", "2of2.json"), "old.json: a check report of an "
                   "older hlo-audit (schema hlo-audit/check/v1: it records no digest of the tree it judged)")


def test_each_shard_s_report_in_its_own_checkout_is_no_file_of_its_tree(tmp_path):
    """The workflow `init` writes runs `check --shard K/N --format json > shard-K.json` in each job's checkout: the
    shell makes that file before hlo-audit starts, so each checkout holds another untracked file. The command's own
    standard output is no file of the tree it judged: the two shards merge. (A process: the redirect is the shell's.)
    """
    import subprocess
    import sys

    first = _commit_project(tmp_path / "job1", git=True)
    second = tmp_path / "job2"
    shutil.copytree(first, second)
    for k, checkout in ((1, first), (2, second)):
        with open(checkout / f"shard-{k}.json", "w") as report:
            done = subprocess.run([sys.executable, "-m", "hlo_audit", "check", "--no-cache", "--shard", f"{k}/2",
                                   "--format", "json"], cwd=checkout, stdout=report, stderr=subprocess.PIPE,
                                  text=True, timeout=600, check=False)
        assert done.returncode == 0, done.stderr[-2000:]
    shutil.copy(second / "shard-2.json", first / "shard-2.json")
    merged = hlo_audit(first, "merge", "shard-1.json", "shard-2.json")
    assert merged.returncode == 0, merged.stderr
