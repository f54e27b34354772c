"""The workflow `hlo-audit init` writes installs hlo-audit the way the one that wrote it was installed (issue 40,
item 4), read from pip's record of it (PEP 610 ``direct_url.json``: ``scaffold.provenance``).

End to end, with no index (tests/venvs.py: fresh virtual environments over a view of this one's distributions,
hlo-audit left out): this checkout committed to a git repository of the test's own, installed from it by
``git+file://`` (and, apart, as a wheel ``pip wheel`` built from it), runs ``init`` through its installed entry
point; then the written workflow's install lines run as written (``--no-deps --no-index`` added, and a
``--find-links`` folder for the wheel) in a fresh environment of a runner's, which must end up holding that very
commit or wheel. The readings of each kind of record pip writes (a URL's archive, an editable folder, a checkout's
remote) are unit tests below.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import shlex
import shutil
import subprocess
from importlib import metadata
from pathlib import Path

import pytest
import yaml

import hlo_audit
from hlo_audit.scaffold.provenance import Installed, from_direct_url, installed, remote_at
from venvs import clean_env, site_view, venv_over

REPO = Path(__file__).resolve().parents[1]
TARGET = """\
def lower(cell):
    raise NotImplementedError  # init --no-golden never lowers
lower.scan = ["off"]
"""

needs_build_tools = pytest.mark.skipif(
    importlib.util.find_spec("hatchling") is None or shutil.which("git") is None,
    reason="building hlo-audit with no index needs hatchling (the dev extra: make setup) and git")


def run(*args, cwd: Path | None = None) -> subprocess.CompletedProcess:
    ran = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True, env=clean_env(),
                         timeout=600)
    assert ran.returncode == 0, (args, ran.stdout[-3000:], ran.stderr[-3000:])
    return ran


def pip(python: Path, *args) -> subprocess.CompletedProcess:
    return run(python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--no-build-isolation", *args)


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> tuple[Path, str]:
    """This checkout's package, committed to a git repository of the test's: (its folder, the commit)."""
    folder = tmp_path_factory.mktemp("source") / "hlo-audit"
    folder.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, folder / name)
    shutil.copytree(REPO / "hlo_audit", folder / "hlo_audit", ignore=shutil.ignore_patterns("__pycache__"))
    git = ["git", "-C", folder, "-c", "user.name=t", "-c", "user.email=t@example.com"]
    run(*git, "init", "-q")
    run(*git, "add", "-A")
    run(*git, "commit", "-q", "-m", "hlo-audit")
    return folder, run(*git, "rev-parse", "HEAD").stdout.strip()


@pytest.fixture(scope="module")
def view(tmp_path_factory) -> Path:
    """Every distribution of this environment but hlo-audit: jax's pins are satisfied, hlo-audit is not there."""
    return site_view(tmp_path_factory.mktemp("view") / "site", lambda name: name != "hlo-audit")


def init_with(python: Path, project: Path) -> dict:
    """``hlo-audit init --callable`` by the entry point installed beside ``python``: the workflow it wrote."""
    project.mkdir()
    (project / "model.py").write_text(TARGET)
    made = run(python.parent / "hlo-audit", "init", "--callable", "model:lower", "--model", "m", "--no-golden",
               cwd=project)
    assert "wrote .github/workflows/hlo-audit.yml" in made.stdout, made.stdout
    return yaml.safe_load((project / ".github/workflows/hlo-audit.yml").read_text())


def install_steps(doc: dict) -> tuple[list[str], list[str]]:
    """(the check job's Install lines, the merge job's install line), as a runner's shell reads them."""
    check = next(s for s in doc["jobs"]["check"]["steps"] if s.get("name") == "Install")["run"].splitlines()
    merge = [s["run"] for s in doc["jobs"]["merge"]["steps"] if "pip install" in s.get("run", "")]
    return check, merge


def run_as_runner(python: Path, lines: list[str], *extra: str) -> None:
    """Each ``pip install`` line as written, with no index and no dependencies (they are the view's)."""
    for line in lines:
        words = shlex.split(line, comments=True)
        if not words:
            continue
        words = words[2:] if words[:2] == ["python", "-m"] else words
        assert words[:2] == ["pip", "install"], line
        if words[2:] == ["--upgrade", "pip"]:
            continue  # the runner's own pip: the view's here
        pip(python, *extra, *words[2:])


