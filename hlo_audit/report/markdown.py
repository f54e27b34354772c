"""Markdown for PR comments and ``$GITHUB_STEP_SUMMARY``.

Every string from input is escaped for where it lands (``escape``): table cells and sentences with
``markdown_text``, ids, paths and patterns in code spans with ``markdown_code``, text diffs in a fence no line can
close. ``table`` escapes every cell it is given as plain text unless it is already Markdown (``Md``), so a cell
cannot be left out by mistake.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hlo_audit.analysed import Constants, Launches, RngSummary
from hlo_audit.comparison import CellDelta, Structural
from hlo_audit.hlo.analysis import Analysis
from hlo_audit.hlo.diff import captured_change
from hlo_audit.lowering import MEMORY_KINDS
from hlo_audit.report.accepting import accept_line, split_command, without_accept
from hlo_audit.report.change_words import match_line, named_lines
from hlo_audit.report.escape import html, markdown_code, markdown_fence, markdown_text, visible
from hlo_audit.report.words import (
    against_golden_text,
    captured_text,
    check_summary_text,
    constants_headline,
    folded_line,
    frozen_rng_line,
    human_bytes,
    key_hazard_lines,
    launches_headline,
    lowering_warnings_line,
    message,
    rng_cost,
    rng_headline,
)
from hlo_audit.results import LoweredCell, LoweringWarnings
from hlo_audit.rules.wording import launch_lines, launches_change_text, plural, program_sizes_text


class Md(str):
    """Text that is Markdown already (a code span, an icon): ``table`` puts it in as it is."""


def _code(s: object, in_table: bool = True) -> Md:
    return Md(markdown_code(s, in_table=in_table))


def _text(s: object) -> str:
    return markdown_text(s)


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    """A GFM table, every cell escaped as plain text unless it is Markdown already (``Md``)."""
    def cell(c: object) -> str:
        return c if isinstance(c, Md) else markdown_text("" if c is None else c)

    lines = ["| " + " | ".join(map(cell, header)) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(map(cell, row)) + " |" for row in rows]
    return lines


def format_cells(cells) -> str:
    """``list --format markdown``: the matrix's cells as a table (ids in code spans, every value escaped)."""
    rows = [(_code(c.id), c.model, c.scan_label, c.quant_label, c.layers, c.platform) for c in cells]
    return "\n".join([*table(["cell", "model", "scan", "quant", "layers", "platform"], rows), "",
                      f"{len(cells)} {plural(len(cells), 'cell')}"]) + "\n"


def format_count(analyses: Sequence[Analysis], top: int = 20, launches: Sequence | None = None) -> str:
    out: list[str] = []
    for a, kernels in zip(analyses, launches or [None] * len(analyses)):
        if not isinstance(a, Analysis):  # unreadable: its error in place of its numbers
            out.append(f"### {_code(a.source, False)} — not read\n\nNot read: {_text(a.error)}\n")
            continue
        s = a.summary
        out.append(f"### {_code(a.module.name, False)} — {s.entry_params} entry parameters")
        out.append(f"\nSource: {_code(a.source, False)}\n")
        out += table(["dtype", "params"], list(s.by_dtype.items()))
        out.append("")
        out += table(["role", "params", "bytes"], [(r, n, s.bytes_by_role.get(r, 0)) for r, n in s.by_role.items()])
        out.append("")
        groups = list(s.groups.items())
        shown = groups if top <= 0 else groups[:top]
        out += table(["pattern", "params"], [(_code(p), n) for p, n in shown])
        if len(shown) < len(groups):
            out.append(f"\n{len(groups) - len(shown)} more groups not shown.")
        out += ["", _constants_line(Constants.of(a.constants)), ""]
        out += [f"{launches_headline(kernels)}.", ""] if kernels else []
    return "\n".join(out) + "\n"


def _constants_line(constants: Constants) -> str:
    captured = f"; captured state: {captured_text(constants.captured)}" if constants.captured else ""
    return _text(f"{constants_headline(constants)}{captured}.")


