"""Hostile text in every sink: the terminal, Markdown (the PR summary), JUnit XML, HTML and CSV.

The same hostile strings go through each sink's escaping function (``hlo_audit.report.escape``) and through the
real formatters, fed by a real check of the example NNX target whose waiver reason and whose target's error
message carry them (a config and a model are input, as a pull request would change them), and by a real
report with its cell ids replaced (what a shard JSON given to ``merge`` may hold). Each sink is read back with
its own parser: JUnit with ``xml.etree``, Markdown with markdown-it-py (CommonMark plus GFM tables, what
GitHub renders), HTML with ``html.parser``, CSV with ``csv`` (what a spreadsheet would read as a formula is
searched for); the terminal output is searched for raw control bytes.
"""

from __future__ import annotations

import csv
import dataclasses
import html.parser
import io
import json
import re
import sys
import textwrap
from xml.etree import ElementTree as ET

import pytest
from markdown_it import MarkdownIt
from typer.testing import CliRunner

from hlo_audit import audit
from hlo_audit.cli import app
from hlo_audit.judging.outcome import Outcome
from hlo_audit.report import escape, jsonfmt, junit, markdown, terminal
from hlo_audit.report import html as html_format
from hlo_audit.report.escape import visible
from hlo_audit.report.words import message

HOSTILE = {
    "newline": "first line\n## Everything passed",
    "pipe": "a | b | c",
    "backtick": "run `rm -rf` now``",
    "comment": "<!-- the rest of the summary is hidden",
    "img": '<img src=x onerror="alert(1)">',
    "esc": "\x1b[2J\x1b[31mred",
    "osc": "\x1b]0;pwned\x07\x1b]8;;http://evil/\x1b\\link\x1b]8;;\x1b\\",
    "bel": "ding\x07",
    "nul": "nul\x00byte",
    "cr": "progress 10%\rdone 100%",
    "csi_c1": "c1 \x9b31m csi",
    "bidi": "admin\u202e\u2066txt.exe",
    "heading": "# not a heading",
    "list": "- not a list",
    "details": "</details><details open>",
    "surrogate": "bad \udcff name",
    "entity": "&lt;b&gt; &amp;",
    "emphasis": "*bold* _it_ [link](javascript:alert(1)) $x^2$",
    "formula": '=HYPERLINK("http://evil/","open me")',
    "formula_at": "@SUM(1+1)*cmd|' /C calc'!A0",
}
IDS = list(HOSTILE)
# Bytes no terminal output may hold: C0 controls but newline, DEL, C1 (as UTF-8: U+0080..U+009F).
RAW_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
MD = MarkdownIt("commonmark").enable("table")


# --------------------------------------------------------------------------------------------------------------
# Each sink's function on its own
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", IDS)
def test_visible_leaves_no_control_character_and_is_reversible_by_eye(name):
    s = HOSTILE[name]
    shown = visible(s)
    assert not RAW_CONTROL.search(shown) and "\n" not in shown and "\r" not in shown
    assert not re.search("[\ud800-\udfff]", shown)
    # Printable text is kept as it is; only what was invisible became an escape.
    printable = "".join(c for c in s if not RAW_CONTROL.match(c) and c not in "\n\r" and not "\ud800" <= c <= "\udfff")
    assert re.sub(r"\\(x[0-9a-f]{2}|u[0-9a-f]{4}|n|r|t)", "", shown) == re.sub(r"\\(x[0-9a-f]{2}|u[0-9a-f]{4}|n|r|t)", "", printable)


def _inline_tokens(markdown_text: str):
    return [child for token in MD.parse(markdown_text) for child in (token.children or [])]


@pytest.mark.parametrize("name", IDS)
def test_markdown_text_renders_as_the_text_itself(name):
    s = HOSTILE[name]
    # Mid-line (after a word) and at the start of a line (line_start: block markers escaped too).
    for lead, line_start in (("see ", False), ("", True)):
        source = lead + escape.markdown_text(s, line_start=line_start)
        tokens = MD.parse(source)
        # One paragraph of plain text: no heading, list, quote, HTML, code, link, emphasis, nothing.
        assert [t.type for t in tokens] == ["paragraph_open", "inline", "paragraph_close"], (source, tokens)
        children = tokens[1].children
        assert {c.type for c in children} <= {"text"}, children
        assert "".join(c.content for c in children) == lead + visible(s)