def installed_record(python: Path) -> tuple[str, dict | None, str]:
    """(version, direct_url.json, where hlo_audit imports from) of hlo-audit in ``python``'s environment."""
    script = ("import importlib.metadata as m, json, hlo_audit; d = m.distribution('hlo-audit'); "
              "print(json.dumps([d.version, json.loads(d.read_text('direct_url.json') or 'null'), hlo_audit.__file__]))")
    return tuple(json.loads(run(python, "-c", script, cwd=python.parent).stdout))


@needs_build_tools
def test_installed_from_a_git_url_the_workflow_installs_that_commit(source, view, tmp_path):
    folder, commit = source
    user = venv_over(tmp_path / "user", view)
    pip(user, f"hlo-audit @ git+{folder.as_uri()}")  # no revision: pip records the commit it resolved
    doc = init_with(user, tmp_path / "project")
    check, merge = install_steps(doc)
    wanted = f'"hlo-audit @ git+{folder.as_uri()}@{commit}"'
    tool = [line for line in check if line.startswith("pip install ") and "hlo-audit" in line]
    assert len(tool) == 1 and tool[0].startswith(f"pip install {wanted} "), check
    assert merge == [f"python -m pip install {wanted}"], merge
    # A file:// repository is this machine's: the comment says so, and what to put there instead.
    comment = " ".join(line.lstrip("# ") for line in check if line.startswith("#"))
    assert f"came from the git repository {folder} on this machine, which a runner cannot reach" in comment, comment
    assert "git+https://HOST/OWNER/hlo-audit@COMMIT" in comment, comment
    for job, job_lines in (("check", check), ("merge", merge)):
        runner = venv_over(tmp_path / f"runner-{job}", view)
        run_as_runner(runner, job_lines)
        version, record, module = installed_record(runner)
        assert record["vcs_info"]["commit_id"] == commit and record["url"] == folder.as_uri(), record
        assert module.startswith(str(runner.parent.parent)), module  # the runner's own install, not the view's


