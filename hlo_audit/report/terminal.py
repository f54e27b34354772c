"""The terminal format of every command: rich boxes on a terminal; plain aligned text when piped (and NO_COLOR
honored). The `report` command's views are in ``terminal_report``, explain's tree in ``terminal_tree``.

Every string that comes from input (ids, paths, patterns, messages) goes through ``escape.terminal``: control
characters are shown as ``\x1b``-style escapes and nothing is read as rich markup. Tables are never fitted to
the width by cutting a value: a table wider than the console is printed at its own width (``print_table``), so
every id and number stays whole and greppable in a CI log; messages wrap at spaces only, and the commands they
end with (``hlo-audit golden update --only id=...``) are printed on a line of their own, never wrapped.
"""

from __future__ import annotations

import os
import sys
import textwrap
from collections.abc import Sequence

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from hlo_audit.analysed import Constants, Launches, RngSummary
from hlo_audit.comparison import Structural
from hlo_audit.hlo.analysis import Analysis
from hlo_audit.hlo.diff import captured_change
from hlo_audit.report.accepting import accept_line, split_command, without_accept
from hlo_audit.report.change_words import match_line, named_lines
from hlo_audit.report.escape import terminal as esc
from hlo_audit.report.escape import visible
from hlo_audit.report.words import (
    captured_text,
    check_summary_text,
    common_path_prefix,
    constants_headline,
    coverage_lines,
    depth_values,
    every_cell_refused_line,
    folded_line,
    frozen_rng_line,
    key_hazard_lines,
    launches_headline,
    lowering_warnings_line,
    message,
    nothing_written_line,
    rng_cost,
    rng_headline,
    scalar_launch_lines,
)
from hlo_audit.results import FailedCell, LoweredCell, LoweringWarnings, UnavailableCell
from hlo_audit.rules.dead_model import message as dead_model_message
from hlo_audit.rules.wording import launch_lines, launches_change_text, plural, program_sizes_text

PIPED_WIDTH = 100


def make_console(file=None, max_width: int | None = None) -> Console:
    """A console for ``file`` (stdout): colors only on a terminal and without NO_COLOR.

    Piped output (CI logs, grep, a PR comment) is 100 wide unless ``COLUMNS`` says otherwise; on a terminal the
    terminal's width is used, capped at ``max_width`` when given. The width is what messages wrap to and what
    tables try to fit: a table that needs more is printed wider (``print_table``), never cut.
    """
    file = file or sys.stdout
    terminal = file.isatty()
    if terminal:
        width = min(max_width, Console(file=file).width) if max_width else None
    else:
        columns = os.environ.get("COLUMNS", "")
        width = int(columns) if columns.isdigit() and int(columns) >= 40 else PIPED_WIDTH
        width = min(width, max_width) if max_width else width
    return Console(file=file, force_terminal=terminal, no_color=not terminal or "NO_COLOR" in os.environ,
                   width=width, highlight=False, soft_wrap=False)


def render(printer, *args, max_width: int | None = None, **kwargs) -> str:
    """What ``printer(console, *args, **kwargs)`` prints on a console for standard output, as text (with its
    colors on a terminal), so every format of every command is a function that returns text."""
    console = make_console(max_width=max_width)
    with console.capture() as captured:
        printer(console, *args, **kwargs)
    return captured.get()


def status(console: Console, line: str | Text) -> None:
    """A status line, summary or message: never hard-wrapped, whatever the width (scripts grep them). A plain
    ``str`` is hlo-audit's own words; text from input comes as ``esc(...)``."""
    console.print(line if isinstance(line, Text) else Text(line), soft_wrap=True)


def make_table(console: Console, title: str | None, columns: Sequence[tuple[str, str]]) -> Table:
    table = Table(title=None if title is None else Text(title), title_justify="left",
                  box=box.SIMPLE_HEAD if console.is_terminal else None,
                  pad_edge=False, show_edge=False)
    for name, justify in columns:
        table.add_column(esc(name), justify=justify, no_wrap=True)
    return table