@pytest.mark.parametrize("name", IDS)
def test_markdown_code_span_shows_the_text_verbatim_in_and_out_of_tables(name):
    s = HOSTILE[name]
    (code,) = [c for c in _inline_tokens(f"see {escape.markdown_code(s, in_table=False)} here") if c.type != "text"]
    assert code.type == "code_inline" and code.content == visible(s)
    table = f"| cell | n |\n|---|---|\n| {escape.markdown_code(s)} | 1 |\n"
    tokens = MD.parse(table)
    cells = [t for t in tokens if t.type == "inline"]
    assert len(cells) == 4  # header 2 + one row of 2: the pipe did not add a column, the newline no row
    assert [c.type for c in cells[2].children] == ["code_inline"] and cells[2].children[0].content == visible(s)
    assert cells[3].content == "1"


@pytest.mark.parametrize("name", IDS)
def test_markdown_table_cell_of_plain_text_stays_one_cell(name):
    s = HOSTILE[name]
    table = "\n".join(markdown.table(["finding", "n"], [(s, 1)])) + "\n"
    cells = [t for t in MD.parse(table) if t.type == "inline"]
    assert len(cells) == 4
    assert {c.type for c in cells[2].children} <= {"text"} and "".join(c.content for c in cells[2].children) == visible(s)


def test_markdown_fence_is_longer_than_any_backtick_run():
    lines = ["+ ```", "- ````diff", "</details>"]
    fence = escape.markdown_fence(lines)
    tokens = MD.parse("\n".join([f"{fence}diff", *lines, fence]) + "\n")
    assert [t.type for t in tokens] == ["fence"] and tokens[0].content.splitlines() == lines


@pytest.mark.parametrize("name", IDS)
def test_junit_text_and_attributes_parse_back(name):
    s = HOSTILE[name]
    case = ET.Element("testcase", name=escape.junit(s), classname=escape.junit(s))
    ET.SubElement(case, "failure", message=escape.junit(s)).text = escape.junit(s)
    parsed = ET.fromstring(ET.tostring(case, encoding="unicode"))
    assert parsed.get("name") == visible(s) and parsed.find("failure").get("message") == visible(s)
    assert parsed.find("failure").text == visible(s)


@pytest.mark.parametrize("name", IDS)
def test_csv_field_is_never_a_formula(name):
    s = HOSTILE[name]
    out = io.StringIO()
    csv.writer(out).writerow([escape.csv_field(s), 1])
    [[field, number]] = list(csv.reader(io.StringIO(out.getvalue())))
    assert number == "1" and not field.startswith(("=", "+", "-", "@")) and not RAW_CONTROL.search(field)
    assert field.removeprefix("'") == visible(s)


