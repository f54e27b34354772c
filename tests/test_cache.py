"""The cache is a miss or right, never wrong: keyed by what each lowering read, every entry verified on read.

Part one changes what a lowering read and expects the cell lowered again: a model in a module the target imports
(the stale-cache case of issue 18: a per-layer nnx.Dropout(0.0) must fail `check` run with the cache), an installed
library's version, an environment variable the target reads (in the lowering and at import), hlo-audit's own
lowering side. Each command is a fresh process, as a user's are: a module edited on disk is imported again.
Part two damages the cache in every way issue 22 lists and expects the numbers of a cache never damaged, said on
stderr in one line, and a cache folder that cannot be used to be one line and exit 2.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hlo_audit import cache as cache_module
from hlo_audit import layers
from hlo_audit.cache import Cache, entry_files, lowering_key, lowering_sources, source_fingerprint
from hlo_audit.cache import key as cache_key
from hlo_audit.cache import store as cache_store
from hlo_audit.matrix import Cell
from hlo_audit.run import run_cells
from in_process import in_project
from projects import config

ROOT = Path(__file__).resolve().parents[1]

MODEL = '''
from flax import nnx


class Block(nnx.Module):
    def __init__(self, width, rngs):
        self.linear = nnx.Linear(width, width, rngs=rngs)

    def __call__(self, x):
        return nnx.relu(self.linear(x))


class Model(nnx.Module):
    def __init__(self, layers, width, rngs):
        self.layers = nnx.List([Block(width, rngs) for _ in range(layers)])

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return x
'''

# The same model, each block now holding a dropout that never draws: +2 u32 (key, count) per layer.
MODEL_WITH_DROPOUT = MODEL.replace(
    "        self.linear = nnx.Linear(width, width, rngs=rngs)\n",
    "        self.linear = nnx.Linear(width, width, rngs=rngs)\n        self.dropout = nnx.Dropout(0.0, rngs=rngs)\n",
).replace("        return nnx.relu(self.linear(x))", "        return self.dropout(nnx.relu(self.linear(x)))")

TARGET = '''
import os

import jax
import jax.numpy as jnp
from flax import nnx

from hlo_audit.examples.nnx_mlp import make_step
from {model_module} import Model

WIDTH = int(os.environ.get("STACK_WIDTH", "8"))  # read once, at import


def lower(cell):
    model = nnx.eval_shape(lambda: Model(cell.layers, WIDTH, nnx.Rngs(0, dropout=1)))
    if os.environ.get("STACK_DROPOUT") == "1":  # read while lowering
        from stack.model_with_dropout import Model as WithDropout
        model = nnx.eval_shape(lambda: WithDropout(cell.layers, WIDTH, nnx.Rngs(0, dropout=1)))
    graphdef, state = nnx.split(model)
    x = jax.ShapeDtypeStruct((cell.batch, WIDTH), jnp.float32)
    return jax.jit(make_step(graphdef), donate_argnums=0).trace(state, x)


lower.full_depth = {{"mlp": 8}}
'''

EXAMPLE = config(quant=["none", "dropout0"], scan=["off"], layers=[2, 3])
CONFIG = config(target="stack.target:lower", scan=["off"], layers=[2, 3])


def _project(root: Path, model_module: str = "stack.model") -> Path:
    """A user's project: the model in one module, the target (the function hlo-audit calls) in another."""
    package = root / "stack"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "model.py").write_text(MODEL)
    (package / "model_with_dropout.py").write_text(MODEL_WITH_DROPOUT)
    (package / "target.py").write_text(TARGET.format(model_module=model_module))
    (root / "hlo-audit.toml").write_text(CONFIG)
    return root