def add_row(table: Table, *cells: object) -> None:
    """A row of values: ``Text`` as given (styled, already escaped), anything else escaped (``esc``)."""
    table.add_row(*(c if isinstance(c, Text) else esc("" if c is None else c) for c in cells))


def _natural_width(console: Console, renderable) -> int:
    return Measurement.get(console, console.options.update_width(1 << 20), renderable).maximum


def print_whole(console: Console, renderable) -> None:
    """Print ``renderable`` at the console's width when it fits, else at its own width, wider than the console:
    nothing in it is cut or wrapped. A CI log then holds every id and number whole; a terminal wraps the long
    lines it cannot show."""
    width = _natural_width(console, renderable)
    if width <= console.width:
        console.print(renderable)
        return
    saved = console.width
    console.width = width
    try:
        console.print(renderable, crop=False)
    finally:
        console.width = saved


def print_table(console: Console, table: Table) -> None:
    """Print ``table`` without cutting or wrapping any value: one space between columns when that makes it fit,
    else wider than the console (``print_whole``)."""
    if _natural_width(console, table) > console.width:
        table.collapse_padding = True
    print_whole(console, table)


def print_message(console: Console, message: str, indent: int = 4) -> None:
    """A finding's message under its heading: on one line when it fits, else wrapped at spaces (a path pattern
    longer than the line stays whole on a line of its own) with the command it ends with on a line of its own,
    never wrapped, so it can be copied and grepped (``words.split_command``)."""
    pad, text = " " * indent, visible(message)
    width = max(console.width - indent, 20)
    if len(text) <= width:
        status(console, Text(pad + text))
        return
    text, command = split_command(text)
    for line in textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False):
        status(console, Text(pad + line))
    if command is not None:
        status(console, Text(pad + command))


def print_count(console: Console, analyses: Sequence, top: int = 20, launches: Sequence | None = None) -> None:
    """Each readable module's tables (an unreadable input's error goes to stderr, from the CLI); a GPU dump's
    module, what one step launches."""
    for a, kernels in zip(analyses, launches or [None] * len(analyses)):
        if not isinstance(a, Analysis):
            continue
        s = a.summary
        status(console, esc(f"{a.source}  module {a.module.name}: {s.entry_params} entry parameters", style="bold"))
        dtypes = make_table(console, "by dtype", [("dtype", "left"), ("params", "right")])
        for dtype, n in s.by_dtype.items():
            add_row(dtypes, dtype, n)
        roles = make_table(console, "by role", [("role", "left"), ("params", "right"), ("bytes", "right")])
        for role, n in s.by_role.items():
            add_row(roles, role, n, f"{s.bytes_by_role.get(role, 0):,}")
        print_table(console, dtypes)
        print_table(console, roles)
        groups = list(s.groups.items())
        shown = groups if top <= 0 else groups[:top]
        table = make_table(console, f"groups ({len(shown)} of {len(groups)})",
                           [("pattern", "left"), ("params", "right")])
        for pattern, n in shown:
            add_row(table, pattern, n)
        print_table(console, table)
        print_constants(console, Constants.of(a.constants))
        print_launches(console, kernels)
        console.print()


def print_launches(console: Console, launches: Launches | None) -> None:
    """A GPU program's launches per step in a line, then its largest groups of scalar kernels."""
    if not launches:
        return
    status(console, launches_headline(launches))
    for line in scalar_launch_lines(launches):
        status(console, Text(f"  {line}"))


