"""A plain-JAX install (issue 40, item 5): hlo-audit's core needs jax, jaxlib, typer, rich and pandas, and nothing
of Flax. Run in a fresh environment that holds only what pyproject.toml's dependencies bring (tests/venvs.py: a
view of this environment's distributions, nothing downloaded): ``init --callable`` and ``check`` work there, the
gate still fails a changed program, ``count``/``diff``/``rng`` read HLO, and a Flax target asked for is one line
(exit 2) naming the extra that brings it.
"""

from __future__ import annotations

import subprocess
import textwrap
import tomllib
from pathlib import Path

import pytest

from venvs import clean_env, requirement_closure, site_view, venv_over

REPO = Path(__file__).resolve().parents[1]

STEP = """\
import jax
import jax.numpy as jnp


def lower(cell):
    def step(w, x):
        for _ in range(cell.layers):
            x = jnp.tanh(x @ w){extra}
        return x.sum()

    return jax.jit(step).lower(jnp.zeros((4, 4)), jnp.ones((2, 4)))
"""


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> Path:
    """The python of an environment holding pyproject.toml's dependencies and what they require, no more."""
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    core = requirement_closure(declared)
    assert not {"flax", "optax", "orbax-checkpoint", "tensorstore", "pyyaml"} & core, sorted(core)
    root = tmp_path_factory.mktemp("plain")
    return venv_over(root / "env", site_view(root / "view", lambda name: name in core))


def hlo_audit(python: Path, folder: Path, *args: str) -> subprocess.CompletedProcess:
    """hlo-audit of this checkout (its source on PYTHONPATH) in the plain environment."""
    return subprocess.run([str(python), "-m", "hlo_audit", *args], cwd=folder, capture_output=True, text=True,
                          env=clean_env(PYTHONPATH=str(REPO)), timeout=600)


def one_line(ran: subprocess.CompletedProcess) -> str:
    assert ran.returncode == 2, (ran.stdout, ran.stderr)
    lines = ran.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in ran.stderr, ran.stderr
    return lines[0]


def test_the_environment_has_no_flax(plain, tmp_path):
    ran = subprocess.run([str(plain), "-c", "import importlib.util as u; print(u.find_spec('flax'), "
                          "u.find_spec('yaml'), u.find_spec('jax') is not None, u.find_spec('hlo_audit'))"],
                         capture_output=True, text=True, env=clean_env(), timeout=120, cwd=tmp_path)
    assert ran.stdout.split() == ["None", "None", "True", "None"], ran.stderr


def test_init_callable_and_check_without_flax_and_the_gate_still_fails_a_change(plain, tmp_path):
    (tmp_path / "model.py").write_text(STEP.format(extra=""))
    made = hlo_audit(plain, tmp_path, "init", "--callable", "model:lower", "--model", "m", "--layers", "2,4")
    assert made.returncode == 0, made.stderr
    assert "golden update" in made.stdout and (tmp_path / "golden").is_dir(), made.stdout
    assert '"flax==' not in (tmp_path / ".github/workflows/hlo-audit.yml").read_text()
    checked = hlo_audit(plain, tmp_path, "check")
    assert checked.returncode == 0 and "check passed" in checked.stdout, (checked.stdout, checked.stderr)
    golden = next((tmp_path / "golden").rglob("L2.hlo.txt"))
    counted = hlo_audit(plain, tmp_path, "count", str(golden))
    assert counted.returncode == 0 and "f32" in counted.stdout, counted.stderr
    # One more op per layer: the gate must see it, in the same environment.
    (tmp_path / "model.py").write_text(STEP.format(extra="\n            x = jnp.sin(x)"))
    changed = hlo_audit(plain, tmp_path, "check")
    assert changed.returncode == 1 and "FAILED" in changed.stdout, (changed.stdout, changed.stderr)
    assert "sin" in changed.stdout, changed.stdout


@pytest.mark.parametrize("config, extra", [
    ('target = "nnx"\nmodels = ["m"]\nlayers = [2]\n[nnx.models.m]\nmodel = "model:Model"\n'
     'layers = "num_layers"\ninputs = { x = "float32[2,4]" }\n', "flax"),
    ('target = "maxtext"\nmodels = ["llama3-8b"]\nlayers = [2]\n', "maxtext"),
], ids=["nnx-target", "maxtext-target"])  # not "maxtext": the marker-name skip of conftest
def test_a_flax_target_without_flax_is_one_line_naming_the_extra(plain, tmp_path, config, extra):
    (tmp_path / "hlo-audit.toml").write_text(config)
    line = one_line(hlo_audit(plain, tmp_path, "check"))
    assert line.startswith("hlo-audit: error: hlo-audit.toml: target ") and "needs flax" in line, line
    assert line.endswith(f"pip install 'hlo-audit[{extra}]'") or f"'hlo-audit[{extra}]', which needs" in line
    assert not (tmp_path / "golden").exists() and not (tmp_path / ".hlo-audit-cache").exists()


def test_init_nnx_without_flax_is_one_line_and_writes_nothing(plain, tmp_path):
    (tmp_path / "model.py").write_text(textwrap.dedent("""\
        from flax import nnx

        class Model(nnx.Module):
            pass
    """))
    line = one_line(hlo_audit(plain, tmp_path, "init", "--nnx", "model:Model", "--input", "x=float32[2,4]"))
    assert line == ("hlo-audit: error: init --nnx: target 'nnx' needs flax and optax, which are not installed "
                    "here: pip install 'hlo-audit[flax]'"), line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.py"]