def format_diff(structural: Structural, old: str, new: str, launches=None) -> str:
    d, params = structural.diff, structural.params
    out = [f"### HLO diff: **{d.verdict}**" + (f" ({', '.join(d.changes)})" if d.changes else ""), ""]
    out.append(f"{_code(old, False)} → {_code(new, False)}: entry parameters {params.golden} → {params.now}")
    out.append("")
    if d.named:
        out += [f"- {_text(line)}" for line in named_lines(d.named)]
        out.append("")
    if d.match is not None:
        out += [f"Matched: {_text(match_line(d.match))}.", "",
                f"Sizes: {_text(program_sizes_text(structural.sizes, structural.per_step_by_opcode))}.", ""]
    if launches:
        out += [f"{launches_change_text(launches)}.", "", *(f"- {line}" for line in launch_lines(launches)[:8]), ""]
    if params.by_dtype or params.by_role:
        rows = [("dtype", k, f"{v:+d}") for k, v in params.by_dtype.items()]
        rows += [("role", k, f"{v:+d}") for k, v in params.by_role.items()]
        out += table(["by", "key", "delta"], rows)
        out.append("")
    groups = d.params_added + d.params_removed
    if groups:
        out += table(["delta", "role", "dtype", "pattern"],
                      [(f"{g.count:+d}", g.role, g.dtype, _code(g.pattern)) for g in groups])
        out.append("")
    if d.constants:
        out += [f"Baked-in state: {_text(captured_change(d.constants))}.", ""]
    if d.text_diff:
        lines = [visible(line) for line in d.text_diff]
        fence = markdown_fence(lines)
        out += ["<details><summary>normalized text diff</summary>", "", f"{fence}diff", *lines, fence]
        if d.text_diff_omitted:
            out.append(f"{d.text_diff_omitted} more lines omitted.")
        out += ["", "</details>"]
    return "\n".join(out) + "\n"


def _dtype_text(by_dtype: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in by_dtype.items())


def format_run(results, slopes: dict[str, float]) -> str:
    rows = []
    for r in results:
        slope = "" if (s := slopes.get(r.cell.id)) is None else f"{s:g}"
        if not isinstance(r, LoweredCell):
            rows.append((_code(r.cell.id), r.status, "", "", "", slope, "", r.message))
            continue
        captured = r.captured
        rows.append((_code(r.cell.id), r.status, r.entry_params, _dtype_text(r.summary.by_dtype), r.rng_params, slope,
                     f"{captured.arrays}: {_dtype_text(captured.by_dtype)}" if captured else "", r.message))
    if any(isinstance(r, LoweredCell) and r.launches for r in results):  # GPU cells: launches per step
        rows = [(*row[:-1], r.kernels if isinstance(r, LoweredCell) and r.launches else "", row[-1])
                for row, r in zip(rows, results)]
        header = ["cell", "status", "entry params", "by dtype", "RNG params", "params/layer", "captured arrays",
                  "kernels", "note"]
    else:
        header = ["cell", "status", "entry params", "by dtype", "RNG params", "params/layer", "captured arrays", "note"]
    return "\n".join(table(header, rows)) + "\n"


def format_explain(node, captured=None, launches: Launches | None = None, against: CellDelta | None = None) -> str:
    """The explain tree as a nested list: counts, dtypes, roles, bytes per group; then the captured state's."""
    def lines(n, level: int) -> list[str]:
        record = n.to_record()
        dead = (f"; drawn {n.drawn_rng}" if n.drawn_rng else "") + (f"; never drawn {n.dead_rng}" if n.dead_rng else "")
        out = [f"{'  ' * level}- **{n.count}** {_code(n.name, False)}: "
               + _text(f"{_dtype_text(record['by_dtype'])}; {_dtype_text(record['by_role'])}; "
                       f"{human_bytes(n.bytes)}{dead}")]
        for child in n.ordered():
            out += lines(child, level + 1)
        if n.hidden:
            out.append(f"{'  ' * (level + 1)}- {n.hidden_params} in {n.hidden} more")
        return out

    out = lines(node, 0)
    if captured is not None:
        out += ["", "Captured as constants (arrays the step closes over instead of taking them):", ""]
        out += lines(captured, 0)
    if launches:
        out += ["", f"{launches_headline(launches)}."]
    if against is not None:
        out += ["", f"{_text(against_golden_text(against))}."]
    return "\n".join(out) + "\n"