def print_constants(console: Console, constants: Constants) -> None:
    """The module's constants in one line, then its large constants and (when known) the captured state by pattern."""
    status(console, esc(constants_headline(constants)))
    if constants.large:
        large = make_table(console, "large constants (the size of model state)",
                           [("name", "left"), ("form", "left"), ("shape", "left"), ("value", "left"),
                            ("bytes", "right")])
        for c in constants.large:
            add_row(large, c.name, c.form, f"{c.dtype}[{','.join(map(str, c.dims))}]", c.value, f"{c.bytes:,}")
        print_table(console, large)
    captured = constants.captured
    if captured:
        status(console, esc("captured state (arrays the step closes over, baked in as constants): "
                            f"{captured_text(captured)}"))
        groups = make_table(console, None, [("pattern", "left"), ("arrays", "right")])
        for pattern, n in captured.groups.items():
            add_row(groups, pattern, n)
        print_table(console, groups)


def print_diff(console: Console, structural: Structural, old: str, new: str, launches=None) -> None:
    """The verdict, the named changes (what, how much, where), the matched rest in one line, the programs' sizes, the
    parameter and op deltas, then the normalized text diff when it was asked for (``--text``)."""
    d = structural.diff
    style = {"identical": "green", "identical-after-normalization": "green", "renamed-only": "green",
             "rng-state-only": "yellow", "changed": "red"}[d.verdict]
    verdict = Text(f"verdict: {d.verdict}", style=f"bold {style}")
    if d.changes:
        verdict.append(f" ({', '.join(d.changes)})")
    status(console, verdict)
    params = structural.params
    status(console, esc(f"entry parameters: {params.golden} -> {params.now}  ({old} -> {new})"))
    if d.named:
        status(console, Text("changes:", style="bold"))
        for line in named_lines(d.named):
            status(console, esc(f"  {line}"))
    if d.match is not None:
        status(console, esc(f"matched: {match_line(d.match)}"))
        status(console, esc(f"sizes: {program_sizes_text(structural.sizes, structural.per_step_by_opcode)}"))
    if launches:
        status(console, esc(launches_change_text(launches)))
        for line in launch_lines(launches)[:8]:
            status(console, esc(f"  {line}", style="red" if line.startswith("+") else "green"))
    if params.by_dtype or params.by_role:
        deltas = make_table(console, "parameter deltas", [("by", "left"), ("key", "left"), ("delta", "right")])
        for k, v in params.by_dtype.items():
            add_row(deltas, "dtype", k, _signed(v))
        for k, v in params.by_role.items():
            add_row(deltas, "role", k, _signed(v))
        print_table(console, deltas)
    groups = d.params_added + d.params_removed
    if groups:
        table = make_table(console, "parameters added / removed",
                           [("delta", "right"), ("role", "left"), ("dtype", "left"), ("pattern", "left")])
        for g in groups:
            add_row(table, _signed(g.count), g.role, g.dtype, g.pattern)
        print_table(console, table)
    if d.opcode_dtype_delta:
        ops = make_table(console, "opcode:dtype deltas", [("opcode:dtype", "left"), ("delta", "right")])
        rows = sorted(d.opcode_dtype_delta.items(), key=lambda kv: (-abs(kv[1]), kv[0]))
        for k, v in rows[:OPCODE_ROWS]:
            add_row(ops, k, _signed(v))
        print_table(console, ops)
        if len(rows) > OPCODE_ROWS:
            status(console, f"... {len(rows) - OPCODE_ROWS} more opcode:dtype deltas (--format json lists them)")
    if d.constants:
        status(console, esc(f"baked-in state: {captured_change(d.constants)}"))
    if d.computations_added or d.computations_removed:
        status(console, f"computations: +{len(d.computations_added)} -{len(d.computations_removed)}")
    if d.text_diff:
        status(console, Text("normalized text diff:", style="bold"))
        for line in d.text_diff:
            color = "green" if line.startswith("+") else "red" if line.startswith("-") else ""
            status(console, esc(line, style=color))
        if d.text_diff_omitted:
            status(console, f"... {d.text_diff_omitted} more lines (use --max-lines)")


OPCODE_ROWS = 8  # opcode:dtype deltas a diff prints before "... N more"


def _signed(v: int) -> Text:
    return Text(f"{v:+d}", style="red" if v > 0 else "green")


