"""The terminal format of every command: rich boxes on a terminal; plain aligned text when piped (and NO_COLOR
honored). The `report` command's views are in ``terminal_report``, explain's tree in ``terminal_tree``."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Sequence

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.padding import Padding
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from hlo_audit.hlo.analysis import Analysis
from hlo_audit.hlo.constants import frozen_rng
from hlo_audit.hlo.diff import ModuleDiff, captured_change
from hlo_audit.report.words import (captured_text, common_path_prefix, constants_headline, frozen_rng_line,
                                    launches_change_text, launches_headline, rng_cost, rng_headline,
                                    scalar_launch_lines)
from hlo_audit.results import worst


PIPED_WIDTH = 100


def make_console(file=None, max_width: int | None = None) -> Console:
    """A console for ``file`` (stdout): colors only on a terminal and without NO_COLOR.

    Tables fit 100 columns: piped output (CI logs, grep, a PR comment) is 100 wide unless ``COLUMNS`` says
    otherwise, and long paths wrap inside their cell instead of breaking the layout. On a terminal the
    terminal's width is used, capped at ``max_width`` when given.
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
    """A status line, summary or message: never hard-wrapped, whatever the width (scripts grep them); only
    tables and findings fit the width."""
    console.print(line, soft_wrap=True)


def make_table(console: Console, title: str, columns: Sequence[tuple[str, str]]) -> Table:
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD if console.is_terminal else None,
                  pad_edge=False, show_edge=False)
    for name, justify in columns:
        table.add_column(name, justify=justify, overflow="fold")
    return table


def print_count(console: Console, analyses: Sequence, top: int = 20, launches: Sequence | None = None) -> None:
    """Each readable module's tables (an unreadable input's error goes to stderr, from the CLI); a GPU dump's
    module, what one step launches."""
    for a, kernels in zip(analyses, launches or [None] * len(analyses)):
        if not isinstance(a, Analysis):
            continue
        s = a.summary
        status(console, Text(f"{a.source}  module {a.module.name}: {s.entry_params} entry parameters", style="bold"))
        dtypes = make_table(console, "by dtype", [("dtype", "left"), ("params", "right")])
        for dtype, n in s.by_dtype.items():
            dtypes.add_row(dtype, str(n))
        roles = make_table(console, "by role", [("role", "left"), ("params", "right"), ("bytes", "right")])
        for role, n in s.by_role.items():
            roles.add_row(role, str(n), f"{s.bytes_by_role.get(role, 0):,}")
        console.print(dtypes)
        console.print(roles)
        groups = list(s.groups.items())
        shown = groups if top <= 0 else groups[:top]
        table = make_table(console, f"groups ({len(shown)} of {len(groups)})", [("pattern", "left"), ("params", "right")])
        for pattern, n in shown:
            table.add_row(Text(pattern), str(n))
        console.print(table)
        print_constants(console, a.constants.to_record())
        print_launches(console, kernels)
        console.print()


def print_launches(console: Console, record: dict | None) -> None:
    """A GPU program's launches per step in a line, then its largest groups of scalar kernels."""
    if not record:
        return
    status(console, launches_headline(record))
    for line in scalar_launch_lines(record):
        status(console, Text(f"  {line}"))


def print_constants(console: Console, record: dict) -> None:
    """The module's constants in one line, then its large constants and (when known) the captured state by pattern."""
    console.print(constants_headline(record))
    if record["large"]:
        large = make_table(console, "large constants (the size of model state)",
                       [("name", "left"), ("form", "left"), ("shape", "left"), ("value", "left"), ("bytes", "right")])
        for c in record["large"]:
            large.add_row(c["name"], c["form"], f"{c['dtype']}[{','.join(map(str, c['dims']))}]", c["value"],
                          f"{c['bytes']:,}")
        console.print(large)
    captured = record["captured"]
    if captured:
        console.print(f"captured state (arrays the step closes over, baked in as constants): {captured_text(captured)}")
        groups = make_table(console, None, [("pattern", "left"), ("arrays", "right")])
        for pattern, n in captured["groups"].items():
            groups.add_row(Text(pattern), str(n))
        console.print(groups)


