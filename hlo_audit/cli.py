"""Command line. Parses options, calls the pipeline, picks a formatter from one table; no analysis lives here."""

from __future__ import annotations

import os
import sys
from enum import Enum
from types import SimpleNamespace
from typing import Annotated

import typer

from hlo_audit import audit, host
from hlo_audit.errors import EXIT_INPUT_ERROR, InputError, exit_on_input_error
from hlo_audit.errors import report as report_error
from hlo_audit.files import write_output
from hlo_audit.report import frame, html, jsonfmt, junit, markdown, terminal, terminal_report, terminal_tree

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Count, normalize and diff the entry parameters of JAX programs' HLO.")

REPORT_WIDTH = 100  # report and explain views fit this many columns, on a terminal or piped

# Every command's formats: format -> the function that turns the command's view (its results, as the command
# gathered them) into the text it prints.
FORMATS = {
    "count": {
        "json": lambda v: jsonfmt.format_count(v.analyses, with_params=v.params, launches=v.launches),
        "markdown": lambda v: markdown.format_count(v.analyses, v.top, v.launches),
        "table": lambda v: terminal.render(terminal.print_count, v.analyses, v.top, v.launches),
    },
    "diff": {
        "json": lambda v: jsonfmt.format_diff(v.diff, v.old, v.new, v.launches),
        "markdown": lambda v: markdown.format_diff(v.diff, v.old, v.new, v.launches),
        "table": lambda v: terminal.render(terminal.print_diff, v.diff, v.old, v.new, v.launches),
    },
    "list": {
        "json": lambda v: jsonfmt.format_cells(v.cells, v.source),
        "markdown": lambda v: terminal.render(terminal.print_cells, v.cells),
        "table": lambda v: terminal.render(terminal.print_cells, v.cells),
    },
    "run": {
        "json": lambda v: jsonfmt.format_run(v.results, v.slopes, v.source),
        "csv": lambda v: frame.format_run_csv(v.results, v.slopes),
        "markdown": lambda v: markdown.format_run(v.results, v.slopes),
        "table": lambda v: terminal.render(terminal.print_run, v.results, v.slopes),
    },
    "scaling": {
        "json": lambda v: jsonfmt.format_scaling(v.series),
        "markdown": lambda v: markdown.format_scaling(v.series),
        "table": lambda v: terminal.render(terminal.print_scaling, v.series),
    },
    "rng": {
        "json": lambda v: jsonfmt.format_rng(v.label, v.rng, v.streams, v.constants),
        "markdown": lambda v: markdown.format_rng(v.label, v.rng, v.streams, v.constants),
        "table": lambda v: terminal.render(terminal.print_rng, v.label, v.rng, v.streams, v.constants),
    },
    "check": {
        "json": lambda v: jsonfmt.format_check(v.report),
        "markdown": lambda v: markdown.format_check(v.report),
        "table": lambda v: terminal.render(terminal.print_check, v.report, v.verbose),
    },
    "report": {
        "json": lambda v: jsonfmt.format_report(v.report),
        "csv": lambda v: frame.format_tidy_csv(v.report),
        "markdown": lambda v: markdown.format_report(v.report),
        "table": lambda v: terminal.render(terminal_report.print_report, v.report, max_width=REPORT_WIDTH),
    },
    "explain": {
        "json": lambda v: jsonfmt.format_explain(v.tree, v.captured, v.launches),
        "markdown": lambda v: markdown.format_explain(v.tree, v.captured, v.launches),
        "table": lambda v: terminal.render(terminal_tree.print_explain, v.tree, v.captured, v.launches,
                                           max_width=REPORT_WIDTH),
    },
}


def emit(command: str, fmt: Enum, **view) -> None:
    """Print the command's view in the chosen format."""
    sys.stdout.write(FORMATS[command][fmt.value](SimpleNamespace(**view)))


class Format(str, Enum):
    table = "table"
    json = "json"
    markdown = "markdown"


class RunFormat(str, Enum):
    table = "table"
    json = "json"
    csv = "csv"
    markdown = "markdown"


class DumpStage(str, Enum):
    """Which module of an --xla_dump_to folder to read (not a cell's stage)."""

    before = "before"
    after = "after"


ModuleOpt = Annotated[str | None, typer.Option("--module", help="Regex selecting the module in a dump folder "
                                               "(default: the largest jit_* module).")]
DumpStageOpt = Annotated[DumpStage, typer.Option("--stage", help="Dump stage: before or after optimizations.")]
FormatOpt = Annotated[Format, typer.Option("--format", "-f", help="Output format.")]
ConfigOpt = Annotated[str | None, typer.Option("--config", "-c", help="Config file (default: hlo-audit.toml, "
                                               "else [tool.hlo-audit] in pyproject.toml, else the built-in matrix).")]