def hlo_audit(project: Path, *args, env: dict | None = None, path: tuple[str, ...] = ()):
    """One command in a fresh process, this checkout first on the path (and ``path`` before it)."""
    pythonpath = os.pathsep.join([*path, str(ROOT), os.environ.get("PYTHONPATH", "")])
    run_env = {**os.environ, "PYTHONPATH": pythonpath, "COLUMNS": "200", **(env or {})}
    for name, value in (env or {}).items():
        if value is None:
            run_env.pop(name)
    return subprocess.run([sys.executable, "-m", "hlo_audit", *args], cwd=project, capture_output=True, text=True,
                          env=run_env, timeout=600, check=False)


def cells_of(proc) -> dict[str, dict]:
    assert proc.returncode in (0, 1), proc.stderr
    return {c["id"]: c for c in json.loads(proc.stdout)["cells"]}


def _flat(text: str) -> str:
    return " ".join(text.split())


# --------------------------------------------------------------------------------------------------------------
# Keys from what was read
# --------------------------------------------------------------------------------------------------------------


def test_a_model_in_an_imported_module_that_gains_dropout_fails_check_with_the_cache(tmp_path):
    project = _project(tmp_path)
    assert hlo_audit(project, "golden", "update").returncode == 0
    golden = json.loads((project / "golden/mlp/scan-off/none/L2.json").read_text())
    assert golden["entry_params"] == 5  # kernel and bias of 2 layers, the input
    # Unchanged: every cell from the cache, and the gate passes.
    unchanged = hlo_audit(project, "check", "--format", "json")
    assert unchanged.returncode == 0 and all(c["cached"] for c in cells_of(unchanged).values())
    # The model module (imported by the target's module before any cell lowered) gains a dropout per layer.
    model = project / "stack/model.py"
    model.write_text(MODEL_WITH_DROPOUT)
    changed = hlo_audit(project, "check")
    assert changed.returncode == 1, changed.stdout
    assert "state.layers.*.dropout.rngs.*" in _flat(changed.stdout)
    fresh = cells_of(hlo_audit(project, "run", "--format", "json"))
    assert fresh["mlp/scan-off/none/L2"]["entry_params"] == 9 and fresh["mlp/scan-off/none/L3"]["entry_params"] == 13
    # golden update writes what the model is now, not the stale lowering.
    assert hlo_audit(project, "golden", "update").returncode == 0
    assert json.loads((project / "golden/mlp/scan-off/none/L2.json").read_text())["entry_params"] == 9


def test_a_fresh_checkout_of_the_same_files_stays_a_hit(tmp_path):
    """Size or mtime changed: the file is held by its hash (a hit), and the manifest takes the new mtime, so the
    next run only stats it. The project's files are named relative to the project (a copy checks its own)."""
    project = _project(tmp_path)
    assert not any(c["cached"] for c in cells_of(hlo_audit(project, "run", "--format", "json")).values())
    model = project / "stack/model.py"
    os.utime(model, ns=(model.stat().st_atime_ns, model.stat().st_mtime_ns + 10**9))
    touched = hlo_audit(project, "run", "--format", "json")
    assert all(c["cached"] for c in cells_of(touched).values())
    recorded = [v["reads"]["files"]["stack/model.py"] for path in (project / ".hlo-audit-cache").rglob(
        "*.manifest.json") for v in json.loads(path.read_text())["body"]["variants"]]
    assert len(recorded) == 2 and all(state[1] == model.stat().st_mtime_ns for state in recorded)