def print_diff(console: Console, d: ModuleDiff, old: str, new: str, launches: dict | None = None) -> None:
    style = {"identical": "green", "identical-after-normalization": "green",
             "rng-state-only": "yellow", "changed": "red"}[d.verdict]
    verdict = Text(f"verdict: {d.verdict}", style=f"bold {style}")
    if d.changes:
        verdict.append(f" ({', '.join(d.changes)})")
    status(console, verdict)
    status(console, f"entry parameters: {d.entry_params[0]} -> {d.entry_params[1]}  ({old} -> {new})")
    if launches:
        status(console, launches_change_text(launches))
        for line in launches["lines"][:8]:
            status(console, Text(f"  {line}", style="red" if line.startswith("+") else "green"))
    if d.by_dtype_delta or d.by_role_delta:
        deltas = make_table(console, "parameter deltas", [("by", "left"), ("key", "left"), ("delta", "right")])
        for k, v in d.by_dtype_delta.items():
            deltas.add_row("dtype", k, _signed(v))
        for k, v in d.by_role_delta.items():
            deltas.add_row("role", k, _signed(v))
        console.print(deltas)
    groups = d.params_added + d.params_removed
    if groups:
        table = make_table(console, "parameters added / removed",
                       [("delta", "right"), ("role", "left"), ("dtype", "left"), ("pattern", "left")])
        for g in groups:
            table.add_row(_signed(g.count), g.role, g.dtype, Text(g.pattern))
        console.print(table)
    if d.opcode_dtype_delta:
        ops = make_table(console, "opcode:dtype deltas", [("opcode:dtype", "left"), ("delta", "right")])
        for k, v in sorted(d.opcode_dtype_delta.items(), key=lambda kv: (-abs(kv[1]), kv[0])):
            ops.add_row(k, _signed(v))
        console.print(ops)
    if d.constants:
        console.print(f"baked-in state: {captured_change(d.constants)}")
    if d.computations_added or d.computations_removed:
        status(console, f"computations: +{len(d.computations_added)} -{len(d.computations_removed)}")
    if d.text_diff:
        status(console, Text("normalized text diff:", style="bold"))
        for line in d.text_diff:
            color = "green" if line.startswith("+") else "red" if line.startswith("-") else None
            status(console, Text(line, style=color or ""))
        if d.text_diff_omitted:
            status(console, f"... {d.text_diff_omitted} more lines (use --max-lines)")


def _signed(v: int) -> Text:
    return Text(f"{v:+d}", style="red" if v > 0 else "green")


STATUS_STYLE = {"ok": "green", "unavailable": "yellow", "error": "red"}


def dtype_counts(by_dtype: dict[str, int]) -> str:
    return " ".join(f"{k}:{v}" for k, v in by_dtype.items())


ID_MIN_WIDTH = 41  # every CPU id of the default matrix fits; a longer one wraps rather than pushing the table past 100


def keep_ids_whole(table: Table, ids) -> None:
    """Cell and series ids up to 40 characters never wrap: the other columns give way."""
    table.columns[0].min_width = min(ID_MIN_WIDTH, max((len(i) for i in ids), default=0))


def print_run(console: Console, results, slopes: dict[str, float]) -> None:
    columns = [("cell", "left"), ("status", "left"), ("params", "right"), ("by dtype", "left"), ("rng", "right"),
               ("/layer", "right"), ("dead", "right"), ("const", "right")]
    kernels = any(r.launches for r in results)  # GPU cells: launches per step (`kernels`)
    table = make_table(console, None, columns + ([("kern", "right")] if kernels else []))
    keep_ids_whole(table, [r.cell.id for r in results])
    if kernels:  # the 40-character ids still fit in 100 columns beside the count
        table.columns[0].min_width = min(table.columns[0].min_width, ID_MIN_WIDTH - 1)
    for r in results:
        slope = slopes.get(r.cell.id)
        captured = r.captured
        table.add_row(Text(r.cell.id), Text(r.status, style=STATUS_STYLE[r.status]),
                      str(r.entry_params) if r.summary else "", dtype_counts(r.summary["by_dtype"]) if r.summary else "",
                      str(r.rng_params) if r.summary else "", "" if slope is None else f"{slope:g}",
                      str(r.rng["dead_params"]) if r.rng else "", str(captured["arrays"]) if captured else "",
                      *([str(r.kernels) if r.launches else ""] if kernels else []))
    if Measurement.get(console, console.options.update_width(10_000), table).maximum > console.width:
        table.collapse_padding = True  # one space between columns rather than squeezing one to nothing
    console.print(table)
    if any(r.captured and r.captured["arrays"] for r in results):
        console.print(Text("const: arrays the step captured (closes over), baked into the program as constants "
                           "(`hlo-audit explain CELL` shows which)", style="dim"))
    # Why a cell did not lower, below the table: the reasons are long, and one reason often covers many cells.
    print_unavailable(console, results)
    for r in results:
        if r.status == "error":
            # Text(), not str: a message such as "pip install '.[te]'" must not be read as rich markup.
            status(console, Text.assemble(("error", STATUS_STYLE["error"]), f"  {r.cell.id}"))
            status(console, Text(f"    {r.message}"))
    counts = {s: sum(1 for r in results if r.status == s) for s in STATUS_STYLE}
    status(console, f"{len(results)} cells: {counts['ok']} ok, {counts['unavailable']} unavailable, "
                  f"{counts['error']} error; {sum(1 for r in results if r.cached)} from cache")


