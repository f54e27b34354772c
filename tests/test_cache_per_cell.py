"""A cell is lowered again only when something its own lowering read changed (issue 40, item 1).

A small project with a git history of its own, replayed commit by commit as a contributor's CI does: two models,
each cell reading the target, a helper module both import lazily, its own model module (model ``a``'s found once
through a memoized ``import_module``, importing a helper of its own that imports a constants module; model ``b``'s
through ``from stack import``) and, for ``b``, a JSON file it opens. Each commit touches some of them, or files no cell reads. At every commit the cells lowered again are
exactly those whose read files changed (``git diff``), and the others are served from the cache. The cells run
in one process, ``a``'s first: ``b``'s cells must not inherit what ``a``'s loaded, and ``a``'s second cell, which
imports nothing (the memo has its model), must still read the model, its helper and the constants the helper took.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from projects import config
from test_cache import cells_of, hlo_audit

TARGET = '''
import functools
import importlib
import json
from pathlib import Path

import jax
import jax.numpy as jnp
from flax import nnx

from hlo_audit.examples.nnx_mlp import make_step


@functools.cache  # a later cell of model a imports nothing: it only runs the model's code
def _model_a():
    return importlib.import_module("stack.model_a").Model


def lower(cell):
    if cell.model == "a":
        Model = _model_a()
        width = 8
    else:
        from stack import model_b
        Model = model_b.Model
        with open(Path(__file__).parent / "b.json") as handle:
            width = json.load(handle)["width"]
    model = nnx.eval_shape(lambda: Model(cell.layers, width, nnx.Rngs(0)))
    graphdef, state = nnx.split(model)
    x = jax.ShapeDtypeStruct((cell.batch, width), jnp.float32)
    return jax.jit(make_step(graphdef)).trace(state, x)


lower.full_depth = {"a": 8, "b": 8}
'''

SHARED = '''
def activation(x):
    from flax import nnx
    return nnx.relu(x)
'''

HELPERS_A = '''
from flax import nnx

from stack.sizes_a import BIAS


class Block(nnx.Module):
    def __init__(self, width, rngs):
        self.linear = nnx.Linear(width, width, use_bias=BIAS, rngs=rngs)

    def __call__(self, x):
        from stack.shared import activation
        return activation(self.linear(x))
'''

MODEL_A = '''
from flax import nnx

from stack.helpers_a import Block


class Model(nnx.Module):
    def __init__(self, layers, width, rngs):
        self.layers = nnx.List([Block(width, rngs) for _ in range(layers)])

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return x
'''

MODEL_B = '''
from flax import nnx


class Model(nnx.Module):
    def __init__(self, layers, width, rngs):
        self.layers = nnx.List([nnx.Linear(width, width, rngs=rngs) for _ in range(layers)])

    def __call__(self, x):
        from stack.shared import activation
        for layer in self.layers:
            x = activation(layer(x))
        return x
'''

# What each model's cells read, by construction: the expected count at each commit comes from these and git's diff.
READS = {
    "a": {"stack/__init__.py", "stack/target.py", "stack/shared.py", "stack/model_a.py", "stack/helpers_a.py",
          "stack/sizes_a.py"},
    "b": {"stack/__init__.py", "stack/target.py", "stack/shared.py", "stack/model_b.py", "stack/b.json"},
}
FILES = {"stack/__init__.py": "", "stack/target.py": TARGET, "stack/shared.py": SHARED, "stack/model_a.py": MODEL_A,
         "stack/helpers_a.py": HELPERS_A, "stack/sizes_a.py": "BIAS = True\n", "stack/model_b.py": MODEL_B, "stack/b.json": '{"width": 8}\n',
         "stack/unused.py": "VALUE = 1\n", "NOTES.md": "notes\n",
         "hlo-audit.toml": config(target="stack.target:lower", models=["a", "b"], scan=["off"], layers=[2, 3]),
         ".gitignore": ".hlo-audit-cache/\n"}


def _edit(project: Path, path: str, old: str | None = None, new: str = "") -> None:
    """An edit of what the file holds: a module gains a statement (a comment alone changes no code that runs, and
    serves every cell: tests/test_recorder.py), any other file a line."""
    file = project / path
    added = "\nEDITED = True\n" if path.endswith(".py") else "\n# an edit\n"
    file.write_text(file.read_text().replace(old, new) if old else file.read_text() + added)


# (what the commit does, as edits) in history order
COMMITS = [
    ("notes and an unused module", [("NOTES.md", None, ""), ("stack/unused.py", None, "")]),
    ("a helper only model a's module imports", [("stack/helpers_a.py", None, "")]),
    ("constants only that helper imports: no bias", [("stack/sizes_a.py", "True", "False")]),
    ("the JSON only model b's cells open: wider", [("stack/b.json", "8", "16")]),
    ("the helper every cell imports lazily", [("stack/shared.py", "nnx.relu", "nnx.silu")]),
    ("model b's module", [("stack/model_b.py", None, "")]),
    ("model a's module and the unused one", [("stack/model_a.py", None, ""), ("stack/unused.py", None, "")]),
]


def _git(project: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=project, capture_output=True, text=True, check=True,
                          env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                               "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin"}).stdout


def _history(project: Path) -> list[str]:
    """The project's commits, oldest first: the first adds every file, each next one is one of ``COMMITS``."""
    for name, text in FILES.items():
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(text)
    _git(project, "init", "-q")
    _git(project, "add", "-A")
    _git(project, "commit", "-q", "-m", "first")
    for message, edits in COMMITS:
        for path, old, new in edits:
            _edit(project, path, old, new)
        _git(project, "commit", "-q", "-am", message)
    return _git(project, "rev-list", "--reverse", "HEAD").split()


@pytest.mark.long  # a git history of commits, each checked in a fresh process: make test's 15 minutes
def test_each_commit_lowers_again_only_the_cells_whose_reads_changed(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    commits = _history(project)
    env = {"XDG_CACHE_HOME": str(tmp_path / "home")}
    _git(project, "checkout", "-q", commits[0])
    first = cells_of(hlo_audit(project, "run", "--format", "json", env=env))
    assert len(first) == 4 and not any(c["cached"] or c["status"] != "ok" for c in first.values()), first
    seen = []
    for before, commit in zip(commits, commits[1:], strict=False):
        _git(project, "checkout", "-q", commit)
        changed = set(_git(project, "diff", "--name-only", before, commit).split())
        expected = sorted(cid for cid in first if READS[cid.split("/")[0]] & changed)
        cells = cells_of(hlo_audit(project, "run", "--format", "json", env=env))
        assert all(c["status"] == "ok" for c in cells.values()), cells
        lowered = sorted(cid for cid, c in cells.items() if not c["cached"])
        seen.append((sorted(changed), lowered, expected))
        assert lowered == expected, seen
    # Every kind of change was seen, and something was served from the cache at each commit but one.
    assert [len(lowered) for _, lowered, _ in seen] == [0, 2, 2, 2, 4, 2, 2]
