"""Command line. Parses options, calls the pipeline, picks a formatter; no analysis lives here."""

from __future__ import annotations

import os
import sys
from enum import Enum
from typing import Annotated

import typer

from hlo_audit.errors import EXIT_INPUT_ERROR, InputError, exit_on_input_error
from hlo_audit.errors import report as report_error
from hlo_audit.hlo.analysis import Analysis, analyze
from hlo_audit.hlo.diff import diff_modules
from hlo_audit.hlo.source import read_input
from hlo_audit import audit, platforms
from hlo_audit import explain as explain_mod
from hlo_audit import matrix_report
from hlo_audit.cache import write_atomic as write_report
from hlo_audit.report import frame, jsonfmt, junit, markdown, table
from hlo_audit.report import html as report_html
from hlo_audit.report import terminal as report_terminal
from hlo_audit.report import tree as report_tree

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Count, normalize and diff the entry parameters of JAX programs' HLO.")


class Format(str, Enum):
    table = "table"
    json = "json"
    markdown = "markdown"


class Stage(str, Enum):
    before = "before"
    after = "after"


ModuleOpt = Annotated[str | None, typer.Option("--module", help="Regex selecting the module in a dump folder "
                                               "(default: the largest jit_* module).")]
StageOpt = Annotated[Stage, typer.Option("--stage", help="Dump stage: before or after optimizations.")]
FormatOpt = Annotated[Format, typer.Option("--format", "-f", help="Output format.")]


def _load(spec: str, module: str | None, stage: Stage) -> Analysis:
    text, source = read_input(spec, module, stage.value)
    return analyze(text, source)


@app.command()
@exit_on_input_error
def count(
    paths: Annotated[list[str], typer.Argument(help="HLO text files, '-' for stdin, or --xla_dump_to folders.")],
    module: ModuleOpt = None,
    stage: StageOpt = Stage.before,
    fmt: FormatOpt = Format.table,
    top: Annotated[int, typer.Option(help="Groups to show in table/markdown (0: all).")] = 20,
    params: Annotated[bool, typer.Option("--params", help="JSON: list every entry parameter.")] = False,
) -> None:
    """Count entry parameters by dtype, role and state-path group. Exit 2 if any input could not be read."""
    analyses = audit.analyze_each(paths, module, stage.value)
    if fmt is Format.json:
        sys.stdout.write(jsonfmt.format_count(analyses, with_params=params))
    elif fmt is Format.markdown:
        sys.stdout.write(markdown.format_count(analyses, top))
    else:
        table.print_count(table.make_console(), analyses, top)
    unreadable = [a for a in analyses if isinstance(a, audit.Unreadable)]
    for a in unreadable:
        report_error(a.error)
    raise typer.Exit(EXIT_INPUT_ERROR if unreadable else 0)


@app.command()
@exit_on_input_error
def diff(
    old: Annotated[str, typer.Argument(help="Old module: file, '-' or dump folder.")],
    new: Annotated[str, typer.Argument(help="New module: file, '-' or dump folder.")],
    module: ModuleOpt = None,
    stage: StageOpt = Stage.before,
    fmt: FormatOpt = Format.table,
    max_lines: Annotated[int, typer.Option(help="Lines of normalized text diff to show.")] = 200,
) -> None:
    """Diff two modules: parameters, op histogram, normalized text, verdict. Exit 1 if they differ."""
    if old == "-" and new == "-":
        raise InputError("only one of OLD and NEW can be '-' (stdin)")
    a, b = _load(old, module, stage), _load(new, module, stage)
    d = diff_modules(a, b, max_text_lines=max_lines)
    if fmt is Format.json:
        sys.stdout.write(jsonfmt.format_diff(d, a.source, b.source))
    elif fmt is Format.markdown:
        sys.stdout.write(markdown.format_diff(d, a.source, b.source))
    else:
        table.print_diff(table.make_console(), d, a.source, b.source)
    raise typer.Exit(1 if d.differs else 0)


