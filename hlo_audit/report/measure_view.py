"""`hlo-audit measure` as a table and as Markdown: the cells measured, A against B, and what the gate found of them
(``measure.MeasureReport``; sentences from ``report.words``; the JSON is ``report.jsonfmt.format_measure``)."""

from __future__ import annotations

from rich.console import Console

from hlo_audit.report import markdown, measure_words, words
from hlo_audit.report.escape import markdown_code, markdown_text
from hlo_audit.report.terminal import add_row, make_table, print_table, status


def _cell_row(row) -> tuple:
    t, h = row.timing, row.host
    memory = "" if t is None or t.argument_bytes is None else words.human_bytes(t.argument_bytes + t.temp_bytes)
    peak = "" if t is None or t.runtime_peak_bytes is None else words.human_bytes(t.runtime_peak_bytes)
    spread = measure_words.spread_text
    return (row.cell, h.caller if h else "", h.leaves if h else "",
            spread(h.per_call_us, "us") if h else "", spread(t.blocked_ms) if t else "",
            spread(t.queued_ms) if t else "", spread(t.host_ms) if t else "",
            f"{t.compile_s:.1f}" if t else "", memory, peak)


CELL_COLUMNS = ("cell", "caller", "leaves", "host/call (trivial body)", "blocked ms", "queued ms", "host ms/call",
                "compile s", "arg+temp", "peak")
COMPARISON_COLUMNS = ("cell against baseline", "blocked", "queued", "host/call")


def _comparison_row(c) -> tuple:
    by = {m.metric: measure_words.measured_change(m) for m in c.changes}
    return (measure_words.comparison_headline(c), by["blocked_ms"], by["queued_ms"], by["host_ms"])


def print_measure(console: Console, report) -> None:
    status(console, measure_words.measured_on(report))
    table = make_table(console, None, [(c, "left" if i < 2 else "right") for i, c in enumerate(CELL_COLUMNS)])
    for row in report.cells:
        add_row(table, *_cell_row(row))
    print_table(console, table)
    if report.comparisons:
        compared = make_table(console, None, [(c, "left" if i == 0 else "right")
                                              for i, c in enumerate(COMPARISON_COLUMNS)])
        for c in report.comparisons:
            add_row(compared, *_comparison_row(c))
        print_table(console, compared)
    for finding in report.findings:
        status(console, measure_words.finding_line(finding))
    for line in measure_words.measure_notes(report):
        status(console, line)


def format_markdown(report) -> str:
    """As ``print_measure``, in Markdown: every cell of the tables and every line escaped as the check's summary
    escapes them (``report.markdown``: a cell id or a waiver's reason holding ``<i>`` or ``|`` is text), cell ids in
    code spans."""
    rows = [(markdown.Md(markdown_code(row[0])), *row[1:]) for row in map(_cell_row, report.cells)]
    lines = [markdown_text(measure_words.measured_on(report), line_start=True), "",
             *markdown.table(CELL_COLUMNS, rows)]
    if report.comparisons:
        lines += ["", *markdown.table(COMPARISON_COLUMNS, [_comparison_row(c) for c in report.comparisons])]
    lines += [""] + [f"- {markdown_text(measure_words.finding_line(f), line_start=True)}" for f in report.findings]
    lines += [f"- {markdown_text(line, line_start=True)}" for line in measure_words.measure_notes(report)]
    return "\n".join(lines).rstrip() + "\n"
