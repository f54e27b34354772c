"""`hlo-audit init` installs what the target imports (issue 34, item 5).

A trainer's first CI run fails when the workflow installs hlo-audit, jax, jaxlib and flax and nothing the trainer
imports (optax, ml_collections, ...). init imports the target: the distributions that import brought in are pinned
in the workflow's install step at the versions installed here, with a note saying which. The repository's own
package, hlo-audit and what hlo-audit's own install brings (numpy for jax) are not among them; a target that imports
only jax and the standard library adds no line.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
import yaml

from in_process import hlo_audit_here

REPO = Path(__file__).resolve().parents[1]
IMPORTED = "# what the target imports"


@pytest.fixture
def repo(tmp_path) -> Path:
    folder = tmp_path / "repo"
    folder.mkdir()
    return folder


def install_step(folder: Path) -> list[str]:
    doc = yaml.safe_load((folder / ".github/workflows/hlo-audit.yml").read_text())
    step = next(s for s in doc["jobs"]["check"]["steps"] if s.get("name") == "Install")
    return step["run"].splitlines()


def write_trainer(folder: Path, imports: str, name: str) -> None:
    """A trainer package of the repository's own: ``step.py`` (the target) imports ``imports`` and its own
    ``model.py``, which imports flax."""
    package = folder / name
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "model.py").write_text("from flax import linen as nn  # noqa: F401\n")
    (package / "step.py").write_text(STEP.format(imports=imports, name=name))


STEP = """import json
import os

import jax
import jax.numpy as jnp
{imports}

from {name} import model  # noqa: F401


def lower(cell):
    return jax.jit(lambda x: jnp.sin(x) * cell.layers).trace(jnp.zeros((4,)))


lower.scan = ["off"]
"""


def test_init_pins_what_a_trainer_imports_found_from_a_fresh_process(repo):
    """In a process of its own, as a user runs init: the trainer imports optax and hypothesis by name (so do many
    test-heavy repositories), and hypothesis brings in sortedcontainers, which nothing of hlo-audit's requires."""
    write_trainer(repo, "import optax\nimport hypothesis  # noqa: F401", "trainer")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo), str(REPO), os.environ.get("PYTHONPATH", "")])}
    made = subprocess.run([sys.executable, "-m", "hlo_audit", "init", "--callable", "trainer.step:lower", "--model",
                           "mlp", "--no-golden"], cwd=repo, capture_output=True, text=True, env=env, timeout=600)
    assert made.returncode == 0, made.stderr[-3000:]
    lines = install_step(repo)
    (imported,) = [line for line in lines if IMPORTED in line]
    pinned = dict(pin.strip('"').split("==") for pin in imported.split("#")[0].split()[2:])
    normalized = {name.lower().replace("_", "-"): version for name, version in pinned.items()}
    for name in ("optax", "hypothesis", "sortedcontainers"):
        assert normalized.get(name) == metadata.version(name), (name, imported)
    # Not the repository's own package, not hlo-audit, not what jax's own install brings, not pinned twice; flax
    # (its model.py imports it) once, here: a callable target's goldens pin jax and jaxlib only (issue 48).
    for name in ("trainer", "hlo-audit", "numpy", "ml-dtypes", "opt-einsum", "jax", "jaxlib"):
        assert name not in normalized, (name, imported)
    assert normalized.get("flax") == metadata.version("flax")
    assert sum(line.count('"flax==') for line in lines) == 1, lines
    # The pins of what the target imports come after hlo-audit's own, and the note names each with its version.
    assert lines.index(imported) > next(i for i, line in enumerate(lines) if '"hlo-audit==' in line)
    note = next(line for line in made.stdout.splitlines() if "what the target imports" in line)
    assert f"optax {metadata.version('optax')}" in note and f"hypothesis {metadata.version('hypothesis')}" in note


def test_a_target_of_jax_and_the_standard_library_adds_no_install_line(repo, monkeypatch):
    # A module of its own: write_trainer's package imports flax (its model.py), which the workflow now installs.
    (repo / "plain_step.py").write_text(PLAIN_JAX)
    monkeypatch.syspath_prepend(str(repo))
    made = hlo_audit_here(repo, "init", "--callable", "plain_step:lower", "--model", "mlp", "--no-golden")
    assert made.returncode == 0, made.stderr
    assert not [line for line in install_step(repo) if IMPORTED in line], install_step(repo)
    assert "what the target imports" not in made.stdout


PLAIN_JAX = """import jax
import jax.numpy as jnp


def lower(cell):
    return jax.jit(lambda x: jnp.sin(x) * cell.layers).trace(jnp.zeros((4,)))
"""


def test_a_plain_jax_targets_workflow_installs_no_flax(repo, monkeypatch):
    """Issue 48: the workflow of a function that imports jax alone installed flax (pinned for every target)."""
    (repo / "jax_only_step.py").write_text(PLAIN_JAX)
    monkeypatch.syspath_prepend(str(repo))
    made = hlo_audit_here(repo, "init", "--callable", "jax_only_step:lower", "--model", "mlp", "--no-golden")
    assert made.returncode == 0, made.stderr
    lines = install_step(repo)
    assert any('"jax==' in line for line in lines) and not any("flax" in line for line in lines), lines


def test_init_writes_the_quant_values_a_function_declares(repo, monkeypatch):
    """Issue 48: a function declaring ``lower.quant = ["base"]`` got ``quant = ["none"]``, which its own
    validation then refused ("lowers quant base only"): init refused the config it would write. The config it writes
    now names the declared values, and the goldens and a check follow from it."""
    (repo / "based_step.py").write_text(PLAIN_JAX + '\n\nlower.quant = ["base"]\n')
    monkeypatch.syspath_prepend(str(repo))
    made = hlo_audit_here(repo, "init", "--callable", "based_step:lower", "--model", "mlp", "--layers", "2")
    assert made.returncode == 0, made.stdout + made.stderr
    assert tomllib.loads((repo / "hlo-audit.toml").read_text())["quant"] == ["base"]
    assert sorted(p.name for p in (repo / "golden/mlp/scan-off").iterdir()) == ["base"]
    assert hlo_audit_here(repo, "check").returncode == 0


@pytest.mark.parametrize("models, shards", [(["a"], 1), (["a", "b"], 2)])
def test_the_workflow_says_its_shards_in_the_right_number(repo, monkeypatch, models, shards):
    name = f"counted_trainer_{shards}"
    write_trainer(repo, "", name)
    monkeypatch.syspath_prepend(str(repo))
    made = hlo_audit_here(repo, "init", "--callable", f"{name}.step:lower",
                          *[a for m in models for a in ("--model", m)], "--no-golden")
    assert made.returncode == 0, made.stderr
    head = (repo / ".github/workflows/hlo-audit.yml").read_text().splitlines()[0]
    assert f"`hlo-audit check` in {shards} shard{'s' if shards > 1 else ''}, merged" in head, head


def test_the_workflow_sets_up_the_python_that_made_the_goldens(repo, monkeypatch):
    write_trainer(repo, "", "versioned_trainer")
    monkeypatch.syspath_prepend(str(repo))
    assert hlo_audit_here(repo, "init", "--callable", "versioned_trainer.step:lower", "--model", "mlp",
                          "--no-golden").returncode == 0
    doc = yaml.safe_load((repo / ".github/workflows/hlo-audit.yml").read_text())
    pythons = [s["with"]["python-version"] for job in doc["jobs"].values() for s in job["steps"]
               if s.get("uses", "").startswith("actions/setup-python")]
    assert pythons == [f"{sys.version_info.major}.{sys.version_info.minor}"] * 2