ConfigOpt = Annotated[str | None, typer.Option("--config", "-c", help="Config file (default: hlo-audit.toml, "
                                               "else [tool.hlo-audit] in pyproject.toml, else the built-in matrix).")]
OnlyOpt = Annotated[str | None, typer.Option("--only", help="Filter cells: key=value[,key=value...] with keys "
                                             "model, scan, quant, layers, platform, stage, id.")]
ShardOpt = Annotated[str | None, typer.Option("--shard", help="Run shard K of N (K/N) of the selected cells.")]
LayersOpt = Annotated[str | None, typer.Option("--layers", help="Depths to lower instead of the config's: "
                                               "N, 'full', or a list such as 2,4,full.")]
JobsOpt = Annotated[int, typer.Option("--jobs", "-j", min=1, help="Worker processes for lowering.")]
NoCacheOpt = Annotated[bool, typer.Option("--no-cache", help="Lower every cell again; do not read or write the cache.")]


REPORT_WIDTH = 100  # report and explain views fit this many columns, on a terminal or piped


class RunFormat(str, Enum):
    table = "table"
    json = "json"
    csv = "csv"
    markdown = "markdown"


def _run(plan: audit.Plan, jobs: int, no_cache: bool) -> list:
    console = table.make_console(sys.stderr)
    with table.progress(console, len(plan.cells)) as advance:
        results = []
        for result in audit.execute(plan, jobs=jobs, use_cache=not no_cache):
            results.append(result)
            advance(result.cell.id)
    order = {c.id: i for i, c in enumerate(plan.cells)}
    return sorted(results, key=lambda r: order[r.cell.id])


@app.command("list")
@exit_on_input_error
def list_cells(config: ConfigOpt = None, only: OnlyOpt = None, shard: ShardOpt = None, layers: LayersOpt = None,
               fmt: FormatOpt = Format.table) -> None:
    """List the matrix cells the config expands to."""
    plan = audit.plan(config, only, shard, layers)
    if fmt is Format.json:
        sys.stdout.write(jsonfmt.format_cells(plan.cells, plan.config.source))
    else:
        table.print_cells(table.make_console(), plan.cells)


@app.command()
@exit_on_input_error
def run(config: ConfigOpt = None, only: OnlyOpt = None, shard: ShardOpt = None, layers: LayersOpt = None,
        jobs: JobsOpt = 1, no_cache: NoCacheOpt = False,
        fmt: Annotated[RunFormat, typer.Option("--format", "-f", help="Output format.")] = RunFormat.table) -> None:
    """Lower every cell and report its entry parameters. Exit 1 if any cell errors."""
    plan = audit.plan(config, only, shard, layers)
    results = _run(plan, jobs, no_cache)
    slopes = {c.id: s.total.slope for s in audit.scaling(plan, results) for c in plan.cells if c.series == s.cell.series}
    if fmt is RunFormat.json:
        sys.stdout.write(jsonfmt.format_run(results, slopes, plan.config.source))
    elif fmt is RunFormat.csv:
        sys.stdout.write(frame.format_run_csv(results, slopes))
    elif fmt is RunFormat.markdown:
        sys.stdout.write(markdown.format_run(results, slopes))
    else:
        table.print_run(table.make_console(), results, slopes)
    raise typer.Exit(1 if any(r.status == "error" for r in results) else 0)


@app.command("scaling")
@exit_on_input_error
def scaling_cmd(config: ConfigOpt = None, only: OnlyOpt = None, layers: LayersOpt = None, jobs: JobsOpt = 1,
                no_cache: NoCacheOpt = False, fmt: FormatOpt = Format.table) -> None:
    """Per-layer slopes of entry parameters (by dtype and role) and the projection to full depth."""
    plan = audit.plan(config, only, None, layers)
    results = _run(plan, jobs, no_cache)
    series = audit.scaling(plan, results)
    if fmt is Format.json:
        sys.stdout.write(jsonfmt.format_scaling(series))
    elif fmt is Format.markdown:
        sys.stdout.write(markdown.format_scaling(series))
    else:
        table.print_scaling(table.make_console(), series)
    raise typer.Exit(1 if any(r.status == "error" for r in results) else 0)