def print_unavailable(console: Console, results) -> None:
    """Why cells did not lower, and what ok cells note (a recipe lowered for an architecture it cannot run on)."""
    for kind, label in (("unavailable", "unavailable"), ("ok", "ok, noted")):
        messages: dict[str, int] = {}
        for r in results:
            if r.status == kind and r.message:
                messages[r.message] = messages.get(r.message, 0) + 1
        for message, n in messages.items():
            status(console, Text(f"{n} cells {label}: {message}", style="dim"))


def print_scaling(console: Console, series) -> None:
    table = make_table(console, None, [("series", "left"), ("depths", "left"), ("/layer", "right"),
                                   ("intercept", "right"), ("u32/L", "right"), ("rng/L", "right"),
                                   ("full", "right"), ("proj.", "right"), ("proj. u32", "right")])
    keep_ids_whole(table, [s.id for s in series])
    for s in series:
        p = s.projected()
        rng = sum(s.by_role[k].slope for k in ("rng_key", "rng_count") if k in s.by_role)
        table.add_row(Text(s.id), ",".join(map(str, s.depths)), f"{s.total.slope:g}", f"{s.total.intercept:g}",
                      f"{s.by_dtype['u32'].slope:g}" if "u32" in s.by_dtype else "0", f"{rng:g}",
                      str(p.get("layers", "")), str(p.get("entry_params", "")),
                      str(p.get("by_dtype", {}).get("u32", "")))
    console.print(table)
    launched = [s for s in series if s.launches]
    if launched:  # GPU series: kernels per step per layer, projected to full depth
        kernels = make_table(console, "kernels per step: per layer (/L) and projected to full depth", [
            ("series", "left"), ("kern/L", "right"), ("scalar/L", "right"), ("rng/L", "right"), ("coll/L", "right"),
            ("full", "right"), ("proj. kern", "right"), ("proj. rng", "right")])
        keep_ids_whole(kernels, [s.id for s in launched])
        for s in launched:
            p = s.projected().get("launches", {})
            kernels.add_row(Text(s.id), *(f"{s.launches[k].slope:g}" for k in ("total", "scalar", "reading_rng",
                                                                                 "collectives")),
                            str(s.full_depth or ""), str(p.get("total", "")), str(p.get("reading_rng", "")))
        console.print(kernels)


def print_cells(console: Console, cells) -> None:
    table = make_table(console, None, [("cell", "left"), ("model", "left"), ("scan", "left"), ("quant", "left"),
                                   ("layers", "right"), ("platform", "left")])
    keep_ids_whole(table, [c.id for c in cells])
    for c in cells:
        table.add_row(Text(c.id), Text(c.model), c.scan_label, Text(c.quant_label), str(c.layers), c.platform)
    console.print(table)
    status(console, f"{len(cells)} cells")


@contextlib.contextmanager
def progress(console: Console, total: int):
    """A progress bar on a terminal; nothing when stdout or stderr is piped (clean logs). Yields advance(label)."""
    if not console.is_terminal or not sys.stdout.isatty() or total == 0:
        yield lambda label: None
        return
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=console, transient=True)
    with bar:
        task = bar.add_task("lowering", total=total)

        def advance(label: str) -> None:
            bar.update(task, advance=1, description=label)

        yield advance


SEVERITY_STYLE = {"regression": "bold red", "error": "bold red", "improvement": "green", "advisory": "yellow",
                  "waived": "dim", "stale": "yellow", "unavailable": "dim", "ok": "green"}


def print_check(console: Console, report, verbose: bool = False) -> None:
    """One screen: the matrix by depth series, the findings that need a human (all with verbose), totals."""
    listed, folded = report.listed_and_folded(verbose)
    # A row's verdict says what is wrong with that row: folded advisories (dead RNG state, in every MaxText cell
    # today) have their own column and summary line instead.
    _print_series_summary(console, listed, report.results)
    shown = [f for f in listed if verbose or f.severity not in ("ok", "unavailable", "waived")]
    # A finding is a heading line and its message indented below: messages carry long path patterns, which
    # wrap at spaces across nearly the full width instead of being cut up inside a narrow table column.
    for f in shown:
        status(console, Text.assemble((f.severity, SEVERITY_STYLE.get(f.severity, "")), "  ", f.cell, "  ", f.rule))
        console.print(Padding(Text(f.message), (0, 0, 0, 4)))
    if folded:
        status(console, Text(report.folded_line, style=SEVERITY_STYLE["advisory"]))
    counts = report.summary_counts(verbose)
    verdict = Text("passed" if report.passed else "FAILED", style="bold green" if report.passed else "bold red")
    status(console, Text.assemble("hlo-audit check ", verdict, f": {report.cells} cells; ",
                                ", ".join(f"{n} {k}" for k, n in counts.items())))


