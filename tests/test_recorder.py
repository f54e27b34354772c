"""What a cell's lowering read, recorded in its own process, and a target that cannot end or alter the check (issue 45).

Each attack is a pull request a hostile (or careless) contributor could send to a tiny plain-JAX project whose step
unrolls a loop as many times as a knob says: the golden is taken at 1, the pull request makes it 4 in a way the old
cache did not record (exit 0 from a warm cache, exit 1 without one). Each must now fail from the warm cache as it
does with ``--no-cache``. Then the targets that try to end the check (``sys.exit``, ``GeneratorExit``, ``os._exit``)
or to patch hlo-audit's policy from the model's module: a failed cell or a failing gate, never a pass.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from in_process import hlo_audit_here

CONFIG = '''
target = "model:step"
models = ["tiny"]
layers = [1]
'''

# The step: the knob (knob.py, the part each attack writes) says how many times the loop is unrolled.
MODEL = '''
import jax
import jax.numpy as jnp

import knob


def step(cell):
    def loss(w, x):
        for _ in range(knob.unroll(cell)):
            x = jnp.tanh(x @ w)
        return x.sum()
    return jax.jit(jax.grad(loss)).trace(jnp.ones((8, 8)), jnp.ones((4, 8)))


step.scan = ["off"]
step.quant = ["none"]
'''


def _project(root: Path, knob: str, model: str = MODEL) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "hlo-audit.toml").write_text(CONFIG)
    (root / "model.py").write_text(model)
    (root / "knob.py").write_text(textwrap.dedent(knob))
    return root


def _run(project: Path, *args, env: dict | None = None):
    return hlo_audit_here(project, *args, env=env)


def _golden_then_warm(project: Path, env: dict | None = None) -> None:
    """The golden taken, then a check that passes from the cache: the state a pull request meets."""
    assert _run(project, "golden", "update", env=env).returncode == 0
    warm = _run(project, "check", "--format", "json", env=env)
    assert warm.returncode == 0, warm.stderr
    assert all(cell["cached"] for cell in json.loads(warm.stdout)["cells"]), warm.stdout


def _fails_as_without_cache(project: Path, env: dict | None = None) -> dict:
    """The pull request's check from the warm cache fails as a check without the cache does; its one cell's JSON."""
    bare = _run(project, "check", "--no-cache", env=env)
    assert bare.returncode == 1, bare.stdout + bare.stderr  # the change is a real regression
    warm = _run(project, "check", "--format", "json", env=env)
    assert warm.returncode == 1, warm.stdout + warm.stderr
    (cell,) = json.loads(warm.stdout)["cells"]
    assert not cell["cached"]
    return cell


READ_WRITE = '''
from pathlib import Path

def unroll(cell):
    with open(Path(__file__).with_name("knob.txt"), "r+") as handle:  # opened to write: never read before
        return int(handle.read())
'''

ENVIRONB = '''
import os

def unroll(cell):
    return int(os.environb.get(b"HLO_AUDIT_TEST_KNOB", b"1"))
'''

EXISTS = '''
import os.path

def unroll(cell):
    return 4 if os.path.exists(os.path.join(os.path.dirname(__file__), "fast.flag")) else 1
'''

FAILED_IMPORT = '''
def unroll(cell):
    try:
        import fastknobs
    except ImportError:
        return 1
    return fastknobs.UNROLL
'''

SUBPROCESS = '''
import subprocess
from pathlib import Path

def unroll(cell):
    return int(subprocess.run(["cat", str(Path(__file__).with_name("knob.txt"))], capture_output=True,
                              check=True).stdout)
'''

UTIME = '''
import os
from pathlib import Path

def unroll(cell):
    path = Path(__file__).with_name("knob.txt")
    os.utime(path)  # its ctime now newer than the lowering's start: it looked made by the lowering
    return int(path.read_text())
'''


# (the knob, why the cell cannot be served): what it read may have changed under it, or was read by another program.
UNSERVABLE = {"a file opened for reading and writing": (READ_WRITE, "unservable: reads and writes {project}/knob.txt"),
              "a value read through a subprocess": (SUBPROCESS, "unservable: runs a subprocess at knob.py:6")}


@pytest.mark.parametrize("what", sorted(UNSERVABLE))
def test_what_cannot_be_keyed_is_lowered_every_run_and_said(tmp_path, what):
    knob, why = UNSERVABLE[what]
    project = _project(tmp_path, knob)
    (project / "knob.txt").write_text("1")
    assert _run(project, "golden", "update").returncode == 0
    again = _run(project, "check", "--format", "json")
    (cell,) = json.loads(again.stdout)["cells"]
    assert again.returncode == 0 and not cell["cached"]
    assert cell["relowered_because"] == why.format(project=project)
    assert f"(re-lowered: {why.format(project=project)})" in again.stderr  # the progress line says why
    (project / "knob.txt").write_text("4")
    _fails_as_without_cache(project)


def test_a_variable_read_as_bytes_keys_the_cell(tmp_path):
    project = _project(tmp_path, ENVIRONB)
    _golden_then_warm(project)
    listed = _run(project, "check", "--explain-cache")  # what must hold for the cell to be served
    assert listed.returncode == 0
    assert "tiny/scan-off/none/L1: served while all of this holds" in listed.stderr
    assert "  $HLO_AUDIT_TEST_KNOB = (unset)" in listed.stderr.splitlines()
    keyed = "what ran of it" if sys.version_info >= (3, 12) else "content"  # what ran: sys.monitoring (3.12+)
    assert any(line.startswith(f"  file knob.py: {keyed}") for line in listed.stderr.splitlines()), listed.stderr
    cell = _fails_as_without_cache(project, env={"HLO_AUDIT_TEST_KNOB": "4"})
    assert cell["relowered_because"] == "$HLO_AUDIT_TEST_KNOB changed"


# (the knob, the file the pull request adds, its content, why the cell is lowered again): absence was a read.
ADDED = {"a flag file os.path.exists asked for": (EXISTS, "fast.flag", "", "fast.flag appeared"),
         "a module an import did not find": (FAILED_IMPORT, "fastknobs.py", "UNROLL = 4\n",
                                             "module fastknobs appeared")}


@pytest.mark.parametrize("what", sorted(ADDED))
def test_a_file_the_pull_request_adds_where_the_lowering_found_none_is_seen(tmp_path, what):
    knob, name, content, why = ADDED[what]
    project = _project(tmp_path, knob)
    _golden_then_warm(project)
    (project / name).write_text(content)
    cell = _fails_as_without_cache(project)
    assert cell["relowered_because"] == why


def test_a_file_whose_times_the_lowering_set_is_still_an_input(tmp_path):
    project = _project(tmp_path, UTIME)
    (project / "knob.txt").write_text("1")
    _golden_then_warm(project)
    (project / "knob.txt").write_text("4")
    cell = _fails_as_without_cache(project)
    assert cell["relowered_because"] == "knob.txt changed"


# A config module read once through functools.cache, each model's unroll in it: in one process, the second cell's
# lowering never opened the file (the first one's did), and an edit for that model alone was served stale.
MEMOIZED = '''
import functools
import json
from pathlib import Path

@functools.cache
def _table():
    return json.loads(Path(__file__).with_name("knobs.json").read_text())

def unroll(cell):
    return _table()[cell.model]
'''


def test_a_file_a_memoized_loader_read_for_another_cell_keys_every_cell(tmp_path):
    project = _project(tmp_path, MEMOIZED)
    (project / "hlo-audit.toml").write_text(CONFIG.replace('["tiny"]', '["a", "b"]'))
    (project / "knobs.json").write_text('{"a": 1, "b": 1}')
    assert _run(project, "golden", "update").returncode == 0
    (project / "knobs.json").write_text('{"a": 1, "b": 4}')
    checked = _run(project, "check", "--format", "json")
    assert checked.returncode == 1, checked.stdout
    cells = {c["id"]: c for c in json.loads(checked.stdout)["cells"]}
    assert not cells["b/scan-off/none/L1"]["cached"] and not cells["a/scan-off/none/L1"]["cached"]
    assert "b/scan-off/none/L1" in checked.stdout and cells["b/scan-off/none/L1"]["relowered_because"] == \
        "knobs.json changed"


# A monorepo: the config and the model in hlo/, the module they share at the repository's root.
SHARED_AT_ROOT = '''
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import shared

def unroll(cell):
    return shared.UNROLL
'''


# What a change of shared.py's one statement is said as: what ran of it (Python 3.12+'s sys.monitoring), else the
# file by its content.
SHARED_CHANGED = "shared.py module-level statements changed" if sys.version_info >= (3, 12) else "shared.py changed"


def _monorepo(root: Path) -> Path:
    project = _project(root / "hlo", SHARED_AT_ROOT)
    (root / "shared.py").write_text("UNROLL = 1\n")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    return project


def test_a_copy_of_a_monorepo_checks_its_own_module_above_the_config(tmp_path):
    project = _monorepo(tmp_path / "repo")
    _golden_then_warm(project)
    subprocess.run(["cp", "-a", str(tmp_path / "repo"), str(tmp_path / "copy")], check=True)
    (tmp_path / "copy" / "shared.py").write_text("UNROLL = 4\n")
    cell = _fails_as_without_cache(tmp_path / "copy" / "hlo")
    assert cell["relowered_because"] == SHARED_CHANGED


def test_two_worktrees_sharing_a_cache_folder_each_check_their_own_files(tmp_path):
    repo = tmp_path / "repo"
    project = _monorepo(repo)
    cache = tmp_path / "shared-cache"
    (project / "hlo-audit.toml").write_text(f'cache_dir = "{cache}"\n' + CONFIG)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    _golden_then_warm(project)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "goldens"], check=True)
    subprocess.run([*git, "worktree", "add", "-q", str(tmp_path / "second")], check=True)
    (tmp_path / "second" / "shared.py").write_text("UNROLL = 4\n")
    cell = _fails_as_without_cache(tmp_path / "second" / "hlo")
    assert cell["relowered_because"] == SHARED_CHANGED


def test_a_distributions_metadata_counts_by_its_version_not_its_text(tmp_path, monkeypatch):
    """``pip install -e`` rewrites METADATA (the README, the pins) at every commit: a README-only change serves the
    cell; the version is what is keyed."""
    knob = '''
    from importlib import metadata

    def unroll(cell):
        return 1 if metadata.version("knoblib") else 2
    '''
    project = _project(tmp_path, knob)
    info = project / "knoblib-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: knoblib\nVersion: 0.1\n\nThe README.\n")
    # No RECORD (as MaxText's files count for the target that tests it: by content, not by what installed them).
    monkeypatch.syspath_prepend(str(project))  # installed, as far as every process here is concerned
    _golden_then_warm(project)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: knoblib\nVersion: 0.1\n\nAnother README.\n")
    served = _run(project, "check", "--format", "json")
    assert served.returncode == 0 and all(c["cached"] for c in json.loads(served.stdout)["cells"]), served.stdout


# A target that ends or alters the check: each is a failed cell naming what it did, never a pass.
ENDS = {
    "sys.exit": ("import sys\n\ndef unroll(cell):\n    sys.exit(0)\n", "SystemExit"),
    "GeneratorExit": ("def unroll(cell):\n    raise GeneratorExit\n", "GeneratorExit"),
    "os._exit": ("import os\n\ndef unroll(cell):\n    os._exit(0)\n", "ended (exit status 0)"),
    # The process that forked the cell's, killed from the cell: the job ends with the cell never reported.
    "kills its parent": ("import os, signal\n\ndef unroll(cell):\n    os.kill(os.getppid(), signal.SIGKILL)\n",
                         "killed by SIGKILL"),
}


@pytest.mark.parametrize("how", sorted(ENDS))
def test_a_target_that_ends_its_process_fails_its_cell(tmp_path, how):
    project = _project(tmp_path, "def unroll(cell):\n    return 1\n")
    assert _run(project, "golden", "update").returncode == 0
    knob, said = ENDS[how]
    (project / "knob.py").write_text(knob)
    checked = _run(project, "check", "--no-cache")
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert "Traceback" not in checked.stderr and "tiny/scan-off/none/L1" in checked.stdout
    assert said in checked.stdout, checked.stdout


# Two lines in the model's module, called "a compat shim", each turning off what judges the check: the policy's
# action, the gate's judging of every rule, the registry's rule table. The code under test runs only in lowering
# processes; the judging process never imports it.
PATCHES = {
    "the policy": ("import hlo_audit.policy as _p\n\n"
                   "_p.Policy.action = lambda self, rule, default='fail': _p.Action('off')\n"),
    "the gate": ("import hlo_audit.judging.gate as _g\n\n"
                 "_g.Gate.judges = lambda self, rule: False\n"),
    "the rules": ("import hlo_audit.rules.registry as _r\n\n"
                  "_r.judged = lambda: ()\n"),
}


@pytest.mark.parametrize("what", sorted(PATCHES))
def test_a_target_module_patching_hlo_audit_does_not_pass_a_regression(tmp_path, what):
    project = _project(tmp_path, "def unroll(cell):\n    return 1\n")
    assert _run(project, "golden", "update").returncode == 0
    (project / "knob.py").write_text(PATCHES[what] + "\ndef unroll(cell):\n    return 8\n")
    checked = _run(project, "check", "--no-cache")
    assert checked.returncode == 1, checked.stdout
    assert "regression" in checked.stdout and "tiny/scan-off/none/L1" in checked.stdout
    import hlo_audit.judging.gate as gate  # this process never imported the project's modules
    import hlo_audit.policy as policy
    import hlo_audit.rules.registry as registry

    assert "knob" not in __import__("sys").modules and policy.Policy.action.__module__ == "hlo_audit.policy"
    assert gate.Gate.judges.__module__ == "hlo_audit.judging.gate" and registry.judged.__module__ == registry.__name__


def test_the_judging_process_never_imports_the_target(tmp_path):
    project = _project(tmp_path, "def unroll(cell):\n    return 1\n")
    for command in (("list",), ("golden", "update"), ("check",)):
        assert _run(project, *command).returncode == 0
        assert "model" not in __import__("sys").modules or \
            getattr(__import__("sys").modules["model"], "__file__", "") != str(project / "model.py")


# Both models' code in one module: an edit to the function only model b's lowering runs.
PER_MODEL = '''
def unroll(cell):
    return _for_a() if cell.model == "a" else _for_b()


def _for_a():
    return 1


def _for_b():
    return 1
'''


@pytest.mark.skipif(sys.version_info < (3, 12), reason="what ran is heard through sys.monitoring (Python 3.12+): "
                                                    "on 3.11 a module's file counts by its content")
def test_an_edit_to_a_function_only_one_models_lowering_runs_relowers_that_model_only(tmp_path):
    project = _project(tmp_path, PER_MODEL)
    (project / "hlo-audit.toml").write_text(CONFIG.replace('["tiny"]', '["a", "b"]'))
    assert _run(project, "golden", "update").returncode == 0
    (project / "knob.py").write_text(PER_MODEL.replace("def _for_b():\n    return 1", "def _for_b():\n    return 4"))
    checked = _run(project, "check", "--format", "json")
    assert checked.returncode == 1, checked.stdout
    cells = {c["id"]: c for c in json.loads(checked.stdout)["cells"]}
    assert cells["a/scan-off/none/L1"]["cached"] and not cells["b/scan-off/none/L1"]["cached"]
    assert cells["b/scan-off/none/L1"]["relowered_because"] == "knob.py _for_b changed"
    # A comment in code that ran, on its own line's end (no line moves): the program is the same, served.
    (project / "knob.py").write_text(PER_MODEL.replace("return 1\n\n\ndef _for_b", "return 1  # a's\n\n\ndef _for_b"))
    again = _run(project, "check", "--format", "json")
    assert again.returncode == 0 and all(c["cached"] for c in json.loads(again.stdout)["cells"]), again.stdout
    # A comment line above b's function: what it runs is the same, only where its lines are (jax writes them into
    # the program's metadata) moved. Served, its lines moved with it (``cache.moved``: tests/test_cache_moved.py).
    four = PER_MODEL.replace("def _for_b():\n    return 1", "def _for_b():\n    return 4")  # the newest variant's
    (project / "knob.py").write_text(four.replace("\n\ndef _for_b", "\n\n# b's\ndef _for_b"))
    moved = _run(project, "check", "--format", "json")
    assert all(c["cached"] for c in json.loads(moved.stdout)["cells"]), moved.stdout
    # A statement added at the module's top level: named as such.
    (project / "knob.py").write_text(four.replace("\n\ndef _for_b", "\n\nFILLER = 0\n\n\ndef _for_b"))
    added = {c["id"]: c for c in json.loads(_run(project, "check", "--format", "json").stdout)["cells"]}
    assert added["b/scan-off/none/L1"]["relowered_because"] == "knob.py module-level statements changed"