@app.command()
@exit_on_input_error
def rng(
    spec: Annotated[str, typer.Argument(metavar="PATH|CELL", help="HLO file, '-', --xla_dump_to folder, or a matrix "
                                        "cell id such as llama3-8b/scan-off/int8/L32.")],
    config: ConfigOpt = None,
    module: ModuleOpt = None,
    stage: StageOpt = Stage.before,
    fmt: FormatOpt = Format.table,
    streams: Annotated[bool, typer.Option("--streams", help="Also list every stream with its verdict.")] = False,
    no_cache: NoCacheOpt = False,
) -> None:
    """RNG streams drawn, carried (dead state: never drawn, still marshalled and counted) or unknown, and RNG keys
    written into the program as literals (they never advance)."""
    source = audit.load_source(spec, config, module, stage.value, use_cache=not no_cache)
    if fmt is Format.json:
        sys.stdout.write(jsonfmt.format_rng(source.label, source.rng, streams, source.constants))
    elif fmt is Format.markdown:
        sys.stdout.write(markdown.format_rng(source.label, source.rng, streams, source.constants))
    else:
        table.print_rng(table.make_console(), source.label, source.rng, streams, source.constants)


golden_app = typer.Typer(no_args_is_help=True, help="Golden HLO: regenerate what `check` compares against.")
app.add_typer(golden_app, name="golden")


@golden_app.command("update")
@exit_on_input_error
def golden_update(config: ConfigOpt = None, only: OnlyOpt = None, layers: LayersOpt = None, jobs: JobsOpt = 1,
                  no_cache: NoCacheOpt = False,
                  prune: Annotated[bool, typer.Option("--prune", help="Delete goldens of cells no longer in the "
                                                      "matrix.")] = False) -> None:
    """Regenerate goldens atomically: all cells are lowered first; a failing cell writes nothing."""
    plan = audit.plan(config, only, None, layers)
    results = _run(plan, jobs, no_cache)
    report = audit.update_goldens(plan, results, prune=prune)
    table.print_golden_update(table.make_console(), report, plan.config.golden_dir)
    raise typer.Exit(1 if any(why.startswith("error") for _, why in report.skipped) else 0)


def _write_outputs(findings, results, exit_code: int, junit_path: str | None, markdown_path: str | None) -> None:
    if junit_path:
        write_report(junit_path, junit.format_junit(findings))
    summary = markdown.format_check(findings, exit_code)
    if markdown_path:
        write_report(markdown_path, summary)
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary:
        with open(step_summary, "a", encoding="utf-8") as handle:
            handle.write(summary)


def _print_check(fmt: Format, findings, results, exit_code: int, verbose: bool) -> None:
    if fmt is Format.json:
        sys.stdout.write(jsonfmt.format_check(findings, results, exit_code))
    elif fmt is Format.markdown:
        sys.stdout.write(markdown.format_check(findings, exit_code))
    else:
        table.print_check(table.make_console(), findings, results, exit_code, verbose)


JunitOpt = Annotated[str | None, typer.Option("--junit", help="Also write JUnit XML (one testcase per cell).")]
MarkdownOpt = Annotated[str | None, typer.Option("--markdown", help="Also write a Markdown summary (and append it "
                                                 "to $GITHUB_STEP_SUMMARY when set).")]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="List every finding, ok cells included.")]


@app.command()
@exit_on_input_error
def check(config: ConfigOpt = None, only: OnlyOpt = None, shard: ShardOpt = None, layers: LayersOpt = None,
          jobs: JobsOpt = 1, no_cache: NoCacheOpt = False, fmt: FormatOpt = Format.table, junit_path: JunitOpt = None,
          markdown_path: MarkdownOpt = None, verbose: VerboseOpt = False) -> None:
    """Compare every cell with its golden under the config's policies. Exit 1 on a regression."""
    plan = audit.plan(config, only, shard, layers)
    results = _run(plan, jobs, no_cache)
    report = audit.check(plan, results, config, report_stale=shard is None or shard.startswith("1/"))
    _write_outputs(report.findings, results, report.exit_code, junit_path, markdown_path)
    _print_check(fmt, report.findings, results, report.exit_code, verbose)
    raise typer.Exit(report.exit_code)


