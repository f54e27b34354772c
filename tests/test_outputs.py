"""Report files (--junit, --markdown, report --html, $GITHUB_STEP_SUMMARY) go only where asked, as asked.

A regular file or a new path is written atomically with the mode the umask gives (an existing file keeps its
own); a character device, FIFO, socket, ``-`` or a path naming the process's own stdout is written to as a stream
and keeps its type; a folder is one line and exit 2 before any cell runs; a job summary that cannot be written is
a warning and the gate's verdict stands. ``files.write_output`` is tested on its own first, then through the CLI
on a real check of the example NNX target.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest
from typer.testing import CliRunner

from hlo_audit.cli import app
from hlo_audit.files import OutputError, check_output, write_output
from in_process import in_project
from projects import DROPOUT_WAIVER, config

REPO = Path(__file__).resolve().parent.parent
TEXT = "<?xml version='1.0' encoding='utf-8'?>\n<testsuite name=\"hlo-audit\" tests=\"0\" />\n"


@pytest.fixture
def umask():
    """Set the process umask for one test, and put the old one back."""
    saved = os.umask(0o022)
    os.umask(saved)

    def set_(mask: int) -> None:
        os.umask(mask)

    yield set_
    os.umask(saved)


def mknod(path: Path, kind: int, device: tuple[int, int]) -> Path:
    try:
        os.mknod(path, kind | 0o666, os.makedev(*device))
    except PermissionError:
        pytest.skip("mknod needs CAP_MKNOD (root in a container has it)")
    return path


class Reader(threading.Thread):
    """Reads a FIFO to its end, as a consumer of the report would."""

    def __init__(self, path: Path):
        super().__init__(daemon=True)
        self.path, self.data = path, None

    def run(self):
        with open(self.path, "rb") as fifo:
            self.data = fifo.read()


class SocketReader(threading.Thread):
    def __init__(self, path: Path):
        super().__init__(daemon=True)
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen(1)
        self.data = b""

    def run(self):
        connection, _ = self.server.accept()
        with connection:
            while chunk := connection.recv(65536):
                self.data += chunk
        self.server.close()


# --------------------------------------------------------------------------------------------------------------
# files.write_output on its own
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664), (0o027, 0o640)])
def test_a_new_file_gets_the_umask_mode(tmp_path, umask, mask, mode):
    umask(mask)
    target = tmp_path / "reports" / "hlo-audit.xml"  # its folder is made too
    write_output(target, TEXT, "--junit")
    assert target.read_text() == TEXT and stat.S_IMODE(target.stat().st_mode) == mode
    assert sorted(p.name for p in target.parent.iterdir()) == ["hlo-audit.xml"]  # no temporary file left


def test_an_existing_file_is_replaced_whole_keeping_its_mode(tmp_path, umask):
    umask(0o077)
    target = tmp_path / "summary.md"
    target.write_text("old " * 10_000)
    target.chmod(0o640)
    inode = target.stat().st_ino
    write_output(target, TEXT, "--markdown")
    assert target.read_text() == TEXT and stat.S_IMODE(target.stat().st_mode) == 0o640
    assert target.stat().st_ino != inode  # renamed into place: a reader saw the old file or the new, never half
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.md"]


def test_a_symlink_to_a_file_stays_a_symlink(tmp_path):
    real = tmp_path / "real.xml"
    real.write_text("old")
    link = tmp_path / "link.xml"
    link.symlink_to(real)
    write_output(link, TEXT, "--junit")
    assert link.is_symlink() and real.read_text() == TEXT
    dangling = tmp_path / "dangling.xml"
    dangling.symlink_to(tmp_path / "made.xml")
    write_output(dangling, TEXT, "--junit")
    assert dangling.is_symlink() and (tmp_path / "made.xml").read_text() == TEXT


def test_a_character_device_is_written_to_and_keeps_its_type(tmp_path):
    devnull = mknod(tmp_path / "devnull", stat.S_IFCHR, (1, 3))
    before = devnull.stat()
    write_output(devnull, TEXT, "--junit")
    after = devnull.stat()
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev and after.st_ino == before.st_ino
    assert stat.S_IMODE(after.st_mode) == stat.S_IMODE(before.st_mode)


def test_a_fifo_is_written_as_a_stream(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = Reader(fifo)
    reader.start()
    write_output(fifo, TEXT, "--junit")
    reader.join(30)
    assert reader.data == TEXT.encode() and stat.S_ISFIFO(fifo.stat().st_mode)


def test_a_socket_is_written_as_a_stream(tmp_path):
    path = tmp_path / "sock"
    reader = SocketReader(path)
    reader.start()
    write_output(path, TEXT, "--markdown")
    reader.join(30)
    assert reader.data == TEXT.encode() and stat.S_ISSOCK(path.stat().st_mode)


def test_dash_is_standard_output(capsys):
    write_output("-", TEXT, "--junit")
    assert capsys.readouterr().out == TEXT


WRITE_TO = textwrap.dedent("""
    import sys
    from hlo_audit.files import write_output
    print("before", flush=True)
    write_output(sys.argv[1], "REPORT\\n", "--junit")
    print("after", flush=True)
    """)


@pytest.mark.parametrize("name", ["/dev/stdout", "/proc/self/fd/1", "link"])
@pytest.mark.parametrize("stdout_is", ["file", "pipe"])
def test_a_path_naming_our_own_stdout_is_written_through_it(tmp_path, name, stdout_is):
    """`--junit /dev/stdout > log.txt` appends to the log: the file behind stdout is never replaced or truncated."""
    if name == "link":
        name = str(tmp_path / "out.xml")
        Path(name).symlink_to("/proc/self/fd/1")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-c", WRITE_TO, name]
    if stdout_is == "file":
        log = tmp_path / "log.txt"
        log.write_text("earlier\n")
        with open(log, "a") as handle:
            inode = log.stat().st_ino
            proc = subprocess.run(command, stdout=handle, stderr=subprocess.PIPE, text=True, env=env, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert log.read_text() == "earlier\nbefore\nREPORT\nafter\n" and log.stat().st_ino == inode
    else:
        proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == "before\nREPORT\nafter\n"


def test_a_folder_is_one_line_naming_the_option_and_a_file_name(tmp_path):
    for check in (write_output, check_output):
        with pytest.raises(OutputError) as error:
            check(tmp_path, *(TEXT,) * (check is write_output), "--junit", "hlo-audit.xml")
        assert str(error.value) == f"--junit {tmp_path}: is a folder; give a file name such as {tmp_path / 'hlo-audit.xml'}"
    assert list(tmp_path.iterdir()) == []


def test_a_block_device_and_a_path_below_a_file_are_refused(tmp_path):
    # A block device number left to local use (no driver): a regression that opened it would reach nothing.
    disk = mknod(tmp_path / "disk", stat.S_IFBLK, (242, 17))
    with pytest.raises(OutputError, match="is a block device"):
        check_output(disk, "--html")
    with pytest.raises(OutputError, match="is a block device"):
        write_output(disk, TEXT, "--html")
    assert stat.S_ISBLK(disk.stat().st_mode)
    (tmp_path / "file").write_text("x")
    for check in (check_output, write_output):
        with pytest.raises(OutputError, match="cannot write: Not a directory"):
            check(tmp_path / "file" / "report.html", *(TEXT,) * (check is write_output), "--html")
        with pytest.raises(OutputError, match="cannot write"):
            check(tmp_path / "file" / "deeper" / "report.html", *(TEXT,) * (check is write_output), "--html")
    assert (tmp_path / "file").read_text() == "x"


# --------------------------------------------------------------------------------------------------------------
# Through the CLI, on a real check
# --------------------------------------------------------------------------------------------------------------

CONFIG = config(quant=["none", "dropout0"], layers=[2, 3], golden_dir="golden", waive=[DROPOUT_WAIVER])


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("outputs")
    (root / "hlo-audit.toml").write_text(CONFIG)
    result = CliRunner().invoke(app, ["golden", "update", "--config", str(root / "hlo-audit.toml")])
    assert result.exit_code == 0, result.output
    return root


COMMANDS = {"--junit": ("check", "--junit"), "--markdown": ("check", "--markdown"), "--html": ("report", "--html")}


def _parses(option: str, data: bytes) -> None:
    text = data.decode()
    if option == "--junit":
        assert ET.fromstring(text).get("tests") == "8"
    elif option == "--markdown":
        assert text.startswith("## hlo-audit check: passed\n")
    else:
        assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")


@pytest.mark.parametrize("option", COMMANDS)
def test_cli_a_folder_is_one_line_and_exit_2_before_any_cell_runs(project, tmp_path, option):
    command, flag = COMMANDS[option]
    result = in_project(project, command, flag, tmp_path)
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [f"hlo-audit: error: {option} {tmp_path}: is a folder; give a file name "
                                          f"such as {tmp_path / ('report.html' if option == '--html' else 'hlo-audit.' + ('xml' if option == '--junit' else 'md'))}"]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("option", COMMANDS)
def test_cli_a_character_device_keeps_its_type(project, tmp_path, option):
    command, flag = COMMANDS[option]
    devnull = mknod(tmp_path / "devnull", stat.S_IFCHR, (1, 3))
    result = in_project(project, command, flag, devnull)
    assert result.exit_code == 0, result.output
    assert stat.S_ISCHR(devnull.stat().st_mode) and devnull.stat().st_rdev == os.makedev(1, 3)


@pytest.mark.parametrize("option", COMMANDS)
def test_cli_a_fifo_receives_the_whole_report(project, tmp_path, option):
    command, flag = COMMANDS[option]
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = Reader(fifo)
    reader.start()
    result = in_project(project, command, flag, fifo)
    reader.join(60)
    assert result.exit_code == 0, result.output
    _parses(option, reader.data)
    assert stat.S_ISFIFO(fifo.stat().st_mode)


@pytest.mark.parametrize("option", COMMANDS)
def test_cli_a_new_report_file_has_the_umask_mode(project, tmp_path, umask, option):
    command, flag = COMMANDS[option]
    umask(0o022)
    target = tmp_path / "out" / "report"
    result = in_project(project, command, flag, target)
    assert result.exit_code == 0, result.output
    _parses(option, target.read_bytes())
    assert stat.S_IMODE(target.stat().st_mode) == 0o644


def test_cli_junit_to_dev_stdout_in_a_real_pipe(project):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("GITHUB_STEP_SUMMARY", None)
    proc = subprocess.run([sys.executable, "-m", "hlo_audit", "check", "--junit", "/dev/stdout", "--format", "json"],
                          cwd=project, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    json_part, _, xml_part = proc.stdout.partition("<?xml")
    assert '"schema": "hlo-audit/check/v2"' in json_part
    assert ET.fromstring("<?xml" + xml_part).get("tests") == "8"


def _break_a_golden(project: Path) -> Path:
    golden = project / "golden/mlp/scan-on/none/L3.json"
    saved = golden.read_text()
    golden.unlink()
    return golden, saved


@pytest.mark.parametrize("where", ["folder", "below a file", "fine"])
@pytest.mark.parametrize("verdict", ["passed", "failed"])
def test_cli_job_summary_problems_are_a_warning_and_the_verdict_stands(project, tmp_path, where, verdict):
    summary = {"folder": tmp_path, "below a file": tmp_path / "file" / "summary.md",
               "fine": tmp_path / "summary.md"}[where]
    (tmp_path / "file").write_text("x")
    golden = saved = None
    if verdict == "failed":
        golden, saved = _break_a_golden(project)  # missing_golden: a regression, exit 1
    try:
        result = in_project(project, "check", "--markdown", tmp_path / "out.md", env={"GITHUB_STEP_SUMMARY": str(summary)})
    finally:
        if golden is not None:
            golden.write_text(saved)
    assert result.exit_code == (0 if verdict == "passed" else 1), result.output
    last = result.stdout.splitlines()[-1]
    assert last.startswith(f"hlo-audit check {'passed' if verdict == 'passed' else 'FAILED'}: 8 cells")
    assert (tmp_path / "out.md").read_text().startswith(f"## hlo-audit check: {'passed' if verdict == 'passed' else '**failed**'}")
    warnings = [line for line in result.stderr.splitlines() if not line.startswith("hlo-audit: cell ")]
    if where == "fine":
        assert warnings == [] and summary.read_text() == (tmp_path / "out.md").read_text()
    else:
        reason = "is a folder" if where == "folder" else "Not a directory"
        assert warnings == [f"hlo-audit: warning: GITHUB_STEP_SUMMARY={summary}: {reason}; the job summary was not "
                            f"written"]
        assert (tmp_path / "file").read_text() == "x"


def test_cli_job_summary_appends(project, tmp_path):
    summary = tmp_path / "step-summary.md"
    summary.write_text("earlier step\n")
    result = in_project(project, "check", env={"GITHUB_STEP_SUMMARY": str(summary)})
    assert result.exit_code == 0
    text = summary.read_text()
    assert text.startswith("earlier step\n## hlo-audit check: passed\n")


# --------------------------------------------------------------------------------------------------------------
# A write cut short leaves the old file (issue 27: `ulimit -f` left a 1,024-byte prefix of the report)
# --------------------------------------------------------------------------------------------------------------

LIMIT = 1024
CUT_SHORT = textwrap.dedent("""
    import json, os, resource, stat, sys, threading
    from pathlib import Path
    from hlo_audit.files import OutputError, rewrite_in_place, write_output
    folder = Path(sys.argv[1])
    limit = int(sys.argv[2])
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    text = "<report>" + "x" * (4 * limit) + "</report>\\n"
    said = {}
    for name in ("existing.xml", "absent.xml"):
        try:
            write_output(folder / name, text, "--junit")
        except OutputError as exc:
            said[name] = str(exc)
    try:
        rewrite_in_place(folder / "in-place.md", text.encode())
    except OSError as exc:
        said["in-place.md"] = exc.strerror
    write_output("/dev/null", text, "--junit")  # a device: no file size to limit, and it stays a device
    fifo = folder / "reader.fifo"
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo, "rb").read()))
    reader.start()
    write_output(fifo, text, "--junit")
    reader.join()
    said["fifo bytes"] = len(got[0])
    print(json.dumps(said))