@needs_build_tools
def test_installed_from_a_wheel_the_workflow_pins_its_version_and_says_where_it_came_from(source, view, tmp_path):
    folder, _ = source
    wheels = tmp_path / "wheels"
    user = venv_over(tmp_path / "user", view)
    run(user, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-index", "--no-build-isolation", "-w", wheels, folder)
    wheel = next(wheels.glob("hlo_audit-*.whl"))
    pip(user, wheel)
    doc = init_with(user, tmp_path / "project")
    check, merge = install_steps(doc)
    version = installed_record(user)[0]
    pin = f'"hlo-audit=={version}"'
    assert any(line.startswith(f"pip install {pin} ") for line in check) and merge == [f"python -m pip install {pin}"]
    comment = " ".join(line.lstrip("# ") for line in check if line.startswith("#"))
    assert f"came from the file {wheel}, which a runner cannot reach: hlo-audit's install line asks an index " \
           f"for hlo-audit {version}" in comment, comment
    # The pin resolves wherever the wheel is served: here a --find-links folder, as an index would.
    runner = venv_over(tmp_path / "runner", view)
    run_as_runner(runner, check + merge, "--find-links", wheels)
    assert installed_record(runner)[:2] == (version, None)


# ----------------------------------------------------------------------------------------------------------------
# Each kind of record pip writes, read
# ----------------------------------------------------------------------------------------------------------------

def test_from_an_index_the_version_and_nothing_to_say():
    made = from_direct_url(None, "0.1.0")
    assert made == Installed("0.1.0") and made.requirement() == '"hlo-audit==0.1.0"' and made.comment() == []
    assert made.requirement("[maxtext]") == '"hlo-audit[maxtext]==0.1.0"'


def test_from_a_git_server_the_commit_pip_resolved():
    record = {"url": "https://github.com/acme/hlo-audit.git", "subdirectory": "py",
              "vcs_info": {"vcs": "git", "requested_revision": "main", "commit_id": "0123abcd" * 5}}
    made = from_direct_url(json.dumps(record), "0.1.0")
    assert made.requirement("[maxtext]") == \
        f'"hlo-audit[maxtext] @ git+https://github.com/acme/hlo-audit.git@{"0123abcd" * 5}#subdirectory=py"'
    assert made.advice() is None


def test_from_an_archive_url_that_url_with_its_hash():
    record = {"url": "https://example.com/hlo_audit-0.1.0-py3-none-any.whl",
              "archive_info": {"hashes": {"sha256": "ab" * 32}}}
    assert from_direct_url(json.dumps(record), "0.1.0").requirement() == \
        f'"hlo-audit @ https://example.com/hlo_audit-0.1.0-py3-none-any.whl#sha256={"ab" * 32}"'


def test_from_an_editable_checkout_with_a_remote_the_comment_names_the_remote_at_its_commit(tmp_path):
    git = ["git", "-C", tmp_path, "-c", "user.name=t", "-c", "user.email=t@example.com"]
    (tmp_path / "pyproject.toml").write_text("")
    run(*git, "init", "-q")
    run(*git, "add", "-A")
    run(*git, "commit", "-q", "-m", "x")
    run(*git, "remote", "add", "origin", "git@github.com:acme/hlo-audit.git")
    head = run(*git, "rev-parse", "HEAD").stdout.strip()
    record = {"url": tmp_path.as_uri(), "dir_info": {"editable": True}}
    made = from_direct_url(json.dumps(record), "0.1.0")
    assert made.requirement() == '"hlo-audit==0.1.0"'
    advice = made.advice()
    assert advice == (f"hlo-audit came from the folder {tmp_path} (editable), which a runner cannot reach: "
                      f"hlo-audit's install line asks an index for hlo-audit 0.1.0. Replace \"hlo-audit==0.1.0\" "
                      f"there and in the merge job with \"hlo-audit @ git+ssh://git@github.com/acme/hlo-audit.git@"
                      f"{head}\" (this checkout's remote at its commit, once pushed).")
    assert all(len(line) <= 108 for line in made.comment()) and " ".join(
        line.removeprefix("# ") for line in made.comment()) == advice
    (tmp_path / "sub").mkdir()
    assert remote_at(tmp_path / "sub") == f"git+ssh://git@github.com/acme/hlo-audit.git@{head}#subdirectory=sub"


def test_a_record_pip_would_not_write_is_read_as_an_index():
    for text in ("not json", "[]", "{}", '{"url": ""}'):
        assert from_direct_url(text, "0.1.0") == Installed("0.1.0"), text


def test_the_workflow_carries_the_comment_in_both_jobs(monkeypatch):
    module = importlib.import_module("hlo_audit.scaffold.workflow")  # the package's name is its function's
    local = Installed("0.1.0", unreachable="the folder /src/hlo-audit (editable)")
    monkeypatch.setattr(module, "installed", lambda: local)
    doc_text = module.workflow(['pip install "hlo-audit==0.1.0"'], 1, "3.12")
    assert doc_text.count("# hlo-audit came from the folder /src/hlo-audit (editable)") == 1
    assert "# hlo-audit as in the check job's Install step: replace it here as the comment there says" in doc_text
    assert yaml.safe_load(doc_text)["jobs"]["merge"]["steps"][1] == {"run": 'python -m pip install "hlo-audit==0.1.0"'}
    monkeypatch.setattr(module, "installed", lambda: Installed("0.1.0"))
    assert "cannot reach" not in module.workflow(['pip install "hlo-audit==0.1.0"'], 1, "3.12")



def test_run_from_its_source_uninstalled_the_comment_names_the_source(monkeypatch):
    def absent(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "distribution", absent)
    made = installed.__wrapped__()  # uncached: this process's own reading stays what it is
    assert made.requirement() == f'"hlo-audit=={hlo_audit.__version__}"'
    source = Path(hlo_audit.__file__).resolve().parents[1]
    assert made.advice().startswith(f"hlo-audit came from its source in {source}, not installed, which a runner "
                                    "cannot reach"), made.advice()