@app.command()
@exit_on_input_error
def merge(paths: Annotated[list[str], typer.Argument(help="`check --format json` outputs of the shards.")],
          fmt: FormatOpt = Format.table, junit_path: JunitOpt = None, markdown_path: MarkdownOpt = None,
          verbose: VerboseOpt = False) -> None:
    """Merge per-shard `check --format json` results into one report and exit code."""
    findings, results = audit.merge_check_reports(paths)
    exit_code = 1 if any(f.failing for f in findings) else 0
    _write_outputs(findings, results, exit_code, junit_path, markdown_path)
    _print_check(fmt, findings, results, exit_code, verbose)
    raise typer.Exit(exit_code)


@app.command()
@exit_on_input_error
def report(config: ConfigOpt = None, only: OnlyOpt = None, layers: LayersOpt = None, jobs: JobsOpt = 1,
           no_cache: NoCacheOpt = False,
           fmt: Annotated[RunFormat, typer.Option("--format", "-f", help="table (the views), json (views and "
                                                  "tidy rows), csv (tidy rows) or markdown.")] = RunFormat.table,
           html: Annotated[str | None, typer.Option("--html", help="Also write a self-contained HTML report "
                                                    "(charts and tables) to this file.")] = None) -> None:
    """The matrix against its goldens, scan on / scan off side by side, depth scaling (cached cells are free)."""
    plan = audit.plan(config, only, None, layers)
    view = matrix_report.build(plan, _run(plan, jobs, no_cache))
    if html:
        report_html.write_html(html, view)
    if fmt is RunFormat.json:
        sys.stdout.write(jsonfmt.format_report(view))
    elif fmt is RunFormat.csv:
        sys.stdout.write(frame.format_tidy_csv(view.cells))
    elif fmt is RunFormat.markdown:
        sys.stdout.write(markdown.format_report(view))
    else:
        report_terminal.print_report(table.make_console(max_width=REPORT_WIDTH), view)
    raise typer.Exit(1 if any(r.status == "error" for r in view.results) else 0)


@app.command()
@exit_on_input_error
def explain(
    source: Annotated[str, typer.Argument(help="A cell id (llama3-8b/scan-off/int8/L32: read from the cache, else "
                                          "lowered), an HLO text file, '-' or an --xla_dump_to folder.")],
    config: ConfigOpt = None, module: ModuleOpt = None, stage: StageOpt = Stage.before, no_cache: NoCacheOpt = False,
    depth: Annotated[int, typer.Option(min=0, help="Tree levels below the root to show.")] = 3,
    top: Annotated[int, typer.Option(min=0, help="Children shown per node, largest first (0: all).")] = 8,
    fmt: FormatOpt = Format.table,
) -> None:
    """Where the entry parameters come from: a tree of path-pattern groups, largest first; and, for a step that
    closes over state, the same tree of what it captured as constants."""
    label, params, captured = explain_mod.load_params(source, config, module, stage.value, use_cache=not no_cache)
    tree = explain_mod.explain(params, label, depth=depth, top=top)
    captured_tree = explain_mod.explain(captured, f"{label} captured", depth=depth, top=top) if captured else None
    if fmt is Format.json:
        sys.stdout.write(jsonfmt.format_explain(tree, captured_tree))
    elif fmt is Format.markdown:
        sys.stdout.write(markdown.format_explain(tree, captured_tree))
    else:
        report_tree.print_explain(table.make_console(max_width=REPORT_WIDTH), tree, captured_tree)


def main() -> None:
    platforms.setup_own_process()
    app()
