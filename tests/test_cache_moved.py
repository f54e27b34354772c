"""A cell whose code only moved is served with its lines moved (``hlo_audit.cache.moved``), and says the same as a
check without the cache: the same verdict, each finding at the line where its code is now."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from in_process import hlo_audit_here
from projects import project

pytestmark = pytest.mark.skipif(sys.version_info < (3, 12), reason="what ran is heard through sys.monitoring "
                                                                    "(Python 3.12+): on 3.11 a file counts by content")

MODEL = '''
import jax
import jax.numpy as jnp

import layers


def step(cell):
    def loss(w, x):
        return layers.layer(x, w).sum()
    return jax.jit(jax.grad(loss)).trace(jnp.ones((8, 8)), jnp.ones((4, 8)))


step.scan = ["off"]
step.quant = ["none"]
'''

# The step's one layer, below a helper no lowering runs: lines added to the helper move the layer.
LAYERS = '''import jax.numpy as jnp


def helper(x):
    return x


def layer(x, w):
    y = x @ w
    return jnp.{op}(y)
'''


def _check(project: Path, *args: str):
    return hlo_audit_here(project, "check", *args)


def _lines_named(text: str) -> set[str]:
    return set(re.findall(r"layers\.py:\d+", text))


def _project(root: Path, layers: str = LAYERS.format(op="tanh")) -> Path:
    project(root, {"model.py": MODEL, "layers.py": layers}, target="model:step", models=("tiny",), layers=(1,))
    assert hlo_audit_here(root, "golden", "update").returncode == 0
    return root


def test_a_change_whose_code_then_moves_is_served_at_the_lines_where_it_is_now(tmp_path):
    project = _project(tmp_path)
    (project / "layers.py").write_text(LAYERS.format(op="sin"))  # a real change: lowered, fails at layer's line
    failed = _check(project)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    before = _lines_named(failed.stdout)
    assert before and before <= {"layers.py:9", "layers.py:10"}, failed.stdout  # the layer's lines
    # Three lines added to the helper above: the layer moves down three lines, what it runs is the same.
    (project / "layers.py").write_text(LAYERS.format(op="sin").replace("    return x\n",
                                                                       "    x = x + 1\n    x = x * 2\n    x = -x\n"
                                                                       "    return x\n"))
    served = _check(project, "--format", "json")
    assert served.returncode == 1
    (cell,) = json.loads(served.stdout)["cells"]
    assert cell["cached"], cell  # not lowered again
    text = _check(project)
    fresh = _check(project, "--no-cache")
    assert text.returncode == fresh.returncode == 1
    moved = {f"layers.py:{int(name.rpartition(':')[2]) + 3}" for name in before}
    assert _lines_named(text.stdout) == _lines_named(fresh.stdout) == moved, text.stdout
    assert text.stdout == fresh.stdout


def test_code_that_moved_and_changed_is_lowered_again_and_named(tmp_path):
    project = _project(tmp_path)
    (project / "layers.py").write_text(LAYERS.format(op="sin").replace("    return x\n", "    x = -x\n    return x\n"))
    checked = _check(project, "--format", "json")
    assert checked.returncode == 1
    (cell,) = json.loads(checked.stdout)["cells"]
    assert not cell["cached"] and cell["relowered_because"] == "layers.py layer changed", cell


def test_a_moved_cell_carries_the_lines_it_ran_where_they_are_now(tmp_path):
    project = _project(tmp_path)
    (project / "layers.py").write_text(LAYERS.format(op="tanh").replace("    return x\n", "    x = -x\n    return x\n"))
    patch = tmp_path / "pr.diff"
    patch.write_text("--- a/layers.py\n+++ b/layers.py\n@@ -10,1 +10,1 @@\n-    y = x @ w\n+    y = x @ w\n")
    served = _check(project, "--format", "json", "--changes", str(patch))
    assert served.returncode == 0, served.stdout + served.stderr
    report = json.loads(served.stdout)
    (cell,) = report["cells"]
    assert cell["cached"], cell
    # Line 10 is the layer's first line now (it was 9): the cell ran it, and its program names it.
    coverage = report["coverage"]
    assert coverage["reached"] == coverage["in_program"] == {"tiny/scan-off/none/L1": ["layers.py:10"]}, coverage
    assert coverage["unreached"] == []


def test_a_change_below_a_move_is_named_as_the_change(tmp_path):
    calls = LAYERS.format(op="tanh").replace("    y = x @ w\n", "    y = sub(x, w)\n") + "\n\ndef sub(x, w):\n    return x @ w\n"
    project = _project(tmp_path, calls)
    # layer moves down a line (the helper grows); sub, below it (and after it in a record's order), changes.
    (project / "layers.py").write_text(calls.replace("    return x\n", "    x = -x\n    return x\n")
                                       .replace("    return x @ w\n", "    return (x @ w) * 2.0\n"))
    checked = _check(project, "--format", "json")
    (cell,) = json.loads(checked.stdout)["cells"]
    assert not cell["cached"] and cell["relowered_because"] == "layers.py sub changed", cell


def test_a_comment_inside_code_that_ran_is_named_as_its_lines_moving(tmp_path):
    project = _project(tmp_path)
    (project / "layers.py").write_text(LAYERS.format(op="tanh").replace("    y = x @ w\n", "    # w first\n    y = x @ w\n"))
    checked = _check(project, "--format", "json")
    (cell,) = json.loads(checked.stdout)["cells"]
    assert not cell["cached"], cell  # where its lines are within it is not known from the record: lowered again
    assert cell["relowered_because"] == "layers.py layer: lines within it moved (jax writes its lines into the program)"


def test_a_line_moves_as_the_innermost_code_holding_it_moved():
    from hlo_audit.cache.moved import moved_line

    spans = [(10, 40, 3), (20, 25, 5)]  # a function moved down 3 lines; a closure in it, 5 (lines added above it)
    assert [moved_line(line, spans) for line in (10, 19, 20, 25, 26, 40)] == [13, 22, 25, 30, 29, 43]
    with pytest.raises(ValueError):
        moved_line(41, spans)  # in no code the lowering ran: where it is now is not known


def test_a_lowering_record_is_moved_only_where_every_line_of_a_moved_file_can_be():
    from hlo_audit.cache.moved import moved_lowering

    meta = {"stage": "lowered", "metadata": {"files": ["/p/layers.py", "/p/model.py"], "sources": ["", "/p/layers.py:12"],
                                             "locations": [[1, 12], [2, 5]], "frames": [[1, 0]], "op_names": [],
                                             "at": {}}}
    moves = {"layers.py": [(10, 20, 3)]}
    moved = moved_lowering(meta, moves, {"/p/layers.py": "layers.py"})
    assert moved["metadata"]["locations"] == [[1, 15], [2, 5]] and moved["metadata"]["sources"] == ["", "/p/layers.py:15"]
    assert meta["metadata"]["locations"] == [[1, 12], [2, 5]]  # the recorded entry is left as it was
    with pytest.raises(ValueError):  # the moved file as lowered from another folder (a copy of the project)
        moved_lowering({**meta, "metadata": {**meta["metadata"], "files": ["/elsewhere/layers.py", "/p/model.py"]}},
                       moves, {})
    with pytest.raises(ValueError):  # lines outside the metadata's tables (a GPU dump's thunk metadata)
        moved_lowering({**meta, "dump": {"thunks": 'metadata={source_file="/p/layers.py" source_line=12}'}}, moves,
                       {"/p/layers.py": "layers.py"})
    with pytest.raises(ValueError):  # a line of the moved file in no code the lowering ran
        moved_lowering({**meta, "metadata": {**meta["metadata"], "locations": [[1, 30]]}}, moves,
                       {"/p/layers.py": "layers.py"})
