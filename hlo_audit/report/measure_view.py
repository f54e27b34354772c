"""`hlo-audit measure` as a table and as Markdown: the cells measured, A against B, and what the gate found of them
(``measure.MeasureReport``; sentences from ``report.words``; the JSON is ``report.jsonfmt.format_measure``)."""

from __future__ import annotations

from rich.console import Console

from hlo_audit.report import measure_words, words
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
    def table(columns, rows) -> list[str]:
        return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns),
                *("| " + " | ".join(str(v) for v in r) + " |" for r in rows)]

    lines = [measure_words.measured_on(report), "",
             *table(CELL_COLUMNS, [_cell_row(r) for r in report.cells])]
    if report.comparisons:
        lines += ["", *table(COMPARISON_COLUMNS, [_comparison_row(c) for c in report.comparisons])]
    lines += [""] + [f"- {measure_words.finding_line(f)}" for f in report.findings]
    lines += [f"- {line}" for line in measure_words.measure_notes(report)]
    return "\n".join(lines).rstrip() + "\n"
