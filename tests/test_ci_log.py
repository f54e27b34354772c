"""What a CI log shows: a line per finished cell and a heartbeat on stderr, and tables that never cut a value.

The project is the example NNX target under a model name that makes every cell id 59 to 64 characters long. Each
command's table is printed at 80 and at 100 columns, piped (the CLI as a CI runner sees it) and on a terminal,
and every value of every row, as the same command's JSON gives it, must appear whole on its id's line; printed
commands (`If intended: hlo-audit golden update --only id=...`) are never wrapped.
"""

from __future__ import annotations

import functools
import io
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hlo_audit import audit, progress
from hlo_audit.cli import app
from hlo_audit.report import terminal, terminal_report, terminal_tree
from in_process import in_project
from projects import DROPOUT_WAIVER, config

REPO = Path(__file__).resolve().parent.parent
MODEL = "a-model-whose-cell-ids-are-sixty-characters"
MATRIX = {"models": [MODEL], "quant": ["none", "dropout0", "int8"], "layers": [2, 3]}
CONFIG = config(**MATRIX, golden_dir="golden", waive=[DROPOUT_WAIVER])
# What a cell's line knows when it finishes (never "ok": the gate has not judged it yet).
LOG_LINE = re.compile(r"^hlo-audit: cell (\d+)/(\d+) (\S+) (lowered|cached|unavailable|failed to lower) "
                      r"(\d+\.\d s|\d+ s|\d+m\d\ds)$")
FINISHED = {"ok": ("lowered", "cached"), "unavailable": ("unavailable",), "error": ("failed to lower",)}
WIDTHS = (80, 100)


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("cilog")
    (root / "hlo-audit.toml").write_text(CONFIG)
    result = CliRunner().invoke(app, ["golden", "update", "--config", str(root / "hlo-audit.toml")])
    assert result.exit_code == 0, result.output
    return root


# Its tables drawn for a 100-column terminal unless a test says otherwise.
cli = functools.partial(in_project, columns=100)


def run_json(project: Path) -> dict[str, dict]:
    doc = json.loads(cli(project, "run", "--format", "json").stdout)
    cells = {c["id"]: c for c in doc["cells"]}
    assert len(cells) == 12 and min(map(len, cells)) >= 59
    return cells


def log_lines(stderr: str) -> list[re.Match]:
    lines = [line for line in stderr.splitlines() if re.match(r"hlo-audit: cell \d+/\d+ ", line)]
    matches = [LOG_LINE.match(line) for line in lines]
    assert all(matches), lines
    return matches


# --------------------------------------------------------------------------------------------------------------
# A line per cell, a heartbeat
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [("run",), ("check",), ("scaling",), ("report",), ("golden", "update")])
def test_a_line_per_finished_cell_on_stderr(project, command):
    cells = run_json(project)
    result = cli(project, *command)
    assert result.exit_code == 0, result.output
    lines = log_lines(result.stderr)
    assert [int(m.group(1)) for m in lines] == list(range(1, 13)) and {m.group(2) for m in lines} == {"12"}
    assert all(m.group(4) in FINISHED[cells[m.group(3)]["status"]] for m in lines) and len(lines) == len(cells)
    # Everything comes from the cache now; unavailable cells are never cached (they are asked every run).
    assert {m.group(3) for m in lines if m.group(4) == "cached"} == {
        cid for cid, c in cells.items() if c["status"] == "ok"}
    assert "lowering" not in result.stderr and "\x1b[" not in result.stderr  # no progress bar in a log