STATUS_STYLE = {"ok": "green", "unavailable": "yellow", "error": "red"}


def dtype_counts(by_dtype: dict[str, int]) -> str:
    return " ".join(f"{k}:{v}" for k, v in by_dtype.items())


def print_run(console: Console, results, slopes: dict[str, float]) -> None:
    columns = [("cell", "left"), ("status", "left"), ("params", "right"), ("by dtype", "left"), ("rng", "right"),
               ("/layer", "right"), ("dead", "right"), ("const", "right")]
    lowered = [r for r in results if isinstance(r, LoweredCell)]
    kernels = any(r.launches for r in lowered)  # GPU cells: launches per step (`kernels`)
    table = make_table(console, None, columns + ([("kern", "right")] if kernels else []))
    for r in results:
        slope = "" if (s := slopes.get(r.cell.id)) is None else f"{s:g}"
        state = esc(r.status, style=STATUS_STYLE[r.status])
        if not isinstance(r, LoweredCell):
            add_row(table, r.cell.id, state, "", "", "", slope, "", "", *([""] if kernels else []))
            continue
        captured = r.captured
        add_row(table, r.cell.id, state, r.entry_params, dtype_counts(r.summary.by_dtype), r.rng_params, slope,
                r.rng.dead_params if r.rng else "", captured.arrays if captured else "",
                *([r.kernels if r.launches else ""] if kernels else []))
    print_table(console, table)
    if any(r.captured and r.captured.arrays for r in lowered):
        status(console, Text("const: arrays the step captured (closes over), baked into the program as constants "
                             "(`hlo-audit explain CELL` shows which)", style="dim"))
    # Why a cell did not lower, below the table: the reasons are long, and one reason often covers many cells.
    print_unavailable(console, results)
    for r in results:
        if isinstance(r, FailedCell):
            status(console, Text.assemble(("error", STATUS_STYLE["error"]), "  ", esc(r.cell.id)))
            print_message(console, r.message)
    counts = {s: sum(1 for r in results if r.status == s) for s in STATUS_STYLE}
    cached = sum(1 for r in results if isinstance(r, LoweredCell) and r.cached)
    status(console, f"{len(results)} {plural(len(results), 'cell')}: {counts['ok']} ok, {counts['unavailable']} "
                    f"unavailable, {counts['error']} error; {cached} from cache")


def print_unavailable(console: Console, results) -> None:
    """Why cells did not lower, and what ok cells note (a recipe lowered for an architecture it cannot run on)."""
    for kind, label in ((UnavailableCell, "unavailable"), (LoweredCell, "ok, noted")):
        messages: dict[str, int] = {}
        for r in results:
            if isinstance(r, kind) and r.message:
                messages[r.message] = messages.get(r.message, 0) + 1
        for said, n in messages.items():
            status(console, esc(f"{n} {plural(n, 'cell')} {label}: {said}", style="dim"))


def print_scaling(console: Console, series) -> None:
    table = make_table(console, None, [("series", "left"), ("depths", "left"), ("/layer", "right"),
                                       ("intercept", "right"), ("u32/L", "right"), ("rng/L", "right"),
                                       ("full", "right"), ("proj.", "right"), ("proj. u32", "right")])
    for s in series:
        p = s.projection()
        rng = sum(s.by_role[k].slope for k in ("rng_key", "rng_count") if k in s.by_role)
        add_row(table, s.id, ",".join(map(str, s.depths)), f"{s.total.slope:g}", f"{s.total.intercept:g}",
                f"{s.by_dtype['u32'].slope:g}" if "u32" in s.by_dtype else "0", f"{rng:g}",
                p.layers if p else "", p.entry_params if p else "", p.by_dtype.get("u32", "") if p else "")
    print_table(console, table)
    launched = [s for s in series if s.launches]
    if launched:  # GPU series: kernels per step per layer, projected to full depth
        kernels = make_table(console, "kernels per step: per layer (/L) and projected to full depth", [
            ("series", "left"), ("kern/L", "right"), ("scalar/L", "right"), ("rng/L", "right"), ("coll/L", "right"),
            ("full", "right"), ("proj. kern", "right"), ("proj. rng", "right")])
        for s in launched:
            p = (s.projection().launches or {}) if s.projection() else {}
            add_row(kernels, s.id, *(f"{s.launches[k].slope:g}" for k in ("total", "scalar", "reading_rng",
                                                                          "collectives")),
                    s.full_depth or "", p.get("total", ""), p.get("reading_rng", ""))
        print_table(console, kernels)