def test_a_module_edited_to_the_same_size_with_its_mtime_restored_lowers_again(tmp_path):
    """What ``cp -p``, ``rsync -a``, ``tar -x``, ``touch -r`` and cache-restore steps do: a module the target imports
    changes, keeps its size, and gets its old mtime back. The cache must give the new lowering, as --no-cache does
    (issue 27: it served f32[2,16] where --no-cache gave f32[2,64]): here relu's maximum goes, silu comes. Bytecode
    is not written, so Python itself reads the new source (a .pyc is checked against the source's size and mtime
    too)."""
    project = _project(tmp_path)
    env = {"PYTHONDONTWRITEBYTECODE": "1"}
    cell = "mlp/scan-off/none/L2"
    before = hlo_audit(project, "lower", cell, env=env)
    assert before.returncode == 0 and "maximum(" in before.stdout and "silu" not in before.stdout, before.stderr
    model = project / "stack/model.py"  # imported by the target's module: keyed by what the lowering read
    info = model.stat()
    text = model.read_text()
    model.write_text(text.replace("nnx.relu(", "nnx.silu("))
    os.utime(model, ns=(info.st_atime_ns, info.st_mtime_ns))
    assert model.read_text() != text and (model.stat().st_size, model.stat().st_mtime_ns) == (
        info.st_size, info.st_mtime_ns)
    after = hlo_audit(project, "lower", cell, env=env)  # what --no-cache gives: the module lowered from silu
    assert after.returncode == 0 and "silu" in after.stdout and "maximum(" not in after.stdout, after.stderr


LIBRARY_BLOCK = '''
from flax import nnx


class Block(nnx.Module):
    def __init__(self, width, rngs):
        self.linear = nnx.Linear(width, width, rngs=rngs)
{dropout}
    def __call__(self, x):
        x = nnx.relu(self.linear(x))
        return {result}
'''


def _install(site: Path, version: str, dropout: bool) -> None:
    """``blocklib`` as pip leaves a wheel installed: the package and its dist-info (METADATA, RECORD)."""
    for old in site.glob("blocklib*"):
        shutil.rmtree(old)
    (site / "blocklib").mkdir(parents=True)
    (site / "blocklib/__init__.py").write_text(LIBRARY_BLOCK.format(
        dropout="        self.dropout = nnx.Dropout(0.0, rngs=rngs)\n" if dropout else "",
        result="self.dropout(x)" if dropout else "x"))
    info = site / f"blocklib-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: blocklib\nVersion: {version}\n")
    (info / "RECORD").write_text(f"blocklib/__init__.py,,\nblocklib-{version}.dist-info/METADATA,,\n"
                                 f"blocklib-{version}.dist-info/RECORD,,\n")


@pytest.mark.long  # make test's 15 minutes: a library installed, upgraded and checked in fresh processes
def test_an_installed_library_upgrade_lowers_again(tmp_path):
    project = _project(tmp_path / "project", model_module="stack.library_model")
    (project / "stack/library_model.py").write_text(
        MODEL.replace("class Block(nnx.Module):", "from blocklib import Block\n\n\nclass _Unused(nnx.Module):"))
    site = tmp_path / "site"
    _install(site, "1.0", dropout=False)
    first = cells_of(hlo_audit(project, "run", "--format", "json", path=(str(site),)))
    assert first["mlp/scan-off/none/L2"]["entry_params"] == 5 and not first["mlp/scan-off/none/L2"]["cached"]
    again = cells_of(hlo_audit(project, "run", "--format", "json", path=(str(site),)))
    assert all(c["cached"] for c in again.values())
    # An upgrade: the version is what keys an installed distribution's files (its RECORD lists them).
    _install(site, "1.1", dropout=True)
    upgraded = cells_of(hlo_audit(project, "run", "--format", "json", path=(str(site),)))
    assert upgraded["mlp/scan-off/none/L2"]["entry_params"] == 9 and not upgraded["mlp/scan-off/none/L2"]["cached"]
    manifests = [json.loads(p.read_text()) for p in (project / ".hlo-audit-cache").rglob("*.manifest.json")]
    assert all(m["body"]["variants"][0]["reads"]["distributions"]["blocklib"] == "1.1" for m in manifests)
    # The version alone, the code the same: lowered again too.
    _install(site, "1.2", dropout=True)
    bumped = cells_of(hlo_audit(project, "run", "--format", "json", path=(str(site),)))
    assert not any(c["cached"] for c in bumped.values())
    assert bumped["mlp/scan-off/none/L2"]["entry_params"] == 9