class _Collect(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags, self.data, self.attrs = [], [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs += [v for _, v in attrs]

    def handle_data(self, data):
        self.data.append(data)

    def handle_comment(self, data):
        self.tags.append("<!--")


@pytest.mark.parametrize("name", IDS)
def test_html_text_and_attributes_are_text(name):
    s = HOSTILE[name]
    parser = _Collect()
    parser.feed(f'<td data-cell="{escape.html(s)}">{escape.html(s)}</td>')
    parser.close()
    assert parser.tags == ["td"] and parser.attrs == [visible(s)] and "".join(parser.data) == visible(s)


@pytest.mark.parametrize("name", IDS)
def test_terminal_text_is_never_markup_nor_control(name):
    s = HOSTILE[name] + " [bold]x[/bold] [tool.hlo-audit]"
    console = terminal.make_console(_Terminal(), max_width=100)
    with console.capture() as captured:
        terminal.status(console, escape.terminal(s, style="red"))
    out = re.sub(r"\x1b\[[0-9;]*m", "", captured.get())  # the console's own colors
    assert not RAW_CONTROL.search(out)
    assert out.rstrip("\n") == visible(s)  # "[bold]" and "[tool.hlo-audit]" printed, not read as markup


class _Terminal:
    """A stream that says it is a terminal (colors on), for the console under test."""

    def __init__(self):
        self.parts = []

    def write(self, text):
        self.parts.append(text)

    def flush(self):
        pass

    def isatty(self):
        return True


# --------------------------------------------------------------------------------------------------------------
# The formatters, on a real check whose waiver reason and target error carry the hostile text
# --------------------------------------------------------------------------------------------------------------

REASON = "".join(HOSTILE.values())
TARGET = textwrap.dedent("""
    from hlo_audit.examples.nnx_mlp import lower as real

    HOSTILE = {hostile!r}

    def lower(cell):
        if cell.quant == "dropout":
            raise RuntimeError(HOSTILE)
        return real(cell)
    """)


def _toml_string(s: str) -> str:
    """A TOML basic string holding ``s`` exactly (every non-printable character as a \\u escape)."""
    return '"' + "".join(c if c.isprintable() and c not in '"\\' else f"\\u{ord(c):04x}"
                         for c in s if not "\ud800" <= c <= "\udfff") + '"'


@pytest.fixture(scope="module")
def hostile_project(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    (root / "hostile_target.py").write_text(TARGET.format(hostile=REASON))
    (root / "hlo-audit.toml").write_text(textwrap.dedent(f"""
        target = "hostile_target:lower"
        models = ["mlp"]
        quant = ["none", "dropout0", "dropout"]
        layers = [2, 3]
        golden_dir = "golden"

        [[waive]]
        rule = "rng_scaling"
        quant = "dropout0"
        reason = {_toml_string(REASON)}
        """))
    sys.path.insert(0, str(root))
    config = str(root / "hlo-audit.toml")
    result = CliRunner().invoke(app, ["golden", "update", "--config", config])
    assert result.exit_code == 1, result.output  # the dropout cells fail to lower: nothing of theirs is written
    return root, config


@pytest.fixture(scope="module")
def hostile_report(hostile_project):
    root, config = hostile_project
    plan = audit.plan(config)
    report = audit.check(plan, list(audit.execute(plan)), config)
    waived = [f for f in report.findings if f.severity == "waived"]
    errors = [f for f in report.findings if f.severity == "error"]
    # The hostile text really reached the findings: the waiver's reason and the target's exception.
    assert waived and all("\x1b]0;pwned\x07" in message(f) and "\n## Everything" in message(f) for f in waived)
    assert len(errors) == 4 and all("\x1b]0;pwned\x07" in message(f) for f in errors)
    return report


def _with_hostile_ids(report: Outcome) -> Outcome:
    """The same report with a hostile model name in every cell id (what a merged shard JSON may hold)."""
    model = "m" + "".join(HOSTILE.values()).replace("/", "")
    results = [dataclasses.replace(r, cell=dataclasses.replace(r.cell, model=model)) for r in report.results]
    ids = {r.cell.id: n.cell.id for r, n in zip(report.results, results)}
    findings = [dataclasses.replace(f, cell=ids.get(f.cell, f.cell)) for f in report.findings]
    return Outcome.merged(results, findings, shard=None)


def _reports(report):
    return {"hostile messages": report, "hostile ids": _with_hostile_ids(report)}


def test_junit_of_a_hostile_check_is_well_formed(hostile_report):
    for label, report in _reports(hostile_report).items():
        suite = ET.fromstring(junit.format_junit(report))
        assert suite.get("tests") == str(report.summary.cells) == "12", label
        assert suite.get("failures") == "4"  # the four dropout cells whose lowering raised
        names = [f"{c.get('classname')}/{c.get('name')}" for c in suite.iter("testcase")]
        assert len(names) == 12
        text = ET.tostring(suite, encoding="unicode")
        assert not RAW_CONTROL.search(text.replace("\n", "")), label


def test_markdown_of_a_hostile_check_injects_nothing(hostile_report):
    for label, report in _reports(hostile_report).items():
        text = markdown.format_check(report)
        tokens = MD.parse(text)
        headings = [tokens[i + 1].content for i, t in enumerate(tokens) if t.type == "heading_open"]
        assert headings == ["hlo-audit check: **failed**"], label
        # The only HTML is the collapsed blocks' own tags: no comment, no img, no injected </details>.
        blocks = [t.content for t in tokens if t.type == "html_block"]
        inline = [c.content for t in tokens for c in (t.children or []) if c.type == "html_inline"]
        assert inline == [], (label, inline)
        assert all(re.fullmatch(r"(<details><summary>[^<]*</summary>|</details>)\n", b) for b in blocks), blocks
        opened = [b for b in blocks if b.startswith("<details>")]
        assert opened and blocks.count("</details>\n") == len(opened)  # each collapsed block closes once
        # The findings table: a header and one row per finding a human must read, each of 4 cells.
        rows = [t for t in tokens if t.type == "tr_open"]
        assert len(rows) == 1 + len(report.attention)
        assert not RAW_CONTROL.search(text), label


def test_terminal_check_of_a_hostile_report_holds_no_control_byte(hostile_report):
    for label, report in _reports(hostile_report).items():
        for verbose in (False, True):
            out = terminal.render(terminal.print_check, report, verbose)
            assert not RAW_CONTROL.search(out), (label, verbose)
            assert out.splitlines()[-1].startswith("hlo-audit check FAILED: 12 cells")


def test_csv_of_a_hostile_run_holds_no_formula_nor_control(hostile_report):
    from hlo_audit.report import frame

    for label, report in _reports(hostile_report).items():
        # A message that is a formula from its first character (a target may raise with any text).
        results = [dataclasses.replace(r, message=HOSTILE["formula"] + r.message) if r.status == "error" else r
                   for r in report.results]
        rows = list(csv.DictReader(io.StringIO(frame.format_run_csv(results, {}))))
        assert len(rows) == 12, label
        fields = [v for row in rows for v in row.values()]
        assert not [v for v in fields if v.startswith(("=", "@", "+"))], label
        assert not [v for v in fields if v.startswith("-") and not re.fullmatch(r"-[0-9.]+", v)], label
        assert not [v for v in fields if RAW_CONTROL.search(v) or "\n" in v], label
        assert sum("HYPERLINK" in row["message"] for row in rows) == 4  # the target's error, kept as text


def test_json_of_a_hostile_check_round_trips(hostile_report):
    for report in _reports(hostile_report).values():
        doc = json.loads(jsonfmt.format_check(report))
        assert [f["message"] for f in doc["findings"]] == [message(f) for f in report.findings]


def test_cli_check_piped_prints_the_hostile_report_safely(hostile_project):
    root, config = hostile_project
    result = CliRunner().invoke(app, ["check", "--config", config, "--markdown", str(root / "summary.md"),
                                      "--junit", str(root / "junit.xml")])
    assert result.exit_code == 1, result.output
    assert not RAW_CONTROL.search(result.stdout) and not RAW_CONTROL.search(result.stderr)
    assert "\\x1b]0;pwned\\x07" in result.stdout  # the error row's message, shown, not obeyed
    ET.parse(root / "junit.xml")
    tokens = MD.parse((root / "summary.md").read_text())
    assert [t for t in tokens if t.type == "heading_open"] and not [
        c for t in tokens for c in (t.children or []) if c.type == "html_inline"]


def test_html_report_of_hostile_ids_is_text(hostile_project):
    root, config = hostile_project
    plan = audit.plan(config)
    results = list(audit.execute(plan))
    model = "m" + "".join(HOSTILE.values()).replace("/", "")
    hostile = [dataclasses.replace(r, cell=dataclasses.replace(r.cell, model=model)) for r in results]
    view = audit.report(plan, results)
    view = dataclasses.replace(view, cells=[dataclasses.replace(v, result=h) for v, h in zip(view.cells, hostile)])
    page = html_format.format_html(view)
    parser = _Collect()
    parser.feed(page)
    parser.close()
    assert "img" not in parser.tags and "<!--" not in parser.tags
    assert not RAW_CONTROL.search(page)
    assert any(visible(model) in d for d in parser.data)  # the id is there, as text


def _html_in(markdown_text: str) -> list[str]:
    """Every piece of raw HTML markdown-it reads in the text (inline and block)."""
    tokens = MD.parse(markdown_text)
    return [t.content for t in tokens if t.type == "html_block"] + [
        c.content for t in tokens for c in (t.children or []) if c.type == "html_inline"]


def test_list_markdown_of_hostile_models_is_text(tmp_path):
    """Issue 48: `list --format markdown` printed the terminal's table, `<i>` in a model's name (a cell id) raw."""
    models = ["m<i>x", "n<img>", "p|q", "r`s"]
    (tmp_path / "hlo-audit.toml").write_text(
        f'target = "hlo_audit.examples.nnx_mlp:lower"\nmodels = {json.dumps(models)}\nquant = ["none"]\nlayers = [2]\n')
    result = CliRunner().invoke(app, ["list", "--config", str(tmp_path / "hlo-audit.toml"), "--format", "markdown"])
    assert result.exit_code == 0, result.output
    assert _html_in(result.stdout) == []
    rows = [t for t in MD.parse(result.stdout) if t.type == "tr_open"]
    assert len(rows) == 1 + 2 * len(models)  # the header, each model scanned and not: no pipe made a row or column
    shown = ["".join(c.content for c in t.children) for t in MD.parse(result.stdout) if t.type == "inline"]
    assert all(any(c.startswith(f"{model}/scan-") for c in shown) for model in models), shown  # ids as they are