def print_cells(console: Console, cells) -> None:
    table = make_table(console, None, [("cell", "left"), ("model", "left"), ("scan", "left"), ("quant", "left"),
                                       ("layers", "right"), ("platform", "left")])
    for c in cells:
        add_row(table, c.id, c.model, c.scan_label, c.quant_label, c.layers, c.platform)
    print_table(console, table)
    status(console, f"{len(cells)} {plural(len(cells), 'cell')}")


SEVERITY_STYLE = {"regression": "bold red", "error": "bold red", "improvement": "green", "advisory": "yellow",
                  "waived": "dim", "stale": "yellow", "unavailable": "dim", "ok": "green"}


def summary_line(outcome) -> Text:
    """``hlo-audit check passed: 12 cells: 7 ok, 1 waived, 4 unavailable; findings: ...``: the outcome's summary."""
    verdict = Text("passed" if outcome.passed else "FAILED", style="bold green" if outcome.passed else "bold red")
    return Text.assemble("hlo-audit check ", verdict, ": ", check_summary_text(outcome.summary))


def print_check(console: Console, outcome, verbose: bool = False) -> None:
    """One screen: the matrix by depth series, the findings that need a human (every finding with verbose), totals.

    Verdicts and counts are the outcome's (``Outcome.verdicts`` / ``summary``): the same in every format, with
    or without ``--verbose``, which only lists more."""
    _print_series_summary(console, outcome)
    # A finding is a heading line and its message indented below: messages carry long path patterns, which
    # wrap at spaces across nearly the full width instead of being cut up inside a narrow table column.
    for f in outcome.findings if verbose else outcome.attention:
        status(console, Text.assemble((f.severity, SEVERITY_STYLE.get(f.severity, "")), "  ", esc(f.cell), "  ",
                                      esc(f.rule)))
        print_message(console, without_accept(f) if outcome.accept else message(f))
    if outcome.accept:
        print_message(console, accept_line(outcome.accept), indent=0)
    if outcome.folded and not verbose:
        status(console, esc(folded_line(outcome), style=SEVERITY_STYLE["advisory"]))
    print_warned(console, LoweringWarnings.of(outcome.results, chosen=verbose))
    if outcome.coverage is not None:
        for line in coverage_lines(outcome.coverage):
            status(console, esc(line))
    status(console, summary_line(outcome))


def print_warned(console: Console, warned: LoweringWarnings | None) -> None:
    """What the run's lowerings warned, once, where there is anything (each warning's text is input: escaped)."""
    if warned is not None:
        status(console, esc(lowering_warnings_line(warned), style="dim"))


def print_golden_update(console: Console, update, root, results: Sequence = ()) -> None:
    """What a golden update wrote, kept and removed, what its lowerings warned (``results``: the run's), in all."""
    for cell_id, why in update.skipped:
        status(console, esc(f"skipped {cell_id}: {why}", style="yellow"))
    for path in update.cleaned:
        status(console, esc(f"removed {path} (left by a killed golden update)"))
    for cell_id in update.healed:
        status(console, esc(f"rewrote {cell_id}: its golden was damaged"))
    for path in update.pruned_files:
        status(console, esc(f"pruned {path}"))
    for cell_id, facts in update.computes_none:  # written, but never blessed silently
        status(console, esc(f"{cell_id}: {dead_model_message(facts)}", style="bold yellow"))
    if update.unchanged and not (update.written or update.skipped or update.pruned_files or update.healed):
        status(console, esc(nothing_written_line(len(update.unchanged))))
    print_warned(console, LoweringWarnings.of(results))
    status(console, esc(f"golden update ({root}): {len(update.written)} written, {len(update.unchanged)} unchanged, "
                        f"{len(update.skipped)} skipped, {len(update.pruned)} pruned"))
    if update.every_cell_refused:
        status(console, esc(every_cell_refused_line(len(update.skipped)), style="bold red"))