""")


def test_a_report_cut_short_by_the_file_size_limit_leaves_the_old_file(tmp_path):
    """Under RLIMIT_FSIZE (`ulimit -f`) every report write is all or nothing: a regular file replaced beside and
    renamed over keeps its old content, a new one is not created, a file rewritten in place (a folder hlo-audit may
    not create files in) keeps its old content, and no temporary file is left; a device and a FIFO are written as
    streams and keep their type."""
    old = {"existing.xml": "<old/>\n", "in-place.md": "## old summary\n"}
    for name, text in old.items():
        (tmp_path / name).write_text(text)
    os.mkfifo(tmp_path / "reader.fifo")
    proc = subprocess.run([sys.executable, "-c", CUT_SHORT, str(tmp_path), str(LIMIT)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)
    assert proc.returncode == 0, proc.stderr
    said = json.loads(proc.stdout)
    assert said == {"existing.xml": f"--junit {tmp_path / 'existing.xml'}: cannot write: File too large",
                    "absent.xml": f"--junit {tmp_path / 'absent.xml'}: cannot write: File too large",
                    "in-place.md": "File too large", "fifo bytes": 4 * LIMIT + 18}
    assert {p.name: p.read_text() for p in tmp_path.iterdir() if p.is_file()} == old
    assert stat.S_ISFIFO((tmp_path / "reader.fifo").stat().st_mode) and stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_cli_a_report_cut_short_is_one_line_and_the_old_report_stays(project, tmp_path):
    junit = tmp_path / "hlo-audit.xml"
    junit.write_text("<old/>\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("GITHUB_STEP_SUMMARY", None)
    # As a user's shell does it (bash counts -f in 1024-byte blocks).
    proc = subprocess.run(["bash", "-c", f'ulimit -f {LIMIT // 1024} && exec "$0" -m hlo_audit check --junit "$1"',
                           sys.executable, str(junit)], cwd=project, capture_output=True, text=True, env=env,
                          timeout=300)
    lines = [line for line in proc.stderr.splitlines() if not line.startswith("hlo-audit: cell ")]
    assert proc.returncode == 2 and lines == [f"hlo-audit: error: --junit {junit}: cannot write: File too large"], (
        proc.returncode, proc.stderr[-2000:])
    assert [p.name for p in tmp_path.iterdir()] == ["hlo-audit.xml"] and junit.read_text() == "<old/>\n"