@pytest.mark.long  # make test's budget (stop 46): each lowers in processes of its own now
def test_environment_variables_the_target_reads_are_part_of_the_key(tmp_path):
    project = _project(tmp_path)
    assert hlo_audit(project, "golden", "update", env={"STACK_DROPOUT": None}).returncode == 0
    # Read while lowering (here in two worker processes): the leak fails check, run with the cache.
    leaking = hlo_audit(project, "check", "--jobs", "2", env={"STACK_DROPOUT": "1"})
    assert leaking.returncode == 1, leaking.stdout + leaking.stderr
    assert "state.layers.*.dropout.rngs.*" in _flat(leaking.stdout)
    # Switched back and forth: each value has its own variant, both hits.
    back = hlo_audit(project, "check", "--format", "json", env={"STACK_DROPOUT": None})
    assert back.returncode == 0 and all(c["cached"] for c in cells_of(back).values())
    again = hlo_audit(project, "run", "--format", "json", env={"STACK_DROPOUT": "1"})
    assert all(c["cached"] and c["entry_params"] in (9, 13) for c in cells_of(again).values())
    # Read once at import, in the target's module: a wider model, the same parameters of other shapes.
    wide = hlo_audit(project, "check", "--format", "json", env={"STACK_WIDTH": "16", "STACK_DROPOUT": None})
    assert wide.returncode == 1 and not any(c["cached"] for c in cells_of(wide).values())
    # The inputs' dims changed: the shapes kind names it beside the text (issue 32).
    assert {f["rule"] for f in json.loads(wide.stdout)["findings"] if f["severity"] == "regression"} == {
        "hlo_text", "shapes"}
    narrow = hlo_audit(project, "check", env={"STACK_DROPOUT": None, "STACK_WIDTH": None})
    assert narrow.returncode == 0, narrow.stdout