OnlyOpt = Annotated[str | None, typer.Option("--only", help="Filter cells: key=value[,key=value...] with keys "
                                             "model, scan, quant, layers, platform, stage, id.")]
ShardOpt = Annotated[str | None, typer.Option("--shard", help="Run shard K of N (K/N) of the selected cells.")]
LayersOpt = Annotated[str | None, typer.Option("--layers", help="Depths to lower instead of the config's: "
                                               "N, 'full', or a list such as 2,4,full.")]
JobsOpt = Annotated[int, typer.Option("--jobs", "-j", min=1, help="Worker processes for lowering.")]
NoCacheOpt = Annotated[bool, typer.Option("--no-cache", help="Lower every cell again; do not read or write the cache.")]
JunitOpt = Annotated[str | None, typer.Option("--junit", help="Also write JUnit XML (one testcase per cell).")]
MarkdownOpt = Annotated[str | None, typer.Option("--markdown", help="Also write a Markdown summary (and append it "
                                                 "to $GITHUB_STEP_SUMMARY when set).")]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="List every finding, ok cells included.")]


@app.command()
@exit_on_input_error
def count(
    paths: Annotated[list[str], typer.Argument(help="HLO text files, '-' for stdin, or --xla_dump_to folders.")],
    module: ModuleOpt = None,
    stage: DumpStageOpt = DumpStage.before,
    fmt: FormatOpt = Format.table,
    top: Annotated[int, typer.Option(help="Groups to show in table/markdown (0: all).")] = 20,
    params: Annotated[bool, typer.Option("--params", help="JSON: list every entry parameter.")] = False,
) -> None:
    """Count entry parameters by dtype, role and state-path group. Exit 2 if any input could not be read."""
    analyses = audit.analyze_each(paths, module, stage.value)
    launches = [None if isinstance(a, audit.Unreadable) else audit.dump_launches(a) for a in analyses]
    emit("count", fmt, analyses=analyses, top=top, params=params, launches=launches)
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
    stage: DumpStageOpt = DumpStage.before,
    fmt: FormatOpt = Format.table,
    max_lines: Annotated[int, typer.Option(help="Lines of normalized text diff to show.")] = 200,
) -> None:
    """Diff two modules: parameters, op histogram, normalized text, verdict. Exit 1 if they differ."""
    if old == "-" and new == "-":
        raise InputError("only one of OLD and NEW can be '-' (stdin)")
    a, b = audit.analyze_input(old, module, stage.value), audit.analyze_input(new, module, stage.value)
    d = audit.diff(a, b, max_lines)
    emit("diff", fmt, diff=d, old=a.source, new=b.source,
         launches=audit.launches_diff(audit.dump_launches(a), audit.dump_launches(b)))
    raise typer.Exit(1 if d.differs else 0)


def _run(plan: audit.Plan, jobs: int, no_cache: bool) -> list:
    console = terminal.make_console(sys.stderr)
    with terminal.progress(console, len(plan.cells)) as advance:
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
    emit("list", fmt, cells=plan.cells, source=plan.config.source)


@app.command()
@exit_on_input_error
def run(config: ConfigOpt = None, only: OnlyOpt = None, shard: ShardOpt = None, layers: LayersOpt = None,
        jobs: JobsOpt = 1, no_cache: NoCacheOpt = False,
        fmt: Annotated[RunFormat, typer.Option("--format", "-f", help="Output format.")] = RunFormat.table) -> None:
    """Lower every cell and report its entry parameters. Exit 1 if any cell errors."""
    plan = audit.plan(config, only, shard, layers)
    results = _run(plan, jobs, no_cache)
    emit("run", fmt, results=results, slopes=audit.slopes_by_cell(plan, results), source=plan.config.source)
    raise typer.Exit(1 if any(r.status == "error" for r in results) else 0)


@app.command("scaling")
@exit_on_input_error
def scaling_cmd(config: ConfigOpt = None, only: OnlyOpt = None, layers: LayersOpt = None, jobs: JobsOpt = 1,
                no_cache: NoCacheOpt = False, fmt: FormatOpt = Format.table) -> None:
    """Per-layer slopes of entry parameters (by dtype and role) and the projection to full depth."""
    plan = audit.plan(config, only, None, layers)
    results = _run(plan, jobs, no_cache)
    emit("scaling", fmt, series=audit.scaling(plan, results))
    raise typer.Exit(1 if any(r.status == "error" for r in results) else 0)