def _print_series_summary(console: Console, outcome) -> None:
    """One row per depth series (entry params and u32 at each depth, verdict); unavailable cells in one line each."""
    rows = outcome.rows
    if rows:
        kernels = any(r.launches for row in rows for r in row.results)
        table = make_table(console, None, [("series", "left"), ("entry params", "right"), ("u32", "right"),
                                           ("dead rng", "right"), *([("kernels", "right")] if kernels else []),
                                           ("verdict", "left")])
        for row in rows:
            verdict = row.verdict
            cells = row.results
            depths = [r.cell.layers for r in cells]
            add_row(table, row.label, depth_values(depths, [r.entry_params for r in cells]),
                    depth_values(depths, [r.count("by_dtype", "u32") for r in cells]),
                    depth_values(depths, [r.rng.dead_params if r.rng else "-" for r in cells]),
                    *([depth_values(depths, [r.kernels if r.launches else "-" for r in cells])] if kernels else []),
                    Text(verdict, style=SEVERITY_STYLE.get(verdict, "")))
        print_table(console, table)
    print_unavailable(console, outcome.results)


VERDICT_STYLE = {"drawn": "green", "carried": "bold yellow", "unknown": "magenta"}


def print_rng(console: Console, label: str, rng: RngSummary, streams: bool = False,
              constants: Constants | None = None) -> None:
    status(console, esc(f"{label}: {rng_headline(rng)}", style="bold"))
    status(console, rng_cost(rng))
    for line in key_hazard_lines(rng):
        status(console, esc(line, style="bold red"))
    frozen = frozen_rng_line(constants)
    if frozen:
        status(console, esc(frozen, style="bold yellow"))
        captured = constants.frozen_rng.captured_streams
        if captured:
            table = make_table(console, None, [("captured RNG stream pattern", "left"), ("streams", "right")])
            for pattern, n in captured.items():
                add_row(table, esc(pattern, style="yellow"), n)
            print_table(console, table)
    patterns = rng.patterns
    if not patterns:
        return
    # Paths are long; the prefix they all share is said once.
    prefix = common_path_prefix([p.pattern for p in patterns])
    table = make_table(console, None, [(f"{prefix}*" if prefix else "stream pattern", "left"), ("drawn", "right"),
                                       ("carried", "right"), ("unknown", "right"), ("params", "right"),
                                       ("incr", "right")])
    for p in patterns:
        add_row(table, esc(p.pattern[len(prefix):], style=VERDICT_STYLE[p.verdict]), p.drawn, p.carried, p.unknown,
                p.dead_params, p.dead_increments)
    print_table(console, table)
    status(console, Text("params, incr: entry parameters and counter increments per step of the carried streams",
                         style="dim"))
    for p in patterns:
        if p.unknown:
            status(console, esc(f"unknown: {p.pattern}: {p.where}", style=VERDICT_STYLE["unknown"]))
    if streams:
        listed = rng.stream_list
        prefix = common_path_prefix([s.path for s in listed])
        detail = make_table(console, None, [("verdict", "left"), (f"{prefix}*" if prefix else "stream", "left"),
                                            ("incr/step", "right"), ("where", "left")])
        for s in listed:
            add_row(detail, esc(s.verdict, style=VERDICT_STYLE[s.verdict]), s.path[len(prefix):], s.increments,
                    s.where)
        print_table(console, detail)