def test_the_lowering_side_is_keyed_by_the_layer_table(tmp_path):
    """Every module the layer table puts at or below the targets is hashed (a copy of the package, each edited)."""
    copy = tmp_path / "hlo_audit"
    shutil.copytree(Path(cache_module.__file__).parent.parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    sources = lowering_sources(copy)
    relative = {p.relative_to(copy).as_posix() for p in sources}
    assert relative == {p.relative_to(copy).as_posix() for p in copy.rglob("*.py")
                        if layers.is_lowering_side(layers.module_name(p.relative_to(copy).as_posix()))}
    # The files issue 18 found missing from a hand-written list, and the rest of the stages and platforms.
    assert {"platforms/tpu.py", "stages/optimized.py", "capture.py", "targets/maxtext_config.py",
            "stages/compiled.py", "targets/callable.py", "lowering.py", "host.py"} <= relative
    before = source_fingerprint(sources, copy)
    for path in sources:
        original = path.read_bytes()
        path.write_bytes(original + b"\n# an edit\n")
        assert source_fingerprint(lowering_sources(copy), copy) != before, path
        path.write_bytes(original)
    # The analysis and the layers above the targets are not the lowering's: their edits re-analyse, not re-lower.
    for name in ("judging/gate.py", "hlo/diff.py", "report/markdown.py", "run.py"):
        (copy / name).write_text((copy / name).read_text() + "\n# an edit\n")
    assert source_fingerprint(lowering_sources(copy), copy) == before


def test_a_lowering_side_edit_lowers_again(tmp_path, monkeypatch):
    cell = Cell(model="mlp", scan=False, quant="dropout0", layers=2, target="hlo_audit.examples.nnx_mlp:lower")
    (fresh,) = run_cells([cell], Cache(tmp_path))
    (hit,) = run_cells([cell], Cache(tmp_path))
    assert not fresh.cached and hit.cached and hit.entry_params == fresh.entry_params == 9
    monkeypatch.setattr(cache_key, "lowering_fingerprint", lambda: "an edited stages/optimized.py")
    (edited,) = run_cells([cell], Cache(tmp_path))
    assert not edited.cached and edited.entry_params == 9


@pytest.mark.long  # make test's 15 minutes: every cell lowered twice in fresh processes
def test_refresh_lowers_again_and_rewrites(tmp_path):
    project = _project(tmp_path)
    assert not any(c["cached"] for c in cells_of(hlo_audit(project, "run", "--format", "json")).values())
    results = sorted((project / ".hlo-audit-cache").rglob("*.result.json"))
    stamps = [p.stat().st_mtime_ns for p in results]
    refreshed = cells_of(hlo_audit(project, "run", "--format", "json", "--refresh"))
    assert not any(c["cached"] for c in refreshed.values())
    # Each cell's result written again: in place, or as a new variant where what the lowering read differs from the
    # first run's (seen once in make test-long, not alone: the variant is recorded beside the first, nothing removed).
    after = sorted((project / ".hlo-audit-cache").rglob("*.result.json"))
    assert set(results) <= set(after)
    written = [p for p in after if p not in results or p.stat().st_mtime_ns > stamps[results.index(p)]]
    assert len(written) >= len(results), (results, after)
    assert all(c["cached"] for c in cells_of(hlo_audit(project, "run", "--format", "json")).values())


def test_what_a_lowering_read_is_recorded_in_the_process_that_lowered(tmp_path, monkeypatch):
    """Modules imported before the cell lowered (here: with the target, before any cell) are in its manifest; the
    stdlib and hlo-audit's own lowering side are not (their versions and sources are in the primary key)."""
    _project(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("STACK_DROPOUT", "0")
    cells = [Cell(model="mlp", scan=False, quant="none", layers=n, target="stack.target:lower") for n in (2, 3)]
    assert [r.entry_params for r in run_cells(cells, Cache(tmp_path / "cache"))] == [5, 7]
    manifests = [json.loads(p.read_text())["body"] for p in (tmp_path / "cache").rglob("*.manifest.json")]
    assert len(manifests) == 2
    for manifest in manifests:
        reads = manifest["variants"][0]["reads"]
        assert str(tmp_path / "stack/model.py") in reads["files"]
        assert str(tmp_path / "stack/target.py") in reads["files"]
        assert not any("/hlo_audit/" in path and "/examples/" not in path for path in reads["files"])
        assert not any(path.endswith("/json/decoder.py") for path in reads["files"])  # the stdlib
        assert {"jax", "jaxlib", "flax", "numpy"} <= set(reads["distributions"])
        assert reads["environment"]["STACK_DROPOUT"] == "0"


SETS_ITSELF = """
import os

from hlo_audit.examples.nnx_mlp import lower as example


def lower(cell):
    os.environ.setdefault("HLO_AUDIT_TEST_SET_BY_LOWERING", "on")  # read unset, then set: as MaxText's import does
    return example(cell)
"""


def test_a_variable_the_lowering_sets_itself_holds_unset_or_at_the_value_it_set(tmp_path, monkeypatch):
    """MaxText's import, lazy, runs in the first cell a process lowers and sets variables it finds unset
    (DECOUPLE_GCLOUD, TRANSFORMERS_VERBOSITY, ...). The cell holds with such a variable unset (a fresh process) or at
    the value the lowering set (a process that imported MaxText before it looked: a pytest worker, the plugin), not
    at another: a process that lowered one cell still hits the cells another lowered first."""
    variable = "HLO_AUDIT_TEST_SET_BY_LOWERING"
    monkeypatch.setenv(variable, "restored after the test")
    monkeypatch.delenv(variable)
    (tmp_path / "sets_itself.py").write_text(SETS_ITSELF)
    monkeypatch.syspath_prepend(str(tmp_path))
    cell = Cell("mlp", False, "none", 2, target="sets_itself:lower")
    (fresh,) = run_cells([cell], Cache(tmp_path / "cache"))
    # Set in the lowering's own process: this one (the judging process) is left as it was.
    assert not fresh.cached and os.environ.get(variable) is None
    [manifest] = [json.loads(p.read_text())["body"] for p in (tmp_path / "cache").rglob("*.manifest.json")]
    reads = manifest["variants"][0]["reads"]
    assert reads["set_by_lowering"] == {variable: "on"} and variable not in reads["environment"]
    monkeypatch.setenv(variable, "on")
    (hit,) = run_cells([cell], Cache(tmp_path / "cache"))  # set, at the value the lowering set
    assert hit.cached
    monkeypatch.delenv(variable)
    (hit,) = run_cells([cell], Cache(tmp_path / "cache"))  # unset, as in a process that has not lowered yet
    assert hit.cached and os.environ.get(variable) is None
    monkeypatch.setenv(variable, "off")  # set to another value before the lowering: an input, another variant
    (other,) = run_cells([cell], Cache(tmp_path / "cache"))
    assert not other.cached
    [manifest] = [json.loads(p.read_text())["body"] for p in (tmp_path / "cache").rglob("*.manifest.json")]
    assert manifest["variants"][0]["reads"]["environment"][variable] == "off"


def test_the_cache_log_has_a_line_per_cell_lowered_and_none_per_hit(tmp_path, monkeypatch):
    """$HLO_AUDIT_CACHE_LOG, how the test session counts its lowerings (tests/conftest.py): a JSON line per cell
    lowered, with its primary and entry keys and the variables the lowering found set; none for a cell served from
    the cache; a line again for a cell lowered under --no-cache."""
    log = tmp_path / "lowerings.jsonl"
    monkeypatch.setenv(cache_module.LOG_VARIABLE, str(log))
    monkeypatch.setenv("HLO_AUDIT_INJECT", "a-change")  # set while lowering: recorded only if the target read it
    cells = [Cell("mlp", False, quant, 2, target="hlo_audit.examples.nnx_mlp:lower") for quant in ("none", "dropout0")]
    fresh = list(run_cells(cells, Cache(tmp_path / "cache")))
    key = lowering_key(cells[0])
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(line["cell"], line["target"], line["entry"]) for line in lines] == [
        (r.cell.id, r.cell.target, r.key) for r in fresh]
    assert lines[0]["key"] == key and lines[0]["seconds"] == fresh[0].lower_seconds > 0
    assert lines[0]["pid"] == os.getpid() and "HLO_AUDIT_INJECT" not in lines[0]["environment"]
    assert all(r.cached for r in run_cells(cells, Cache(tmp_path / "cache")))
    assert len(log.read_text().splitlines()) == 2
    (again,) = run_cells(cells[:1], Cache(tmp_path / "cache", enabled=False))
    assert not again.cached and len(log.read_text().splitlines()) == 3


@pytest.mark.tpu  # needs libtpu (make compat's environment has none)
def test_a_cell_the_cli_lowered_is_a_hit_in_another_kind_of_process(tmp_path):
    """Recorded by the CLI started from a shell (it imports jax while building the target), looked up here (jax
    imported long before, by the suite): the variable jax's import sets (TPU_LIBRARY_PATH, where it found libtpu)
    is compared as it stands after that import, in both."""
    assert os.environ.get("TPU_LIBRARY_PATH")  # this process imported jax, and jax found libtpu
    (tmp_path / "hlo-audit.toml").write_text(EXAMPLE)
    from_a_shell = {"TPU_LIBRARY_PATH": None}
    assert hlo_audit(tmp_path, "run", "--only", "quant=dropout0,layers=2", env=from_a_shell).returncode == 0
    cell = Cell("mlp", False, "dropout0", 2, target="hlo_audit.examples.nnx_mlp:lower")
    key = lowering_key(cell)
    assert Cache(tmp_path / ".hlo-audit-cache", project=tmp_path).get_lowering(key) is not None
    (result,) = run_cells([cell], Cache(tmp_path / ".hlo-audit-cache", project=tmp_path))
    assert result.cached and result.entry_params == 9


# --------------------------------------------------------------------------------------------------------------
# A damaged cache: a miss, said, and the never-damaged numbers
# --------------------------------------------------------------------------------------------------------------

def _numbers(result) -> dict[str, dict]:
    """What `run --format json` says of each cell, less what a cache hit changes."""
    assert result.exit_code == 0, result.output
    return {c["id"]: {k: v for k, v in c.items() if k not in ("cached", "lower_seconds")}
            for c in json.loads(result.stdout)["cells"]}


@pytest.fixture
def warm(tmp_path):
    """A project whose cache holds all four cells, and the numbers of a cache never damaged."""
    (tmp_path / "hlo-audit.toml").write_text(EXAMPLE)
    baseline = _numbers(in_project(tmp_path, "run", "--format", "json"))
    assert len(baseline) == 4 and baseline["mlp/scan-off/dropout0/L2"]["entry_params"] == 9
    return tmp_path, baseline


def _entries(project: Path) -> dict[str, dict[str, Path]]:
    return entry_files(project / ".hlo-audit-cache")


def _rerun(project: Path, baseline: dict, damaged: int = 1) -> None:
    result = in_project(project, "run", "--format", "json")
    assert _numbers(result) == baseline
    warnings = [line for line in result.stderr.splitlines() if "does not verify" in line]
    assert len(warnings) >= damaged, result.stderr
    assert all(line.startswith("hlo-audit: warning: cache entry ") for line in warnings)
    # Healed: the next run is all hits, none damaged.
    again = in_project(project, "run", "--format", "json")
    assert _numbers(again) == baseline and "does not verify" not in again.stderr
    assert all(c["cached"] for c in json.loads(again.stdout)["cells"])


def test_one_digit_changed_in_a_result(warm):
    project, baseline = warm
    result = _entries(project)["mlp/scan-off/dropout0/L2"]["result"]
    text = result.read_text()
    assert text.count('"entry_params":9') == 1
    result.write_text(text.replace('"entry_params":9', '"entry_params":8'))
    _rerun(project, baseline)


def test_a_truncated_canonical_text_never_becomes_a_golden(warm):
    project, baseline = warm
    assert in_project(project, "golden", "update").exit_code == 0
    golden = project / "golden/mlp/scan-off/dropout0/L2.hlo.txt"
    whole = golden.read_bytes()
    normalized = _entries(project)["mlp/scan-off/dropout0/L2"]["normalized"]
    normalized.write_bytes(normalized.read_bytes()[: len(normalized.read_bytes()) // 2])
    golden.unlink()
    update = in_project(project, "golden", "update")
    assert update.exit_code == 0, update.output
    assert golden.read_bytes() == whole
    assert "does not verify" in update.stderr
    _rerun(project, baseline, damaged=0)


@pytest.mark.parametrize("kinds", [("hlo", "lowering"), ("hlo", "lowering", "result", "normalized")])
def test_two_cells_cached_modules_swapped(warm, kinds):
    project, baseline = warm
    entries = _entries(project)
    a, b = entries["mlp/scan-off/dropout0/L2"], entries["mlp/scan-off/dropout0/L3"]
    for kind in kinds:
        data_a, data_b = a[kind].read_bytes(), b[kind].read_bytes()
        a[kind].write_bytes(data_b)
        b[kind].write_bytes(data_a)
    if "result" not in kinds:  # analysis code changed since: the cells are analysed again from their lowerings
        for entry in (a, b):
            entry["result"].unlink()
    _rerun(project, baseline, damaged=2)


def test_one_cells_result_copied_over_anothers(warm):
    project, baseline = warm
    entries = _entries(project)
    shutil.copy(entries["mlp/scan-off/dropout0/L2"]["result"], entries["mlp/scan-off/none/L2"]["result"])
    shutil.copy(entries["mlp/scan-off/dropout0/L2"]["normalized"], entries["mlp/scan-off/none/L2"]["normalized"])
    _rerun(project, baseline)  # four cells, each its own: none vanishes


WRONG_SHAPES = ["[]", '{"entry_params": 9}', '"result"', "null",
                '{"body": {"cell": "mlp"}, "hlo-audit-cache": {"kind": "result"}}']


@pytest.mark.parametrize("content", WRONG_SHAPES)
def test_a_result_that_is_json_of_another_shape(warm, content):
    project, baseline = warm
    _entries(project)["mlp/scan-off/dropout0/L2"]["result"].write_text(content)
    _rerun(project, baseline)


def test_a_well_formed_entry_of_another_shape(warm):
    """Checksummed and made for this key and cell, but not a result (another writer's): a miss all the same."""
    project, baseline = warm
    entries = _entries(project)["mlp/scan-off/dropout0/L2"]
    header = json.loads(entries["result"].read_text())["hlo-audit-cache"]
    entries["result"].write_text(cache_store._json_entry({k: v for k, v in header.items() if k != "sha256"},
                                                          {"cell": "mlp", "entry_params": 8}))
    meta = json.loads(entries["lowering"].read_text())["hlo-audit-cache"]
    entries["lowering"].write_text(cache_store._json_entry({k: v for k, v in meta.items() if k != "sha256"},
                                                            ["not", "a", "record"]))
    _rerun(project, baseline, damaged=2)


def test_a_damaged_manifest(warm):
    project, baseline = warm
    manifests = sorted((project / ".hlo-audit-cache").rglob("*.manifest.json"))
    manifests[0].write_text(manifests[0].read_text()[:100])
    manifests[1].write_text(manifests[2].read_text())  # another cell's
    _rerun(project, baseline, damaged=2)


def test_an_entry_that_cannot_be_read_or_written(warm):
    project, baseline = warm
    result = _entries(project)["mlp/scan-off/dropout0/L2"]["result"]
    result.unlink()
    result.mkdir()  # read: "Is a directory"; rewriting it fails too
    outcome = in_project(project, "run", "--format", "json")
    assert _numbers(outcome) == baseline
    lines = outcome.stderr.splitlines()
    assert any("does not verify (unreadable" in line for line in lines), outcome.stderr
    assert sum("cannot be written" in line for line in lines) == 1


def test_a_cache_dir_that_is_a_file(tmp_path):
    (tmp_path / "hlo-audit.toml").write_text(EXAMPLE + 'cache_dir = "cache.txt"\n')
    (tmp_path / "cache.txt").write_text("not a folder")
    result = in_project(tmp_path, "run")
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        (f"hlo-audit: error: cache_dir {tmp_path / 'cache.txt'} is not a folder (fix it, point cache_dir elsewhere, "
         "or run with --no-cache)")]
    assert (tmp_path / "cache.txt").read_text() == "not a folder"
    assert in_project(tmp_path, "run", "--no-cache", "--only", "quant=none").exit_code == 0


@pytest.mark.parametrize(("folder", "why"), [("/sys", "is not writable"), ("/sys/hlo-audit-cache", "cannot create it"),
                                             ("{tmp}/cache.txt/cache", "cannot create it")])
def test_a_cache_dir_that_cannot_be_used(tmp_path, folder, why):
    """sysfs takes no new files, whoever asks (the suite runs as root too, where permissions would not stop it)."""
    (tmp_path / "cache.txt").write_text("")
    folder = folder.format(tmp=tmp_path)
    (tmp_path / "hlo-audit.toml").write_text(EXAMPLE + f'cache_dir = "{folder}"\n')
    for command in (["run"], ["check"], ["golden", "update"]):
        result = in_project(tmp_path, *command)
        assert result.exit_code == 2, result.output
        [line] = result.stderr.strip().splitlines()
        assert line.startswith(f"hlo-audit: error: cache_dir {folder}") and why in line, line
