"""No write through a link out (issue 48, item 3): a file hlo-audit creates or replaces (init's config and workflow,
the folders its golden update fills, a report) is never reached through a symbolic link that leads out of the
folder it must stay in: one line naming the path and the link, exit 2, nothing written there or here.

``files.confined`` is the one check; the golden store's own refusal (tests/test_golden_writes.py) goes through it
too. A link that stays inside is still followed (tests/test_outputs.py, tests/test_golden_writes.py), and a stream
(``/dev/stdout``, a FIFO) is no file written.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hlo_audit.files import LinkedOut, check_output, write_output
from in_process import hlo_audit_here

CALLABLE = ("init", "--callable", "hlo_audit.examples.nnx_mlp:lower", "--model", "mlp")


def tree(folder: Path) -> dict[str, str]:
    """Every entry under ``folder``, relative path -> content (a link: where it points, a folder: '/')."""
    return {str(p.relative_to(folder)): ("-> " + str(p.readlink())) if p.is_symlink() else "/" if p.is_dir()
            else p.read_text() for p in sorted(folder.rglob("*"))}


def one_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "Traceback" not in result.stderr, (
        result.returncode, result.stdout, result.stderr)
    return lines[0]


@pytest.fixture
def places(tmp_path) -> tuple[Path, Path]:
    """A project folder and a folder outside it holding someone else's file."""
    project, outside = tmp_path / "project", tmp_path / "outside"
    project.mkdir()
    outside.mkdir()
    (outside / "keep.txt").write_text("someone else's\n")
    return project, outside


@pytest.mark.parametrize("name", [".github", ".hlo-audit-cache"])
def test_init_never_writes_through_a_folder_linked_out_of_the_project(places, name):
    """Before: `.github` linked out got the workflow written there, exit 0; the cache folder linked out got init's
    golden update's cache written there."""
    project, outside = places
    (project / name).symlink_to(outside, target_is_directory=True)
    before = tree(outside), tree(project)
    line = one_line(hlo_audit_here(project, *CALLABLE))
    assert f"through a symbolic link ({project / name})" in line and str(outside) in line, line
    assert "outside the project folder" in line and "nothing written" in line, line
    assert (tree(outside), tree(project)) == before


def test_init_follows_a_link_that_stays_inside(places, monkeypatch):
    """A `.github` linked to a folder of the project is no escape: the workflow is written where it leads."""
    project, _ = places
    (project / "ci").mkdir()
    (project / ".github").symlink_to(project / "ci", target_is_directory=True)
    result = hlo_audit_here(project, *CALLABLE, "--no-golden")
    assert result.returncode == 0, result.stdout + result.stderr
    assert (project / "ci/workflows/hlo-audit.yml").is_file()


@pytest.mark.parametrize("how", ["the file", "a folder above it", "a dangling file"])
def test_a_report_is_never_written_through_a_link_out_of_the_working_directory(places, monkeypatch, how):
    """Before: a report path linked out (a checked-in `hlo-audit.md -> ~/.bashrc`) was replaced where it led."""
    project, outside = places
    monkeypatch.chdir(project)
    if how == "the file":
        (project / "report.md").symlink_to(outside / "keep.txt")
        path, link = Path("report.md"), project / "report.md"
    elif how == "a folder above it":
        (project / "reports").symlink_to(outside, target_is_directory=True)
        path, link = Path("reports/report.md"), project / "reports"
    else:
        (project / "report.md").symlink_to(outside / "made.md")
        path, link = Path("report.md"), project / "report.md"
    before = tree(outside)
    for check in (check_output, write_output):
        with pytest.raises(LinkedOut) as error:
            check(path, *("# report\n",) * (check is write_output), "--markdown")
        assert f"through a symbolic link ({link})" in str(error.value) and "nothing written" in str(error.value)
        assert "\n" not in str(error.value)
    assert tree(outside) == before


def test_merge_refuses_a_report_linked_out_before_reading_a_shard(places):
    project, outside = places
    (project / "hlo-audit.md").symlink_to(outside / "keep.txt")
    line = one_line(hlo_audit_here(project, "merge", "shard-1.json", "--markdown", "hlo-audit.md"))
    assert line.startswith(f"hlo-audit: error: {project / 'hlo-audit.md'}: the --markdown report resolves through "
                           f"a symbolic link ({project / 'hlo-audit.md'}) to {outside / 'keep.txt'}"), line
    assert (outside / "keep.txt").read_text() == "someone else's\n"


def test_a_report_outside_the_working_directory_is_held_to_its_own_folder(places, tmp_path, monkeypatch):
    """A path the user names outside the working directory is written where it says; only its file linked out of
    that folder is refused."""
    project, outside = places
    monkeypatch.chdir(project)
    write_output(outside / "new.md", "new\n", "--markdown")
    assert (outside / "new.md").read_text() == "new\n"
    (outside / "link.md").symlink_to(tmp_path / "elsewhere.md")
    with pytest.raises(LinkedOut):
        write_output(outside / "link.md", "new\n", "--markdown")
    assert not (tmp_path / "elsewhere.md").exists()