@app.command()
@exit_on_input_error
def rng(
    spec: Annotated[str, typer.Argument(metavar="PATH|CELL", help="HLO file, '-', --xla_dump_to folder, or a matrix "
                                        "cell id such as llama3-8b/scan-off/int8/L32.")],
    config: ConfigOpt = None,
    module: ModuleOpt = None,
    stage: DumpStageOpt = DumpStage.before,
    fmt: FormatOpt = Format.table,
    streams: Annotated[bool, typer.Option("--streams", help="Also list every stream with its verdict.")] = False,
    no_cache: NoCacheOpt = False,
) -> None:
    """RNG streams drawn, carried (dead state: never drawn, still marshalled and counted) or unknown, and RNG keys
    written into the program as literals (they never advance)."""
    source = audit.load_source(spec, config, module, stage.value, use_cache=not no_cache)
    emit("rng", fmt, label=source.label, rng=source.rng, streams=streams, constants=source.constants)


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
    sys.stdout.write(terminal.render(terminal.print_golden_update, report, plan.config.golden_dir))
    raise typer.Exit(1 if any(why.startswith("error") for _, why in report.skipped) else 0)


def _write_outputs(report, junit_path: str | None, markdown_path: str | None) -> None:
    if junit_path:
        write_output(junit_path, junit.format_junit(report), "--junit", "hlo-audit.xml")
    summary = markdown.format_check(report)
    if markdown_path:
        write_output(markdown_path, summary, "--markdown", "hlo-audit.md")
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary:
        with open(step_summary, "a", encoding="utf-8") as handle:
            handle.write(summary)


@app.command()
@exit_on_input_error
def check(config: ConfigOpt = None, only: OnlyOpt = None, shard: ShardOpt = None, layers: LayersOpt = None,
          jobs: JobsOpt = 1, no_cache: NoCacheOpt = False, fmt: FormatOpt = Format.table, junit_path: JunitOpt = None,
          markdown_path: MarkdownOpt = None, verbose: VerboseOpt = False) -> None:
    """Compare every cell with its golden under the config's policies. Exit 1 on a regression."""
    plan = audit.plan(config, only, shard, layers)
    results = _run(plan, jobs, no_cache)
    report = audit.check(plan, results, config, report_stale=shard is None or shard.startswith("1/"))
    _write_outputs(report, junit_path, markdown_path)
    emit("check", fmt, report=report, verbose=verbose)
    raise typer.Exit(report.exit_code)


@app.command()
@exit_on_input_error
def merge(paths: Annotated[list[str], typer.Argument(help="`check --format json` outputs of the shards.")],
          fmt: FormatOpt = Format.table, junit_path: JunitOpt = None, markdown_path: MarkdownOpt = None,
          verbose: VerboseOpt = False) -> None:
    """Merge per-shard `check --format json` results into one report and exit code."""
    report = audit.merge_check_reports(paths)
    _write_outputs(report, junit_path, markdown_path)
    emit("check", fmt, report=report, verbose=verbose)
    raise typer.Exit(report.exit_code)


@app.command()
@exit_on_input_error
def report(config: ConfigOpt = None, only: OnlyOpt = None, layers: LayersOpt = None, jobs: JobsOpt = 1,
           no_cache: NoCacheOpt = False,
           fmt: Annotated[RunFormat, typer.Option("--format", "-f", help="table (the views), json (views and "
                                                  "tidy rows), csv (tidy rows) or markdown.")] = RunFormat.table,
           html_path: Annotated[str | None, typer.Option("--html", help="Also write a self-contained HTML report "
                                                         "(charts and tables) to this file.")] = None) -> None:
    """The matrix against its goldens, scan on / scan off side by side, depth scaling (cached cells are free)."""
    plan = audit.plan(config, only, None, layers)
    view = audit.report(plan, _run(plan, jobs, no_cache))
    if html_path:
        write_output(html_path, html.format_html(view), "--html", "report.html")
    emit("report", fmt, report=view)
    raise typer.Exit(1 if any(r.status == "error" for r in view.results) else 0)


@app.command()
@exit_on_input_error
def explain(
    source: Annotated[str, typer.Argument(help="A cell id (llama3-8b/scan-off/int8/L32: read from the cache, else "
                                          "lowered), an HLO text file, '-' or an --xla_dump_to folder.")],
    config: ConfigOpt = None, module: ModuleOpt = None, stage: DumpStageOpt = DumpStage.before,
    no_cache: NoCacheOpt = False,
    depth: Annotated[int, typer.Option(min=0, help="Tree levels below the root to show.")] = 3,
    top: Annotated[int, typer.Option(min=0, help="Children shown per node, largest first (0: all).")] = 8,
    fmt: FormatOpt = Format.table,
) -> None:
    """Where the entry parameters come from: a tree of path-pattern groups, largest first; and, for a step that
    closes over state, the same tree of what it captured as constants."""
    loaded = audit.load_source(source, config, module, stage.value, use_cache=not no_cache)
    tree, captured = audit.explain_trees(loaded, depth=depth, top=top)
    emit("explain", fmt, tree=tree, captured=captured, launches=loaded.launches)


def main() -> None:
    host.setup_own_process()
    app()