def test_lines_are_written_as_cells_finish_in_a_real_pipe(project):
    """A fresh process, stderr a pipe, the cache bypassed: each line names a cell as it finishes lowering."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "hlo_audit", "check", "--no-cache", "--only", "quant=none"],
                          cwd=project, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    lines = log_lines(proc.stderr)
    assert len(lines) == 4 and all(m.group(4) == "lowered" for m in lines)  # lowered, not cached
    assert proc.stderr.splitlines() == [m.group(0) for m in lines]  # nothing else on stderr


SLOW = textwrap.dedent("""
    import time
    from hlo_audit.examples.nnx_mlp import lower as real

    def lower(cell):
        time.sleep(2.5)
        return real(cell)
    """)


def _slow_project(tmp_path: Path) -> Path:
    (tmp_path / "slow_target.py").write_text(SLOW)
    (tmp_path / "hlo-audit.toml").write_text(config(target="slow_target:lower", **MATRIX, scan=["off"],
                                                    golden_dir="golden", waive=[DROPOUT_WAIVER]))
    return tmp_path


HEARTBEAT = re.compile(r"^hlo-audit: running (\S+( s)?): (\d+) of (\d+) cells done; (?:in flight: (.+)|preparing)$")


def _in_flight(text: str) -> list[str]:
    return [part.rsplit(" (", 1)[0] for part in text.split(", ")]


def test_a_heartbeat_names_the_cell_in_flight(tmp_path):
    project = _slow_project(tmp_path)
    sys.path.insert(0, str(project))
    try:
        result = cli(project, "run", "--only", "quant=none", env={"HLO_AUDIT_HEARTBEAT": "1"})
    finally:
        sys.path.remove(str(project))
    assert result.exit_code == 0, result.output
    lines = result.stderr.splitlines()
    beats = [(i, HEARTBEAT.match(line)) for i, line in enumerate(lines) if line.startswith("hlo-audit: running")]
    assert beats and all(m for _, m in beats), lines
    beats = [(i, m) for i, m in beats if m.group(5)]  # not the ones before the first cell started
    for i, beat in beats:
        # The cell named in flight is the one whose line comes next, and it is not done yet.
        following = next(LOG_LINE.match(line) for line in lines[i + 1:] if line.startswith("hlo-audit: cell "))
        assert _in_flight(beat.group(5)) == [following.group(3)]
        assert int(beat.group(3)) == int(following.group(1)) - 1 and beat.group(4) == "2"
    # 2.5 s per cell and a line after 1 s of quiet: every cell gets at least one heartbeat while it lowers.
    assert len({_in_flight(m.group(5))[0] for _, m in beats}) == 2


def test_a_heartbeat_names_every_worker_s_cell(tmp_path):
    """--jobs 2 in a fresh process: both cells are in flight at once."""
    project = _slow_project(tmp_path)
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{project}", "HLO_AUDIT_HEARTBEAT": "1"}
    proc = subprocess.run([sys.executable, "-m", "hlo_audit", "run", "--jobs", "2", "--only", "quant=none"],
                          cwd=project, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    beats = [HEARTBEAT.match(line) for line in proc.stderr.splitlines() if line.startswith("hlo-audit: running")]
    assert beats and all(beats), proc.stderr
    beats = [m for m in beats if m.group(5)]
    both = {f"{MODEL}/scan-off/none/L2", f"{MODEL}/scan-off/none/L3"}
    assert any(set(_in_flight(m.group(5))) == both for m in beats if m.group(3) == "0"), proc.stderr


def test_a_broken_stderr_does_not_stop_the_run():
    class Closed(io.StringIO):
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

    log = progress.CellLog(Closed(), total=1, interval=60)
    with log:
        log.heartbeat()  # says nothing, raises nothing


# --------------------------------------------------------------------------------------------------------------
# Tables at 80 and 100 columns: every value whole on its id's line
# --------------------------------------------------------------------------------------------------------------


def row(text: str, first: str) -> list[str]:
    """The tokens of the one line whose first token is ``first`` (ANSI colors removed)."""
    plain = re.sub(r"\x1b\[[0-9;]*m", "", text)
    found = [line.split() for line in plain.splitlines() if line.split()[:1] == [first]]
    assert len(found) == 1, (first, plain)
    return found[0]


def _run_tokens(c: dict, slope) -> list[str]:
    captured = (c["constants"] or {}).get("captured")
    values = [c["status"]]
    if c["status"] == "ok":
        values += [str(c["entry_params"]), *(f"{k}:{v}" for k, v in c["by_dtype"].items()), str(c["rng_params"]),
                   f"{slope:g}", str(c["rng_streams"]["dead_params"])]
        values += [str(captured["arrays"])] if captured else []
    return [c["id"], *values]


@pytest.mark.parametrize("columns", WIDTHS)
def test_run_and_list_tables_keep_every_value(project, columns):
    cells = run_json(project)
    slopes = {cid: c["slope_per_layer"] for cid, c in cells.items()}
    out = cli(project, "run", columns=columns).stdout
    for cid, c in cells.items():
        assert row(out, cid) == _run_tokens(c, slopes[cid])
    listed = cli(project, "list", columns=columns).stdout
    for cid, c in cells.items():
        assert row(listed, cid) == [cid, MODEL, c["scan"], c["quant"], str(c["layers"]), c["platform"]]


def _scaling_tokens(s: dict) -> list[str]:
    rng = sum(s["by_role"][k]["slope"] for k in ("rng_key", "rng_count") if k in s["by_role"])
    u32 = s["by_dtype"]["u32"]["slope"] if "u32" in s["by_dtype"] else 0
    projected = s["projected"]
    tail = [str(projected["layers"]), str(projected["entry_params"]), str(projected["by_dtype"].get("u32", ""))] \
        if projected else []
    return [s["series"], ",".join(map(str, s["depths"])), f"{s['total']['slope']:g}", f"{s['total']['intercept']:g}",
            f"{u32:g}", f"{rng:g}", *[t for t in tail if t]]


@pytest.mark.parametrize("columns", WIDTHS)
def test_scaling_and_report_tables_keep_every_value(project, columns):
    series = json.loads(cli(project, "scaling", "--format", "json").stdout)["series"]
    assert len(series) == 4
    out = cli(project, "scaling", columns=columns).stdout
    for s in series:
        assert row(out, s["series"]) == _scaling_tokens(s)
    doc = json.loads(cli(project, "report", "--format", "json").stdout)
    out = cli(project, "report", columns=columns).stdout
    for c in doc["cells"]:
        if c["status"] != "ok":
            continue
        tokens = row(out, c["id"])
        delta = "new" if c["golden_delta"] is None else f"{c['golden_delta']:+d}" if c["golden_delta"] else "0"
        assert tokens[:3] == [c["id"], str(c["entry_params"]), delta]
        assert tokens[-1] == str(c["rng_streams"]["dead_params"])
    for p in doc["scan"]:
        tokens = row(out, p["label"])
        assert tokens[:3] == [p["label"], str(p["on"]["entry_params"]), str(p["off"]["entry_params"])]
    for s in doc["scaling"]:
        assert row(out, s["series"]) == _scaling_tokens(s)


@pytest.mark.parametrize("columns", WIDTHS)
def test_check_table_and_its_commands_are_whole(project, columns):
    doc = json.loads(cli(project, "check", "--format", "json").stdout)
    cells = {c["id"]: c for c in doc["cells"]}
    out = cli(project, "check", columns=columns).stdout
    for scan in ("on", "off"):
        for quant in ("none", "dropout0"):
            label = f"{MODEL}/scan-{scan}/{quant}/L2,3"
            ids = [f"{MODEL}/scan-{scan}/{quant}/L{d}" for d in (2, 3)]
            tokens = row(out, label)
            assert tokens[:5] == [label, "L2:", f"{cells[ids[0]]['entry_params']},", "L3:",
                                  str(cells[ids[1]]["entry_params"])]
            assert tokens[-1] == max((doc["verdicts"][i] for i in ids), key=["ok", "waived"].index)
    # A regression: the command that accepts it is printed whole, on a line of its own, at any width.
    golden = project / f"golden/{MODEL}/scan-off/dropout0/L3.json"
    saved = golden.read_text()
    record = json.loads(saved)
    record["by_dtype"]["u32"] -= 2
    record["by_role"]["rng_key"] -= 1
    record["by_role"]["rng_count"] -= 1
    record["by_dtype_role"]["u32:rng_key"] -= 1  # every table adds up to entry_params (a golden's claims are checked)
    record["by_dtype_role"]["u32:rng_count"] -= 1
    record["entry_params"] -= 2
    golden.write_text(json.dumps(record))
    try:
        failed = cli(project, "check", columns=columns)
    finally:
        golden.write_text(saved)
    assert failed.exit_code == 1
    command = (f"hlo-audit golden update --config {project / 'hlo-audit.toml'} "
               f"--only id={MODEL}/scan-off/dropout0/L2,id={MODEL}/scan-off/dropout0/L3")
    # One command for every failing cell (issue 40), on a line of its own or after its words when they fit.
    lines = [line.strip() for line in failed.stdout.splitlines()]
    assert command in lines or f"If every change above is intended, accept all 2 cells at once: {command}" in lines, \
        failed.stdout
    assert failed.stdout.splitlines()[-1].startswith("hlo-audit check FAILED: 12 cells: ")
    # The log said the cell was cached (never "ok"), then, judged, that it is a regression.
    log = failed.stderr.splitlines()
    assert f"hlo-audit: cell {MODEL}/scan-off/dropout0/L3 judged regression" in log, log
    assert [line for line in log if " ok " in line] == []


@pytest.mark.parametrize("columns", WIDTHS)
def test_rng_explain_count_and_golden_update_lines_are_whole(project, columns):
    cid = f"{MODEL}/scan-off/dropout0/L3"
    out = cli(project, "rng", cid, columns=columns)
    assert out.exit_code == 1  # carried streams: dead RNG state
    assert out.stdout.splitlines()[0] == f"{cid}: 3 RNG streams: 0 drawn, 3 carried (dead state), 0 unknown"
    tree = cli(project, "explain", cid, columns=columns).stdout
    assert tree.splitlines()[0].split()[:2] == ["13", cid]
    doc = json.loads(cli(project, "rng", cid, "--format", "json").stdout)
    header = next(line for line in out.stdout.splitlines() if line.split()[-5:] == ["drawn", "carried", "unknown",
                                                                                   "params", "incr"])
    # The column is named by the prefix every pattern shares (`model.decoder.*`), or `stream pattern`.
    prefix = "" if header.startswith("stream pattern") else header.split()[0].removesuffix("*")
    assert doc["patterns"]
    for p in doc["patterns"]:
        assert p["pattern"].startswith(prefix)
        name = p["pattern"][len(prefix):]
        assert row(out.stdout, name) == [name, *(str(p[k]) for k in ("drawn", "carried", "unknown", "dead_params",
                                                                     "dead_increments"))]
    golden_text = project / f"golden/{MODEL}/scan-off/dropout0/L2.hlo.txt"
    counted = cli(project, "count", golden_text, columns=columns, config=False).stdout
    assert counted.splitlines()[0].startswith(f"{golden_text}  module ")
    (module,) = json.loads(cli(project, "count", golden_text, "--format", "json", "--top", "0",
                               config=False).stdout)["modules"]
    full = cli(project, "count", golden_text, "--top", "0", columns=columns, config=False).stdout
    for pattern, n in module["groups"].items():
        assert row(full, pattern) == [pattern, str(n)]
    other = project / f"golden/{MODEL}/scan-off/none/L2.hlo.txt"
    diff = json.loads(cli(project, "diff", other, golden_text, "--format", "json", config=False).stdout)
    shown = cli(project, "diff", other, golden_text, columns=columns, config=False).stdout
    assert shown.splitlines()[1] == f"entry parameters: 5 -> 9  ({other} -> {golden_text})"
    for g in diff["params_added"]:
        assert [f"{g['count']:+d}", g["role"], g["dtype"], g["pattern"]] in [
            line.split() for line in shown.splitlines()]
    updated = cli(project, "golden", "update", columns=columns)
    assert updated.stdout.splitlines()[-1] == (f"golden update ({project / 'golden'}): 0 written, 8 unchanged, "
                                               f"4 skipped, 0 pruned")
    assert f"skipped {MODEL}/scan-on/int8/L3: unavailable: nnx_mlp has no quantization 'int8'" in updated.stdout


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("columns", WIDTHS)
def test_on_a_terminal_tables_keep_every_value_too(project, columns, monkeypatch):
    """The same tables drawn for a terminal of 80 and 100 columns (rich boxes, colors)."""
    monkeypatch.setenv("COLUMNS", str(columns))
    cells = run_json(project)
    plan = audit.plan(str(project / "hlo-audit.toml"))
    results = sorted(audit.execute(plan), key=lambda r: r.cell.id)
    slopes = audit.slopes_by_cell(plan, results)

    def draw(printer, *args):
        stream = FakeTerminal()
        console = terminal.make_console(stream)
        assert console.is_terminal and console.width == columns
        printer(console, *args)
        return stream.getvalue()

    out = draw(terminal.print_run, results, slopes)
    for cid, c in cells.items():
        assert row(out, cid) == _run_tokens(c, c["slope_per_layer"])
    report = audit.check(plan, results, str(project / "hlo-audit.toml"))
    out = draw(terminal.print_check, report, False)
    assert row(out, f"{MODEL}/scan-off/dropout0/L2,3")[-1] == "waived"
    view = audit.report(plan, results)
    out = draw(terminal_report.print_report, view)
    for v in view.lowered:
        assert row(out, v.result.cell.id)[:2] == [v.result.cell.id, str(v.result.entry_params)]
    tree, _ = audit.explain_source(f"{MODEL}/scan-off/dropout0/L3", str(project / "hlo-audit.toml"))
    assert row(draw(terminal_tree.print_explain, tree), "13")[1] == f"{MODEL}/scan-off/dropout0/L3"
