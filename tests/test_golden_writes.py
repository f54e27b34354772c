"""Where and how goldens are written (issue 37 item 7): nothing outside the project folder, links included, and a
rewritten golden keeps its mode.

The example callable target (two cells: scan on and off) through the real CLI in this process; a golden folder
that is a symbolic link out of the project, a config that names one outside it, and golden files whose mode is not
the umask's.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
from pathlib import Path

import pytest

from in_process import Ran, hlo_audit_here
from projects import config

pytestmark = pytest.mark.xdist_group("golden_writes")
SUMMARY = "golden/mlp/scan-off/none/L2.json"


def one_line_error(result: Ran, *must: str) -> str:
    assert result.returncode == 2, (result.returncode, result.stdout[-2000:], result.stderr[-2000:])
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if not line.startswith("hlo-audit: cell ")]
    assert len(lines) == 1 and lines[0].startswith("hlo-audit: error: "), result.stderr
    for text in must:
        assert text in lines[0], (text, lines[0])
    return lines[0]


def everything(folder: Path) -> dict[str, tuple[int, bytes | str]]:
    """Every entry under ``folder`` with its mode and content (a link: its target)."""
    entries = {}
    for path in sorted(folder.rglob("*")):
        info = path.lstat()
        content = os.readlink(path) if path.is_symlink() else b"" if path.is_dir() else path.read_bytes()
        entries[str(path.relative_to(folder))] = (info.st_mode, content)
    return entries


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Path:
    """A project with its goldens written."""
    project = tmp_path_factory.mktemp("writes") / "project"
    project.mkdir()
    (project / "hlo-audit.toml").write_text(config())
    result = hlo_audit_here(project, "golden", "update")
    assert result.returncode == 0, result.stderr
    return project


@contextlib.contextmanager
def umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def stale(path: Path) -> None:
    """The golden written under another compiler stack: `golden update` must rewrite it, and a local `check` reads it
    (the stack's move advisory there)."""
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "environment": {**record["environment"], "jaxlib": "0.0.1"}}))


@pytest.mark.parametrize("how", ["golden_dir a link out", "a folder above it a link out", "golden_dir outside"])
def test_golden_update_never_writes_outside_the_project(made, tmp_path, how):
    """Issue 37: with golden/ a symbolic link to a folder outside the project, `golden update` wrote there (and
    staged, swapped and deleted beside it). Refused in one line, exit 2; nothing written there or beside it."""
    project = shutil.copytree(made, tmp_path / "project", symlinks=True)
    outside = tmp_path / "elsewhere"
    shutil.move(project / "golden", outside / "golden")
    stale(outside / "golden/mlp/scan-off/none/L2.json")
    (outside / "keep.txt").write_text("someone else's\n")
    if how == "golden_dir a link out":
        (project / "golden").symlink_to(outside / "golden")
    elif how == "a folder above it a link out":
        (project / "ci").symlink_to(outside)
        (project / "hlo-audit.toml").write_text(config(golden_dir="ci/golden"))
    else:
        (project / "hlo-audit.toml").write_text(config(golden_dir="../elsewhere/golden"))
    before = everything(outside), sorted(os.listdir(tmp_path))
    line = one_line_error(hlo_audit_here(project, "golden", "update"), "outside the project folder",
                          f"{(outside / 'golden').resolve()}", "nothing written")
    assert ("through a symbolic link" in line) == (how != "golden_dir outside"), line
    assert (everything(outside), sorted(os.listdir(tmp_path))) == before
    # measure --record writes goldens too: refused the same way, nothing written.
    one_line_error(hlo_audit_here(project, "measure", "--host-only", "--record", "--host-calls", "2", "--rounds", "1"),
                   "outside the project folder")
    assert (everything(outside), sorted(os.listdir(tmp_path))) == before
    # Reading them stays allowed: check finds the goldens where the path leads (without them: missing, exit 1).
    assert hlo_audit_here(project, "check").returncode == 0


def test_a_link_inside_the_project_is_followed(made, tmp_path):
    """golden/ a link to a folder that is still inside the project is written where it leads."""
    project = shutil.copytree(made, tmp_path / "project", symlinks=True)
    (project / "ci").mkdir()
    shutil.move(project / "golden", project / "ci/golden")
    (project / "golden").symlink_to(project / "ci/golden")
    stale(project / "ci/golden/mlp/scan-off/none/L2.json")
    result = hlo_audit_here(project, "golden", "update")
    assert result.returncode == 0 and "1 written" in result.stdout, result.stdout + result.stderr
    assert (project / "golden").is_symlink() and hlo_audit_here(project, "check").returncode == 0


def test_a_rewritten_golden_keeps_its_mode_and_a_new_one_gets_the_umasks(made, tmp_path):
    """Issue 37: `measure --record` rewrote golden summaries with mode 600 (mkstemp's), and `golden update` gave a
    rewritten golden the umask's mode. A golden rewritten by either keeps the mode it had; a new one gets the
    umask's, as any new file."""
    project = shutil.copytree(made, tmp_path / "project", symlinks=True)
    summary, text = project / SUMMARY, project / SUMMARY.replace(".json", ".hlo.txt")
    with umask(0o077):
        os.chmod(summary, 0o664)
        os.chmod(text, 0o640)
        stale(summary)
        text.write_text(text.read_text() + "\n")
        result = hlo_audit_here(project, "golden", "update")
        assert result.returncode == 0 and "1 written" in result.stdout, result.stdout + result.stderr
        assert (stat.S_IMODE(summary.stat().st_mode), stat.S_IMODE(text.stat().st_mode)) == (0o664, 0o640)
        os.chmod(summary, 0o644)
        result = hlo_audit_here(project, "measure", "--host-only", "--record", "--host-calls", "2", "--rounds", "1",
                                "--format", "json")
        assert result.returncode == 0, result.stderr
        assert "mlp/scan-off/none/L2" in json.loads(result.stdout)["recorded"]
        assert "host" in json.loads(summary.read_text()) and stat.S_IMODE(summary.stat().st_mode) == 0o644
        (project / "hlo-audit.toml").write_text(config(layers=[2, 3]))
        assert hlo_audit_here(project, "golden", "update").returncode == 0
        assert stat.S_IMODE((project / "golden/mlp/scan-off/none/L3.json").stat().st_mode) == 0o600
    assert stat.S_IMODE(summary.stat().st_mode) == 0o644