def _memory_cells(view) -> list[str]:
    delta = view.memory_delta() or {}
    cells = []
    for key in (kind.key for kind in MEMORY_KINDS):
        if key not in view.result.memory:  # stage optimized generates no code
            cells.append("")
            continue
        d = delta.get(key)
        change = f" ({'+' if d > 0 else '-'}{human_bytes(abs(d))})" if d else ""
        cells.append(human_bytes(view.result.memory[key]) + change)
    return cells


def _kernels_cell(view) -> str:
    """A GPU cell's launches per step, with its change against the golden's."""
    if not view.result.launches:
        return ""
    delta = (view.launches_delta() or {}).get("total")
    return f"{view.result.kernels}" + (f" ({delta:+d})" if delta else "")


def _cost_cells(cost: Mapping[str, float]) -> tuple[str, str]:
    return (f"{cost['flops'] / 1e9:,.1f}" if "flops" in cost else "",
            human_bytes(int(cost["bytes_accessed"])) if "bytes_accessed" in cost else "")


def format_report(view) -> str:
    """The report's views for a PR comment; the tidy rows in a collapsed block."""
    out = ["### Entry parameters (Δ against the golden)", "", *_entry_params_view(view)]
    if view.baking:
        out += ["", "### State baked in as constants (captured: arrays the step closes over)", "",
                *_baked_view(view)]
    out += ["", "### Scan on / scan off", "", *_scan_view(view)]
    if view.series:
        out += ["", "### Depth scaling", "", format_scaling(view.series).rstrip("\n")]
    if view.with_memory:
        out += ["", "### Compiled: memory per device (Δ against the golden) and cost", ""]
        out += table(["cell", *(kind.label for kind in MEMORY_KINDS), "GFLOP", "bytes accessed", "kernels"],
                      [(_code(v.result.cell.id), *_memory_cells(v), *_cost_cells(v.result.cost or {}),
                        _kernels_cell(v)) for v in view.with_memory])
    tidy = view.tidy_rows
    out += ["", f"<details><summary>{len(tidy)} rows: cell x dtype x role</summary>", ""]
    columns = ["id", "dtype", "role", "count", "bytes", "golden_delta"]
    out += table(columns, [tuple("" if getattr(r, k) is None else getattr(r, k) for k in columns) for r in tidy])
    out += ["", "</details>"]
    return "\n".join(out) + "\n"


def _signed_delta(d: int | None) -> str:
    return "new" if d is None else f"{d:+d}" if d else "0"


def _entry_params_view(view) -> list[str]:
    rows = []
    for v in view.lowered:
        s = v.result.summary
        rows.append((_code(v.result.cell.id), s.entry_params, _signed_delta(v.total_delta),
                     _dtype_text(s.by_dtype), _dtype_text(s.by_role), v.result.rng.dead_params if v.result.rng else ""))
    return table(["cell", "entry params", "Δ", "by dtype", "by role", "never-drawn RNG"], rows)


def _baked_view(view) -> list[str]:
    return table(["cell", "captured", "large constants", "literal RNG keys", "Δ"],
                  [(_code(v.result.cell.id), captured_text(v.result.constants.captured),
                    len(v.result.constants.large), v.result.constants.frozen_rng.literal_keys,
                    "new" if not v.golden_knows_constants
                    else captured_change(v.constants_delta.to_record()) if v.constants_delta else "0")
                   for v in view.baking])