def print_golden_update(console: Console, report, root) -> None:
    for cell_id, why in report.skipped:
        status(console, Text(f"skipped {cell_id}: {why}", style="yellow"))
    status(console, f"golden update ({root}): {len(report.written)} written, {len(report.unchanged)} unchanged, "
                  f"{len(report.skipped)} skipped, {len(report.pruned)} pruned")


def _print_series_summary(console: Console, findings, results) -> None:
    """One row per depth series (entry params and u32 at each depth, verdict); unavailable cells in one line each."""
    verdicts: dict[str, list] = {}
    for f in findings:
        verdicts.setdefault(f.cell, []).append(f)
    series: dict[tuple, list] = {}
    for r in results:
        if r.status == "ok":
            series.setdefault(r.cell.series, []).append(r)
    if series:
        kernels = any(r.launches for rows in series.values() for r in rows)
        table = make_table(console, None, [("series", "left"), ("entry params", "right"), ("u32", "right"),
                                       ("dead rng", "right"), *([("kernels", "right")] if kernels else []),
                                       ("verdict", "left")])
        for rows in series.values():
            rows.sort(key=lambda r: r.cell.layers)
            label = rows[0].cell.series_id([r.cell.layers for r in rows])
            verdict = worst([f for r in rows for f in verdicts.get(r.cell.id, [])])
            table.add_row(Text(label), " -> ".join(str(r.entry_params) for r in rows),
                          " -> ".join(str(r.count("by_dtype", "u32")) for r in rows),
                          " -> ".join(str(r.rng["dead_params"]) if r.rng else "-" for r in rows),
                          *([" -> ".join(str(r.kernels) if r.launches else "-" for r in rows)] if kernels else []),
                          Text(verdict, style=SEVERITY_STYLE.get(verdict, "")))
        console.print(table)
    print_unavailable(console, results)


VERDICT_STYLE = {"drawn": "green", "carried": "bold yellow", "unknown": "magenta"}


def print_rng(console: Console, source: str, record: dict, streams: bool = False, constants: dict | None = None) -> None:
    status(console, Text(f"{source}: {rng_headline(record)}", style="bold"))
    status(console, rng_cost(record))
    frozen = frozen_rng_line(constants)
    if frozen:
        status(console, Text(frozen, style="bold yellow"))
        captured = frozen_rng(constants)["captured_streams"]
        if captured:
            table = make_table(console, None, [("captured RNG stream pattern", "left"), ("streams", "right")])
            for pattern, n in captured.items():
                table.add_row(Text(pattern, style="yellow"), str(n))
            console.print(table)
    patterns = record["patterns"]
    if not patterns:
        return
    # Paths are long; the prefix they all share is said once so the rows fit 100 columns.
    prefix = common_path_prefix([p["pattern"] for p in patterns])
    table = make_table(console, None, [(f"{prefix}*" if prefix else "stream pattern", "left"), ("drawn", "right"),
                                   ("carried", "right"), ("unknown", "right"), ("params", "right"),
                                   ("incr", "right")])
    for p in patterns:
        verdict = "carried" if p["carried"] else "unknown" if p["unknown"] else "drawn"
        table.add_row(Text(p["pattern"][len(prefix):], style=VERDICT_STYLE[verdict]), str(p["drawn"]),
                      str(p["carried"]), str(p["unknown"]), str(p["dead_params"]), str(p["dead_increments"]))
    console.print(table)
    status(console, Text("params, incr: entry parameters and counter increments per step of the carried streams",
                       style="dim"))
    for p in patterns:
        if p["unknown"]:
            status(console, Text(f"unknown: {p['pattern']}: {p['where']}", style=VERDICT_STYLE["unknown"]))
    if streams:
        listed = record.get("stream_list", [])
        prefix = common_path_prefix([s["path"] for s in listed])
        detail = make_table(console, None, [("verdict", "left"), (f"{prefix}*" if prefix else "stream", "left"),
                                        ("incr/step", "right"), ("where", "left")])
        for s in listed:
            detail.add_row(Text(s["verdict"], style=VERDICT_STYLE[s["verdict"]]), Text(s["path"][len(prefix):]),
                           str(s["increments"]), Text(s["where"]))
        console.print(detail)
