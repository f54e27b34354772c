"""`hlo-audit report` and `hlo_audit.params_frame` on real lowerings of the example NNX MLP.

Goldens come from the example target; the report then runs a target that brings back the seed-000 leak for
``none`` (an ``nnx.Dropout(0.0)`` per layer: 2 u32 per unrolled layer) and fixes it for ``dropout0`` (no
dropout at all), with the same cell ids. So every delta below is a real change between two real lowerings,
and its expected size is known from the model: per unrolled layer one key (u32[2]) and one count (u32[]).
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from xml.etree import ElementTree as ET

import pandas as pd
import pytest
from typer.testing import CliRunner

import hlo_audit
from hlo_audit import audit
from hlo_audit.cli import app
from hlo_audit.report import terminal, terminal_report
from in_process import cli, in_project

# One xdist group: the module's projects are made once, not once per worker.
pytestmark = pytest.mark.xdist_group("report")
TARGET = "hlo_audit.examples.nnx_mlp:lower"
LONG_MODEL = "mlp-with-a-model-name-long-enough-to-wrap-every-table"
ANSI = "\x1b["
RED, GREEN = "\x1b[31m", "\x1b[32m"

LEAKY_TARGET = textwrap.dedent(f"""
    from dataclasses import replace
    from {TARGET.split(':')[0]} import lower as real

    SWAP = {{"none": "dropout0", "dropout0": "none"}}

    def lower(cell):
        return real(replace(cell, quant=SWAP.get(cell.quant, cell.quant)))

    lower.full_depth = lambda model: 8
    """)


def _config(target: str) -> str:
    return textwrap.dedent(f"""
        target = "{target}"
        models = ["{LONG_MODEL}"]
        quant = ["none", "dropout0", "dropout"]
        layers = [2, 4]
        golden_dir = "golden"
        """)


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """Goldens from the example target (config `golden.toml`), then the leaky target (`hlo-audit.toml`)."""
    root = tmp_path_factory.mktemp("report")
    (root / "leaky.py").write_text(LEAKY_TARGET)
    (root / "golden.toml").write_text(_config(TARGET))
    (root / "hlo-audit.toml").write_text(_config("leaky:lower"))
    sys.path.insert(0, str(root))
    result = CliRunner().invoke(app, ["golden", "update", "--config", str(root / "golden.toml")])
    assert result.exit_code == 0, result.output
    return root


def cell(quant: str, scan: str = "off", layers: int = 4) -> str:
    return f"{LONG_MODEL}/scan-{scan}/{quant}/L{layers}"


def built(project, only: str | None = None, layers: str | None = None):
    p = audit.plan(str(project / "hlo-audit.toml"), only, None, layers)
    return audit.report(p, list(audit.execute(p)))


def test_json_deltas_against_the_golden(project):
    result = in_project(project, "report", "--format", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["schema"] == "hlo-audit/report/v1"
    cells = {c["id"]: c for c in doc["cells"]}
    assert len(cells) == 12
    leak = cells[cell("none")]
    # The leak: one Dropout(0.0) per layer, each a key and a count; 4 layers.
    assert (leak["entry_params"], leak["golden_delta"]) == (17, 8)
    assert leak["by_dtype_delta"] == {"f32": 0, "u32": 8}
    assert leak["by_role_delta"] == {"input": 0, "rng_count": 4, "rng_key": 4, "weight": 0}
    fixed = cells[cell("dropout0", layers=2)]
    assert fixed["golden_delta"] == -4 and fixed["by_dtype_delta"]["u32"] == -4
    assert cells[cell("dropout")]["golden_delta"] == 0
    # Scanned: one stacked stream whatever the depth, so the swap moves 2 u32, not 2 per layer.
    assert cells[cell("none", scan="on")]["by_dtype_delta"]["u32"] == 2
    pairs = {(p["quant"], p["layers"]): p for p in doc["scan"]}
    assert pairs[("none", 4)]["on"]["entry_params"] == 5 and pairs[("none", 4)]["off"]["entry_params"] == 17
    assert pairs[("none", 4)]["off"]["u32"] == 8
    series = {s["series"]: s for s in doc["scaling"]}
    unrolled = series[f"{LONG_MODEL}/scan-off/none/L*"]
    assert unrolled["total"]["slope"] == 4 and unrolled["projected"]["entry_params"] == 33  # 8 layers x 4 + x
    assert series[f"{LONG_MODEL}/scan-on/none/L*"]["total"]["slope"] == 0


def test_tidy_frame_rows_sum_to_the_cells(project):
    frame = hlo_audit.params_frame(config=str(project / "hlo-audit.toml"))
    assert list(frame.columns) == ["id", "model", "scan", "quant", "quant_mode", "layers", "step", "platform",
                                   "topology", "gpu", "cuda_arch", "stage", "dtype", "role", "count", "bytes",
                                   "golden_count", "golden_delta"]
    report = built(project)
    totals = frame.groupby("id")["count"].sum().to_dict()
    assert totals == {v.result.cell.id: v.result.entry_params for v in report.cells}
    assert frame.groupby("id")["golden_delta"].sum().to_dict() == {v.result.cell.id: v.total_delta
                                                                   for v in report.cells}
    row = frame[(frame.id == cell("none")) & (frame.role == "rng_key")].iloc[0]
    assert (row["dtype"], row["count"], row.golden_count, row.golden_delta, row["bytes"]) == ("u32", 4, 0, 4, 4 * 8)
    # A pair only the golden has is a row with count 0: dropout0 lost its RNG state when fixed.
    gone = frame[(frame.id == cell("dropout0")) & (frame.role == "rng_count")].iloc[0]
    assert (gone["count"], gone.golden_count, gone.golden_delta) == (0, 4, -4)


def test_cells_without_a_golden_have_no_delta(project):
    frame = hlo_audit.params_frame(config=str(project / "hlo-audit.toml"), only="scan=off,quant=dropout",
                                   layers="3")
    assert set(frame.id) == {cell("dropout", layers=3)}
    assert frame.golden_delta.isna().all() and frame.golden_count.isna().all()
    assert frame["count"].sum() == 13
    doc = json.loads(in_project(project, "report", "--format", "json", "--only", "scan=off,quant=dropout", "--layers", "3").stdout)
    (c,) = doc["cells"]
    assert (c["golden"], c["golden_delta"], c["by_dtype_delta"]) == (False, None, None)


def test_csv_and_markdown_carry_the_same_rows(project):
    csv = in_project(project, "report", "--format", "csv")
    assert csv.exit_code == 0
    frame = pd.read_csv(io.StringIO(csv.stdout))
    expected = hlo_audit.params_frame(config=str(project / "hlo-audit.toml"))
    assert len(frame) == len(expected)
    assert frame["count"].tolist() == expected["count"].tolist()
    assert frame["golden_delta"].tolist() == expected["golden_delta"].astype(float).tolist()
    md = in_project(project, "report", "--format", "markdown").stdout
    assert f"| `{cell('none')}` | 17 | +8 | f32 9, u32 8 |" in md
    assert re.search(rf"\| `{re.escape(cell('none'))}` \| 17 \|.*\| 8 \|$", md, re.M)  # 8 never-drawn RNG params
    assert f"| `{LONG_MODEL}/none/L4` | 5 | 2 | 17 | 8 |" in md
    assert f"<details><summary>{len(expected)} rows: cell x dtype x role</summary>" in md
    assert f"| {cell('none')} | u32 | rng_key | 4 | 32 | 4 |" in md


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _render(project, monkeypatch, no_color: bool) -> str:
    monkeypatch.setenv("COLUMNS", "240")
    if no_color:
        monkeypatch.setenv("NO_COLOR", "1")
    else:
        monkeypatch.delenv("NO_COLOR", raising=False)
    out = FakeTerminal()
    terminal_report.print_report(terminal.make_console(out, max_width=100), built(project))
    return out.getvalue()


def test_terminal_colors_growth_red_shrinkage_green_and_keeps_every_id_whole(project, monkeypatch):
    text = _render(project, monkeypatch, no_color=False)
    assert f"{RED} +8" in text  # none/L4: 17 entry params, u32 8 more than its golden
    assert f"{GREEN} -4" in text  # dropout0/L2: the leak fixed
    plain = re.sub(r"\x1b\[[0-9;]*m", "", text)
    assert "scan on / scan off" in plain and "depth scaling" in plain
    # 75-character ids do not fit 100 columns beside the counts: the table is printed wider, never cut.
    lines = plain.splitlines()
    views = [v for v in built(project).cells if v.result.status == "ok"]
    assert len(views) == 12
    for v in views:
        row = next(line for line in lines if line.lstrip().startswith(v.result.cell.id + " "))
        delta = f"{v.total_delta:+d}" if v.total_delta else "0"
        assert row.split()[:3] == [v.result.cell.id, str(v.result.entry_params), delta], row


def test_no_color_is_honored_on_a_terminal(project, monkeypatch):
    text = _render(project, monkeypatch, no_color=True)
    assert RED not in text and GREEN not in text
    assert not re.search(r"\x1b\[(3\d|38;)", text)


def test_piped_output_is_plain_without_progress(project):
    env = {**os.environ, "PYTHONPATH": str(project)}
    env.pop("FORCE_COLOR", None)
    proc = subprocess.run([sys.executable, "-m", "hlo_audit", "report", "--no-cache", "--only", "quant=dropout"],
                          cwd=project, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert ANSI not in proc.stdout and ANSI not in proc.stderr
    assert "lowering" not in proc.stderr and "━" not in proc.stderr  # no progress bar
    # Piped, a table wider than 100 columns is printed wider rather than cut: every id whole, on one line.
    assert any(cell("dropout") in line for line in proc.stdout.splitlines())


def test_bad_input_is_one_line(project, tmp_path):
    result = in_project(project, "report", "--only", "colour=red")
    assert result.exit_code == 2
    assert result.stderr.strip().count("\n") == 0 and "colour" in result.stderr
    result = in_project(project, "report", "--html", str(tmp_path), "--only", "quant=dropout")
    assert result.exit_code == 2 and "is a folder" in result.stderr and "Traceback" not in result.output


# --------------------------------------------------------------------------------------------------------------
# The HTML report in a real browser
# --------------------------------------------------------------------------------------------------------------

CHROMIUM = "/usr/bin/chromium"  # Debian's package; `make test` installs it (make browser)
ARTIFACTS = Path(os.environ.get("HLO_AUDIT_ARTIFACTS", Path(__file__).parent / "artifacts"))


def chromium(*args: str, profile: Path) -> subprocess.CompletedProcess:
    assert Path(CHROMIUM).is_file(), f"{CHROMIUM} is missing: run `make browser` (make test does)"
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                           "--no-first-run", "--disable-background-networking", "--disable-component-update",
                           "--disable-sync", f"--user-data-dir={profile}", *args],
                          capture_output=True, text=True, timeout=180)


def test_html_report_renders_every_cell_in_chromium(project, tmp_path):
    pytest.importorskip("PIL", reason="Pillow (the dev extra) is not installed: the screenshot cannot be read")
    page = ARTIFACTS / "report.html"
    result = in_project(project, "report", "--html", page)
    assert result.exit_code == 0, result.output
    html = page.read_text()
    assert "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "") and "https://" not in html
    ok = [v.result.cell.id for v in built(project).cells if v.result.status == "ok"]
    assert len(ok) == 12
    dom = chromium("--dump-dom", page.resolve().as_uri(), profile=tmp_path / "profile").stdout
    # Written by the page's own script after layout: bars and lines the browser drew with a non-empty box.
    assert re.search(r'<body[^>]* data-drawn-bars="12"', dom), dom[:500]
    assert re.search(r'<body[^>]* data-drawn-series="6"', dom)
    bars = re.findall(r'<g class="bar" data-cell="([^"]+)"', dom)
    rows = re.findall(r'<tr data-cell="([^"]+)"', dom)
    assert bars == ok and rows == ok
    assert len(re.findall(r'<g class="series[^"]*" data-series="', dom)) == 6
    # Every text whole (issue 26: ids were cut at the left edge): the page measured each against its SVG's box.
    assert re.search(r'<body[^>]* data-clipped-texts="0"', dom) and 'data-clipped="true"' not in dom
    longest = max(ok, key=len)
    assert len(longest) > 70 and re.search(rf'<text [^>]*text-anchor="end">{re.escape(longest)}</text>', dom)
    # The scaling chart: a panel per model, every series named at its line's end, no two names on each other;
    # the series whose RNG state grows per layer (unrolled: the leak, and the dropout that draws) are the ones drawn
    # in colour, saying by how much.
    assert re.findall(r'<svg class="panel" data-model="([^"]+)"', dom) == [LONG_MODEL]
    labels = dict(re.findall(r'<g class="series[^"]*" data-series="[^/]+/([^"]+)/L\*".*?<text class="series-label"'
                             r'[^>]*>([^<]+)</text>', dom, re.S))
    assert len(labels) == 6 and all(label.startswith(series) for series, label in labels.items()), labels
    assert labels["scan-off/none"] == "scan-off/none  RNG +2/layer"
    assert re.findall(r'<g class="series leak" data-series="[^/]+/([^"]+)/L\*"', dom) == ["scan-off/dropout",
                                                                                         "scan-off/none"]
    assert re.search(r'<body[^>]* data-overlapping-labels="0"', dom)
    leak = re.search(rf'<tr data-cell="{re.escape(cell("none"))}".*?</tr>', dom).group(0)
    assert '<span class="grow">+8</span>' in leak  # the Δ golden column
    # The leaked Dropout(0.0) streams are never drawn: all 8 new u32 are dead RNG state (last column).
    assert leak.endswith("<td>8</td></tr>") and "<th>never-drawn RNG</th>" in dom
    shot = ARTIFACTS / "report.png"
    shot.unlink(missing_ok=True)
    chromium(f"--screenshot={shot}", "--window-size=1200,1800", page.resolve().as_uri(),
             profile=tmp_path / "profile")
    from PIL import Image

    with Image.open(shot) as image:
        colors = {rgb for _, rgb in image.convert("RGB").getcolors(maxcolors=1 << 20)}
    # The role colors of the stacked bars are on screen: the chart was painted, not just parsed.
    assert {(0xd6, 0x27, 0x28), (0xff, 0x7f, 0x0e), (0x1f, 0x77, 0xb4)} <= colors


# --------------------------------------------------------------------------------------------------------------
# One summary: every format of `check` prints the same numbers (issue 18, item 5)
# --------------------------------------------------------------------------------------------------------------

SUMMARY_CONFIG = textwrap.dedent(f"""
    target = "{TARGET}"
    models = ["mlp"]
    quant = ["none", "dropout0"]
    layers = [2, 3]
    golden_dir = "golden"

    [[waive]]
    rule = "rng_scaling"
    quant = "dropout0"
    reason = "the example keeps a never-drawn dropout stream on purpose"
    """)


@pytest.fixture(scope="module")
def regressed(tmp_path_factory):
    """Goldens of the example target, then three kinds of damage: one cell with two regressions (its count and its
    text), one without a golden, and a golden whose cell left the matrix."""
    root = tmp_path_factory.mktemp("summary")
    (root / "hlo-audit.toml").write_text(SUMMARY_CONFIG)
    config = str(root / "hlo-audit.toml")
    assert CliRunner().invoke(app, ["golden", "update", "--config", config]).exit_code == 0
    golden = root / "golden/mlp/scan-off/none"
    record = json.loads((golden / "L2.json").read_text())
    record["entry_params"] -= 1
    record["by_dtype"]["f32"] -= 1
    record["by_role"]["weight"] -= 1
    record["by_dtype_role"]["f32:weight"] -= 1  # every table adds up to entry_params (a golden's claims are checked)
    (golden / "L2.json").write_text(json.dumps(record))
    text = golden / "L2.hlo.txt"
    text.write_text(text.read_text().replace("multiply(", "add(", 1))
    (root / "golden/mlp/scan-on/none/L3.json").unlink()
    stale = root / "golden/mlp/scan-on/fp8/L2.json"
    stale.parent.mkdir(parents=True)
    # A golden hlo-audit wrote for a cell the matrix no longer has (its summary names the cell its path spells).
    stale_record = json.loads((root / "golden/mlp/scan-on/none/L2.json").read_text())
    stale.write_text(json.dumps({**stale_record, "cell": "mlp/scan-on/fp8/L2", "hlo": None}, indent=1, sort_keys=True))
    return root, config


def test_every_format_of_check_prints_the_same_numbers(regressed, tmp_path):
    root, config = regressed
    cells = json.loads(CliRunner().invoke(app, ["list", "--config", config, "--format", "json"]).stdout)["cells"]
    assert len(cells) == 8
    doc = json.loads(cli("check", "--config", config, "--format", "json").stdout)
    totals = doc["totals"]
    # Counted from the damage done, not from what the tool printed: 8 cells, each with one verdict.
    assert totals["cells"] == 8 and set(doc["verdicts"]) == {c["id"] for c in cells}
    assert totals["cells_by_verdict"] == {"ok": 5, "waived": 1, "regression": 2}
    assert {k for k, v in doc["verdicts"].items() if v == "regression"} == {"mlp/scan-off/none/L2",
                                                                            "mlp/scan-on/none/L3"}
    # Findings are listed apart: mlp/scan-off/none/L2 has four (count, host_cost: the leaf its golden's entry lost is
    # one more its call flattens, ops: its multiply made an add, and hlo_text), the missing golden one.
    assert totals["findings_by_severity"] == {"advisory": 4, "waived": 1, "stale": 1, "regression": 5}
    assert totals["folded_advisories"] == 4 and totals["stale_goldens"] == 1
    assert doc["stale_goldens"] == ["mlp/scan-on/fp8/L2"]
    # v1's summary keeps its meaning: every finding by severity, with the "matches its golden" placeholders of the
    # two cells that have no finding at all (the dropout0 cells carry a folded dead-RNG advisory instead).
    assert doc["summary"] == {"advisory": 4, "ok": 2, "regression": 5, "stale": 1, "waived": 1}
    line = ("8 cells: 5 ok, 1 waived, 2 regression; findings: 4 advisory (4 folded), 1 waived, 1 stale, "
            "5 regression; 1 stale golden")
    for verbose in ((), ("--verbose",)):
        table = cli("check", "--config", config, *verbose, "--junit", tmp_path / "junit.xml", "--markdown", tmp_path / "summary.md")
        assert table.exit_code == 1
        assert table.stdout.splitlines()[-1] == f"hlo-audit check FAILED: {line}"
    markdown = (tmp_path / "summary.md").read_text().splitlines()
    assert markdown[:3] == ["## hlo-audit check: **failed**", "", line]
    suite = ET.parse(tmp_path / "junit.xml").getroot()
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("8", "2", "0")
    properties = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert properties["cells.ok"] == "5" and properties["cells.waived"] == "1" and properties["stale_goldens"] == "1"
    assert suite.find("system-out").text.splitlines()[0] == f"hlo-audit check FAILED: {line}"
    # Shards merged: the same numbers again.
    for k in (1, 2):
        (tmp_path / f"shard{k}.json").write_text(cli("check", "--config", config, "--shard", f"{k}/2", "--format", "json").stdout)
    merged = CliRunner().invoke(app, ["merge", str(tmp_path / "shard1.json"), str(tmp_path / "shard2.json")])
    assert merged.exit_code == 1 and merged.stdout.splitlines()[-1] == f"hlo-audit check FAILED: {line}"