def _scan_view(view) -> list[str]:
    def side(r):
        return ("", "") if r is None else (r.entry_params, r.count("by_dtype", "u32"))

    return table(["model/quant/depth", "params on", "u32 on", "params off", "u32 off"],
                  [(_code(p.label), *side(p.on), *side(p.off)) for p in view.scan_pairs])


def format_scaling(series) -> str:
    rows = []
    for s in series:
        p = s.projection()
        rows.append((_code(s.id), ",".join(map(str, s.depths)), f"{s.total.slope:g}", f"{s.total.intercept:g}",
                     f"{s.by_dtype.get('u32').slope:g}" if "u32" in s.by_dtype else "0",
                     p.layers if p else "", p.entry_params if p else "", p.by_dtype.get("u32", "") if p else ""))
    return "\n".join(table(["series", "depths", "params/layer", "intercept", "u32/layer", "full depth",
                             "projected params", "projected u32"], rows)) + "\n"


SEVERITY_ICON = {"regression": "❌", "error": "❌", "improvement": "⬇️", "advisory": "ℹ️", "waived": "➖",
                 "stale": "🗑️", "unavailable": "⏭️", "ok": "✅"}


def format_check(outcome) -> str:
    """The verdict, the outcome's summary (the numbers every format prints), the findings a human must read in a
    table; waived, folded and unavailable ones in collapsed blocks."""
    head = "## hlo-audit check: " + ("passed" if outcome.passed else "**failed**")
    out = [head, "", _text(check_summary_text(outcome.summary))]
    warned = LoweringWarnings.of(outcome.results)
    if warned is not None:
        out += ["", _text(lowering_warnings_line(warned))]
    notable = outcome.attention
    if notable:
        worded = without_accept if outcome.accept else message
        out += [""] + table(["", "cell", "rule", "finding"],
                      [(Md(SEVERITY_ICON.get(f.severity, "")), _code(f.cell), f.rule, worded(f)) for f in notable])
    if outcome.accept:  # one command for every failing cell, in a block a reviewer copies whole
        intro, command = split_command(accept_line(outcome.accept))
        out += ["", _text(intro), "", "```", command, "```"]
    for severity, title in (("waived", "waived"), ("unavailable", "unavailable here")):
        found = outcome.by_severity.get(severity, ())
        if found:
            cells = len({f.cell for f in found})
            summary = f"{SEVERITY_ICON[severity]} {cells} {plural(cells, 'cell')} {title}"
            out += ["", f"<details><summary>{summary}</summary>", ""]
            out += [f"- {_code(f.cell, False)} {_text(f.rule)}: {_text(message(f))}" for f in found]
            out += ["", "</details>"]
    folded = outcome.folded
    if folded:
        out += ["", f"<details><summary>{SEVERITY_ICON['advisory']} {html(folded_line(outcome))}</summary>", ""]
        out += [f"- {_code(f.cell, False)}: {_text(message(f))}" for f in folded]
        out += ["", "</details>"]
    return "\n".join(out) + "\n"


def format_rng(label: str, rng: RngSummary, streams: bool = False, constants: Constants | None = None) -> str:
    out = [f"### RNG streams of {_code(label, False)}", "", _text(f"{rng_headline(rng)}; {rng_cost(rng)}."), ""]
    out += [f"- **{_text(line)}**" for line in key_hazard_lines(rng)] + ([""] if rng.key_hazards else [])
    frozen = frozen_rng_line(constants)
    if frozen:
        out += [f"**{_text(frozen)}.**", ""]
    out += table(["stream pattern", "streams", "drawn", "carried", "unknown", "dead params", "increments/step",
                   "where"],
                  [(_code(p.pattern), p.streams, p.drawn, p.carried, p.unknown, p.dead_params, p.dead_increments,
                    p.where) for p in rng.patterns])
    if streams:
        out.append("")
        out += table(["verdict", "stream", "params", "increments/step", "where"],
                      [(s.verdict, _code(s.path), s.params, s.increments, s.where) for s in rng.stream_list])
    return "\n".join(out) + "\n"
