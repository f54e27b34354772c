"""Command line. Parses options, calls the pipeline, picks a formatter from one table; no analysis lives here."""

from __future__ import annotations

import os
import sys
from enum import Enum
from types import SimpleNamespace
from typing import Annotated

import typer

from hlo_audit import __version__, audit, host, progress, scaffold, stack, streams, termination
from hlo_audit import merge as merge_reader
from hlo_audit.errors import (
    EXIT_DIFFERENCE,
    EXIT_INPUT_ERROR,
    EXIT_OK,
    InputError,
    OneLineUsageErrors,
    exit_on_input_error,
    print_error,
    warn,
)
from hlo_audit.files import append_output, check_output, check_output_folder, working_directory, write_output
from hlo_audit.report import (
    accepting,
    frame,
    html,
    jsonfmt,
    junit,
    markdown,
    measure_view,
    measure_words,
    terminal,
    terminal_report,
    terminal_tree,
)
from hlo_audit.report.words import init_next_line, recorded_inputs_lines

# Help texts are Markdown, not rich markup: they name TOML tables such as [tool.hlo-audit] and [[waive]], which
# rich markup would read as tags and drop; Markdown keeps them, and wraps at spaces only (hlo-audit.toml whole).
app = typer.Typer(cls=OneLineUsageErrors, add_completion=False, no_args_is_help=True,
                  pretty_exceptions_enable=False, rich_markup_mode="markdown",
                  help="Count, normalize and diff the entry parameters of JAX programs' HLO; gate on them against "
                       "committed goldens.\n\nExit codes: 0 clean; 1 a difference, a regression or a failing cell "
                       "(rng: dead RNG state found), nothing else; 2 a usage, input or environment error (a closed "
                       "stdout, a JAX_*/XLA_FLAGS value jax or XLA refuses), said in one line on stderr; 130, 143, 129 "
                       "stopped by SIGINT, SIGTERM, SIGHUP.")

REPORT_WIDTH = 100  # report and explain views aim at this many columns, on a terminal or piped


def _print_version(value: bool) -> None:
    if value:
        print(f"hlo-audit {__version__}")
        raise typer.Exit(EXIT_OK)


@app.callback()
def _main(ctx: typer.Context,
          version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                                help="Print hlo-audit's version and exit.")] = False) -> None:
    # Pinned or local is read before any target is imported: code under test cannot set it (stack.read_at_start).
    stack.read_at_start()
    ctx.call_on_close(stack.forget_start)

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
        "markdown": lambda v: markdown.format_cells(v.cells),
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
        "json": lambda v: jsonfmt.format_check(v.outcome),
        "markdown": lambda v: markdown.format_check(v.outcome),
        "table": lambda v: terminal.render(terminal.print_check, v.outcome, v.verbose),
    },
    "report": {
        "json": lambda v: jsonfmt.format_report(v.view),
        "csv": lambda v: frame.format_tidy_csv(v.view),
        "markdown": lambda v: markdown.format_report(v.view),
        "table": lambda v: terminal.render(terminal_report.print_report, v.view, max_width=REPORT_WIDTH),
    },
    "measure": {
        "json": lambda v: jsonfmt.format_measure(v.report),
        "markdown": lambda v: measure_view.format_markdown(v.report),
        "table": lambda v: terminal.render(measure_view.print_measure, v.report, max_width=REPORT_WIDTH),
    },
    "explain": {
        "json": lambda v: jsonfmt.format_explain(v.tree, v.captured, v.launches, v.against),
        "markdown": lambda v: markdown.format_explain(v.tree, v.captured, v.launches, v.against),
        "table": lambda v: terminal.render(terminal_tree.print_explain, v.tree, v.captured, v.launches, v.against,
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
                                               "else [tool.hlo-audit] in pyproject.toml, else the built-in matrix). "
                                               "Check's rules and waivers are [policy] and [[waive]] in "
                                               "hlo-audit.toml, [tool.hlo-audit.policy] and "
                                               "[[tool.hlo-audit.waive]] in pyproject.toml.")]
OnlyOpt = Annotated[list[str] | None, typer.Option("--only", metavar="KEY=VALUE[,...]",
                                                   help="Filter cells: key=value[,key=value...] with keys "
                                                   "model, scan, quant, quant_mode, layers, step, platform, "
                                                   "topology, cuda_arch, stage, target, id. A key given twice "
                                                   "matches either value; different keys must all match. "
                                                   "Repeated --only options combine the same way, as if joined "
                                                   "by commas.")]
ShardOpt = Annotated[str | None, typer.Option("--shard", help="Run shard K of N (K/N) of the selected cells.")]
LayersOpt = Annotated[str | None, typer.Option("--layers", help="Depths to lower instead of the config's: "
                                               "N, 'full', or a list such as 2,4,full.")]
JobsOpt = Annotated[int, typer.Option("--jobs", "-j", min=1, help="Worker processes for lowering.")]
NoCacheOpt = Annotated[bool, typer.Option("--no-cache", help="Lower every cell again; do not read or write the cache.")]
RefreshOpt = Annotated[bool, typer.Option("--refresh", help="Lower every cell again and rewrite its cache entry.")]
JunitOpt = Annotated[str | None, typer.Option("--junit", help="Also write JUnit XML (one testcase per cell) to this "
                                             "file, '-' (stdout), a device or a FIFO.")]
MarkdownOpt = Annotated[str | None, typer.Option("--markdown", help="Also write a Markdown summary to this file, "
                                                 "'-', a device or a FIFO. The summary is appended to "
                                                 "$GITHUB_STEP_SUMMARY whenever that is set (a warning, never "
                                                 "a failure, when it cannot be).")]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="List every finding, ok cells included, and the "
                                          "warnings jax gives for what the step chose (a donated buffer it cannot "
                                          "use), which are left out otherwise.")]


@app.command()
@exit_on_input_error
def count(
    paths: Annotated[list[str], typer.Argument(help="HLO text files, '-' for stdin, or --xla_dump_to folders.")],
    module: ModuleOpt = None,
    stage: DumpStageOpt = DumpStage.before,
    fmt: FormatOpt = Format.table,
    top: Annotated[int, typer.Option(min=0, help="Groups to show in table/markdown (0: all).")] = 20,
    params: Annotated[bool, typer.Option("--params", help="JSON: list every entry parameter.")] = False,
) -> None:
    """Count entry parameters by dtype, role and state-path group. Exit 2 if any input could not be read."""
    counted = audit.count_inputs(paths, module, stage.value)
    emit("count", fmt, analyses=list(counted.analyses), top=top, params=params, launches=list(counted.launches))
    for a in counted.unreadable:
        print_error(a.error)
    raise typer.Exit(counted.exit_code)


@app.command()
@exit_on_input_error
def diff(
    old: Annotated[str, typer.Argument(help="Old module: file, '-' or dump folder.")],
    new: Annotated[str, typer.Argument(help="New module: file, '-' or dump folder.")],
    module: ModuleOpt = None,
    stage: DumpStageOpt = DumpStage.before,
    fmt: FormatOpt = Format.table,
    text: Annotated[bool, typer.Option("--text", help="Also show the normalized text diff (--max-lines).")] = False,
    max_lines: Annotated[int, typer.Option(min=0, help="Lines of normalized text diff --text shows.")] = 200,
) -> None:
    """Diff two modules: the verdict, every change named with its place, parameters, op histogram; the normalized text
    on request (--text). Exit 1 if the programs differ (renamed-only is the same program: exit 0)."""
    if old == "-" and new == "-":
        raise InputError("only one of OLD and NEW can be '-' (stdin)")
    d = audit.diff_inputs(old, new, module, stage.value, max_lines if text else 0)
    emit("diff", fmt, diff=d.structural, old=d.old, new=d.new, launches=d.launches)
    raise typer.Exit(d.exit_code)


def _only(only: list[str] | None) -> str | None:
    """Repeated --only options as one filter: joined by commas (a key given twice matches either value)."""
    return ",".join(only) if only else None


@app.command("list")
@exit_on_input_error
def list_cells(config: ConfigOpt = None, only: OnlyOpt = None, shard: ShardOpt = None, layers: LayersOpt = None,
               fmt: FormatOpt = Format.table) -> None:
    """List the matrix cells the config expands to."""
    plan = audit.plan(config, _only(only), shard, layers)
    emit("list", fmt, cells=plan.cells, source=plan.config.source)


@app.command()
@exit_on_input_error
def run(config: ConfigOpt = None, only: OnlyOpt = None, shard: ShardOpt = None, layers: LayersOpt = None,
        jobs: JobsOpt = 1, no_cache: NoCacheOpt = False, refresh: RefreshOpt = False,
        fmt: Annotated[RunFormat, typer.Option("--format", "-f", help="Output format.")] = RunFormat.table) -> None:
    """Lower every cell and report its entry parameters. Exit 1 if any cell errors."""
    plan = audit.plan(config, _only(only), shard, layers)
    ran = audit.lowered(plan, progress.run_shown(plan, jobs, not no_cache, refresh))
    emit("run", fmt, results=ran.results, slopes=ran.slopes, source=plan.config.source)
    raise typer.Exit(ran.exit_code)


@app.command("scaling")
@exit_on_input_error
def scaling_cmd(config: ConfigOpt = None, only: OnlyOpt = None, layers: LayersOpt = None, jobs: JobsOpt = 1,
                no_cache: NoCacheOpt = False, refresh: RefreshOpt = False, fmt: FormatOpt = Format.table) -> None:
    """Per-layer slopes of entry parameters (by dtype and role) and the projection to full depth. Exit 1 if any
    cell errors; 2 when there is nothing to fit (every cell unavailable here, or no series of two or more
    depths)."""
    plan = audit.plan(config, _only(only), None, layers)
    fitted = audit.scaling_of(plan, progress.run_shown(plan, jobs, not no_cache, refresh))
    emit("scaling", fmt, series=fitted.series)
    raise typer.Exit(fitted.exit_code)


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
    refresh: RefreshOpt = False,
) -> None:
    """RNG streams drawn, carried (dead state: never drawn, still marshalled and counted) or unknown, RNG keys
    written into the program as literals (they never advance), and keys drawn from twice without a split. Exit 1
    when any stream is carried (dead RNG state) or any key is literal or reused, 0 when none is, 2 on bad input."""
    program = audit.load_program(spec, config, module, stage.value, use_cache=not no_cache, refresh=refresh)
    emit("rng", fmt, label=program.label, rng=program.rng, streams=streams, constants=program.constants)
    raise typer.Exit(program.rng.exit_code)


golden_app = typer.Typer(no_args_is_help=True, help="Golden HLO: regenerate what `check` compares against.")
app.add_typer(golden_app, name="golden")


@golden_app.command("update")
@exit_on_input_error
def golden_update(config: ConfigOpt = None, only: OnlyOpt = None, layers: LayersOpt = None, jobs: JobsOpt = 1,
                  no_cache: NoCacheOpt = False, refresh: RefreshOpt = False,
                  prune: Annotated[bool, typer.Option("--prune", help="Delete goldens of cells no longer in the "
                                                      "matrix.")] = False,
                  failing: Annotated[bool, typer.Option("--failing", help="Accept exactly the cells that failed in "
                                                        "the last `check` (its report, kept in cache_dir).")] = False
                  ) -> None:
    """Regenerate goldens atomically: all cells are lowered first; a failing cell writes nothing."""
    if not failing:
        raise typer.Exit(_golden_update(audit.plan(config, _only(only), None, layers), jobs, no_cache, prune, refresh))
    plan, accept = audit.failing_plan(config, given=bool(only or layers))
    if accept is None:
        print(accepting.nothing_failing_line())
        raise typer.Exit(EXIT_OK)
    print(f"hlo-audit: {accepting.accepting_line(accept)}", file=sys.stderr)
    raise typer.Exit(_golden_update(plan, jobs, no_cache, prune, refresh))


def _golden_update(plan: audit.Plan, jobs: int, no_cache: bool, prune: bool = False, refresh: bool = False) -> int:
    """Lower the plan's cells, write their goldens, print what was written; the exit code (1: a cell failed)."""
    audit.goldens_writable(plan)
    results = progress.run_shown(plan, jobs, not no_cache, refresh)
    update = audit.update_goldens(plan, results, prune=prune)
    sys.stdout.write(terminal.render(terminal.print_golden_update, update, plan.config.golden_dir, results))
    return update.exit_code


# The report files check and merge write besides stdout: option, and what a path names (for messages).
REPORT_FILES = (("--junit", "hlo-audit.xml"), ("--markdown", "hlo-audit.md"))


def _write_outputs(outcome, junit_path: str | None, markdown_path: str | None) -> None:
    """The report files asked for, then the job summary: a summary that cannot be appended is a warning, and the
    gate's verdict and exit code stand."""
    if junit_path:
        write_output(junit_path, junit.format_junit(outcome), "--junit", "hlo-audit.xml")
    summary = markdown.format_check(outcome)
    if markdown_path:
        write_output(markdown_path, summary, "--markdown", "hlo-audit.md")
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary:
        problem = append_output(step_summary, summary)
        if problem:
            warn(f"GITHUB_STEP_SUMMARY={step_summary}: {problem}; the job summary was not written")


@app.command()
@exit_on_input_error
def check(config: ConfigOpt = None, only: OnlyOpt = None, shard: ShardOpt = None, layers: LayersOpt = None,
          jobs: JobsOpt = 1, no_cache: NoCacheOpt = False, refresh: RefreshOpt = False, fmt: FormatOpt = Format.table,
          junit_path: JunitOpt = None, markdown_path: MarkdownOpt = None, verbose: VerboseOpt = False,
          explain_cache: Annotated[bool, typer.Option("--explain-cache", help="Also list, on stderr, what each cell's "
                                                      "cached lowering read (what must hold to serve it).")] = False,
          changes: Annotated[str | None, typer.Option("--changes", metavar="PATCH", help="The pull request's unified "
                                                      "diff (git diff BASE...HEAD; - for stdin): say which changed "
                                                      "lines each cell's lowering reached, and which none did "
                                                      "(policy unreached).")] = None,
          ) -> None:
    """Compare every cell with its golden under the config's policies. Exit 1 on a regression.

    Rules are set under [policy] and waivers as [[waive]] tables in hlo-audit.toml ([tool.hlo-audit.policy] and
    [[tool.hlo-audit.waive]] in pyproject.toml)."""
    plan = audit.plan(config, _only(only), shard, layers)
    for path, (option, example) in zip((junit_path, markdown_path), REPORT_FILES):
        if path:  # refuse report paths that can never be written (a folder...) before any cell runs
            check_output(path, option, example)
    changed = audit.read_changes(changes, sys.stdin) if changes is not None else None  # before any cell runs
    results = progress.run_shown(plan, jobs, not no_cache, refresh)
    outcome = audit.check(plan, results, config, report_stale=shard is None or shard.startswith("1/"),
                          changes=changed)
    progress.judged_shown(outcome)
    emit("check", fmt, outcome=outcome, verbose=verbose)
    _write_outputs(outcome, junit_path, markdown_path)
    if (problem := audit.keep_check(plan, outcome)) is not None:
        warn(f"the check's report was not kept for `golden update --failing`: {problem}")
    if explain_cache:
        for line in recorded_inputs_lines(audit.recorded_inputs(plan)):
            typer.echo(line, err=True)
    raise typer.Exit(outcome.exit_code)


@app.command()
@exit_on_input_error
def merge(paths: Annotated[list[str], typer.Argument(help="`check --format json` outputs of the shards.")],
          fmt: FormatOpt = Format.table, junit_path: JunitOpt = None, markdown_path: MarkdownOpt = None,
          verbose: VerboseOpt = False) -> None:
    """Merge per-shard `check --format json` results into one report and exit code."""
    for path, (option, example) in zip((junit_path, markdown_path), REPORT_FILES):
        if path:
            check_output(path, option, example)
    outcome = merge_reader.merge_check_reports(paths)
    emit("check", fmt, outcome=outcome, verbose=verbose)
    _write_outputs(outcome, junit_path, markdown_path)
    raise typer.Exit(outcome.exit_code)


@app.command()
@exit_on_input_error
def report(config: ConfigOpt = None, only: OnlyOpt = None, layers: LayersOpt = None, jobs: JobsOpt = 1,
           no_cache: NoCacheOpt = False, refresh: RefreshOpt = False,
           fmt: Annotated[RunFormat, typer.Option("--format", "-f", help="table (the views), json (views and "
                                                  "tidy rows), csv (tidy rows) or markdown.")] = RunFormat.table,
           html_path: Annotated[str | None, typer.Option("--html", help="Also write a self-contained HTML report "
                                                         "(charts and tables) to this file.")] = None) -> None:
    """The matrix against its goldens, scan on / scan off side by side, depth scaling (cached cells are free)."""
    plan = audit.plan(config, _only(only), None, layers)
    if html_path:
        check_output(html_path, "--html", "report.html")
    view = audit.report(plan, progress.run_shown(plan, jobs, not no_cache, refresh))
    emit("report", fmt, view=view)
    if html_path:
        write_output(html_path, html.format_html(view), "--html", "report.html")
    raise typer.Exit(view.exit_code)


@app.command()
@exit_on_input_error
def explain(
    source: Annotated[str, typer.Argument(help="A cell id (llama3-8b/scan-off/int8/L32: read from the cache, else "
                                          "lowered), an HLO text file, '-' or an --xla_dump_to folder.")],
    config: ConfigOpt = None, module: ModuleOpt = None, stage: DumpStageOpt = DumpStage.before,
    no_cache: NoCacheOpt = False,
    refresh: RefreshOpt = False,
    depth: Annotated[int, typer.Option(min=0, help="Tree levels below the root to show.")] = 3,
    top: Annotated[int, typer.Option(min=0, help="Children shown per node, largest first (0: all).")] = 8,
    fmt: FormatOpt = Format.table,
) -> None:
    """Where the entry parameters come from: a tree of path-pattern groups, largest first; and, for a step that
    closes over state, the same tree of what it captured as constants."""
    loaded = audit.load_program(source, config, module, stage.value, use_cache=not no_cache, refresh=refresh)
    tree, captured = audit.explain_trees(loaded, depth=depth, top=top)
    emit("explain", fmt, tree=tree, captured=captured, launches=loaded.launches, against=loaded.against)


_ROUNDS, _CALLS = audit.measuring.ROUNDS_RANGE, audit.measuring.CALLS_RANGE
_WARMUP, _HOST_CALLS = audit.measuring.WARMUP_RANGE, audit.measuring.HOST_CALLS_RANGE


@app.command("measure")
@exit_on_input_error
def measure_cmd(
    cells: Annotated[list[str] | None, typer.Argument(metavar="[CELL]...", help="Cell ids to measure (default: "
                                                      "every cell --only selects).")] = None,
    config: ConfigOpt = None, only: OnlyOpt = None, layers: LayersOpt = None,
    rounds: Annotated[int, typer.Option(min=_ROUNDS[0], max=_ROUNDS[1], help="Rounds, interleaved across the "
                                        "cells compared.")] = 3,
    calls: Annotated[int, typer.Option(min=_CALLS[0], max=_CALLS[1], help="Timed calls per loop (blocked, then "
                                       "queued) per round.")] = 20,
    warmup: Annotated[int, typer.Option(min=_WARMUP[0], max=_WARMUP[1], help="Untimed calls before each round.")]
    = 3,
    host_calls: Annotated[int, typer.Option(min=_HOST_CALLS[0], max=_HOST_CALLS[1], help="Calls per round of the "
                                            "trivial-body twin that times the host's work per call.")] = 50,
    across: Annotated[str, typer.Option(help="The axis A/B compares across: cells equal but in it are measured "
                                        "together, each against the group's baseline.")] = "quant",
    baseline: Annotated[str | None, typer.Option(help="The value of --across each group is compared with "
                                                 "(default: none, where a group has it).")] = None,
    host_only: Annotated[bool, typer.Option("--host-only", help="Only the host figure (no step run at the "
                                            "cell's sizes): what the host_cost rule gates, on any machine.")] = False,
    record: Annotated[bool, typer.Option("--record", help="Write each cell's host figure (and timing) into its "
                                         "golden summary: what the host_cost rule compares against.")] = False,
    save_compiled: Annotated[str | None, typer.Option("--save-compiled", metavar="FOLDER", help="Write each "
                                                      "timed step's compiled module here (CELL with / as __).")]
    = None,
    fmt: FormatOpt = Format.table,
) -> None:
    """Run cells' steps here (TPU, GPU or CPU) and time them: step time blocked and queued, host time per call of the
    function the user calls, compile time, memory; A/B across a variant axis in interleaved rounds, with a verdict
    only beyond the rounds' spread. The host figures are judged as `check` judges them (the config's policy and
    waivers): exit 1 when the host_cost rule fails a cell (more state leaves per call than its golden's recorded
    figure), or a cell could not be measured."""
    selection = [*(only or []), *([",".join(f"id={c}" for c in cells)] if cells else [])]
    plan = audit.plan(config, _only(selection or None), None, layers)
    report = audit.measure(plan, audit.measuring.Rounds(rounds, warmup, calls, host_calls), across, baseline,
                           timing=not host_only, record=record,
                           save_text=_compiled_writer(save_compiled) if save_compiled is not None else None,
                           measured=lambda row: print(measure_words.measured_line(row), file=sys.stderr, flush=True),
                           config_path=config)
    emit("measure", fmt, report=report)
    raise typer.Exit(report.exit_code)


def _compiled_writer(folder: str):
    import pathlib  # noqa: PLC0415

    check_output_folder(folder, "--save-compiled")  # before any cell runs; the folder is made at the first write
    root = pathlib.Path(folder)
    return lambda cell_id, text: write_output(root / (cell_id.replace("/", "__") + ".hlo.txt"), text,
                                              "--save-compiled", "compiled")


@app.command()
@exit_on_input_error
def lower(
    cell: Annotated[str, typer.Argument(metavar="CELL", help="A cell id of the config's matrix, at any depth of its "
                                        "series, e.g. llama3-8b/scan-off/int8/L32.")],
    output: Annotated[str | None, typer.Option("--output", "-o", metavar="FILE", help="Write the module here "
                                               "(default: stdout).")] = None,
    normalized: Annotated[bool, typer.Option("--normalized", help="Write the canonical text goldens keep "
                                             "(`golden/CELL.hlo.txt`), for a plain `diff`.")] = False,
    config: ConfigOpt = None, no_cache: NoCacheOpt = False,
) -> None:
    """Write a cell's HLO module: exactly the text hlo-audit lowered, analysed and cached (from the cache when it is
    there, else lowered now). `hlo-audit diff golden/CELL.hlo.txt FILE` then shows what changed against its
    golden. Exit 1 if the cell cannot be lowered here."""
    if output:
        check_output(output, "--output", "module.hlo.txt")
    try:
        text = audit.cell_text(cell, config, normalized=normalized, use_cache=not no_cache)
    except audit.CellNotLowered as exc:
        print_error(exc)
        raise typer.Exit(exc.exit_code) from None
    if output:
        write_output(output, text, "--output", "module.hlo.txt")
    else:
        sys.stdout.write(text)


@app.command()
@exit_on_input_error
def init(
    nnx: Annotated[str | None, typer.Option("--nnx", metavar="package.module:Factory", help="The stock NNX "
                                            "target: the nnx.Module class (or function) of a model library.")] = None,
    nnx_config: Annotated[str | None, typer.Option("--nnx-config", metavar="package.module:callable",
                                                   help="With --nnx: what returns the model's config object "
                                                        "(a preset such as ModelConfig.qwen3_0p6b).")]
    = None,
    function: Annotated[str | None, typer.Option("--callable", metavar="package.module:function",
                                                 help="A function that lowers a cell (docs/configuration.md).")]
    = None,
    maxtext: Annotated[bool, typer.Option("--maxtext", help="MaxText's train step (the MaxText installed: in a "
                                          "contributor's checkout, their branch).")] = False,
    model: Annotated[list[str] | None, typer.Option("--model", metavar="NAME", help="A model name (repeatable): "
                                                    "MaxText's (default: the built-in matrix's three), the "
                                                    "callable's, or the nnx model's name in its cell ids.")] = None,
    quant: Annotated[str | None, typer.Option("--quant", metavar="Q,...", help="--maxtext: quantizations "
                                              "(default: none,int8,fp8,nanoo_fp8).")] = None,
    layers: Annotated[str, typer.Option("--layers", metavar="N,...", help="Depths of every series.")] = "2,4",
    inputs: Annotated[list[str] | None, typer.Option("--input", metavar="NAME=DTYPE[DIMS]", help="--nnx: an "
                                                     "argument of the model's call, e.g. x=float32[batch,16] "
                                                     "(repeatable; default: read off the call's names).")] = None,
    args: Annotated[list[str] | None, typer.Option("--arg", metavar="NAME=VALUE", help="--nnx: a keyword "
                                                   "argument of the factory (repeatable).")] = None,
    labels: Annotated[str | None, typer.Option("--labels", metavar="NAME", help="--nnx: the input holding the "
                                               "token ids the loss predicts.")] = None,
    layers_field: Annotated[str | None, typer.Option("--layers-field", metavar="NAME", help="--nnx: the config "
                                                     "field (or keyword) that sets the depth.")] = None,
    scan_field: Annotated[str | None, typer.Option("--scan-field", metavar="NAME", help="--nnx: the config field "
                                                   "(or keyword) that turns layer scan on.")] = None,
    sets: Annotated[list[str] | None, typer.Option("--set", metavar="NAME=VALUE", help="A model config field, typed "
                                                   "as TOML (repeatable): --nnx-config's, or MaxText's.")] = None,
    optimizer: Annotated[str, typer.Option("--optimizer", help="--nnx: an optax optimizer.")] = "adamw",
    learning_rate: Annotated[float, typer.Option("--learning-rate", help="--nnx: its learning rate.")] = 1e-4,
    shards: Annotated[int, typer.Option("--shards", min=1, max=256, help="Check jobs in the CI workflow.")] = 2,
    no_golden: Annotated[bool, typer.Option("--no-golden", help="Write the config and the workflow only.")] = False,
    exclude: Annotated[list[str] | None, typer.Option("--exclude", metavar="KEY=VALUE[,...]", help="Leave these cells "
                                                      "out of the matrix: an [[exclude]] of the config (repeatable), "
                                                      "e.g. model=gemma4-e2b,scan=on.")] = None,
    jobs: JobsOpt = 1,
) -> None:
    """Put this repository under the gate: write hlo-audit.toml for the target, a GitHub Actions workflow
    (.github/workflows/hlo-audit.yml: check in shards, merged), and the first goldens (golden update). Nothing
    is overwritten: if any of them exists, init says which and exits 2. A cell the target refuses (unavailable, or
    its model's configuration rejects it) is written as an [[exclude]] with the reason, and the others' goldens are
    made. Exit 1 if a cell fails to lower otherwise (the config and workflow stay: fix the config, then `hlo-audit
    golden update`)."""
    request = scaffold.init_request(
        nnx=nnx, nnx_config=nnx_config, function=function, maxtext=maxtext, models=model or (), quant=quant,
        layers=layers, inputs=inputs or (), args=args or (), labels=labels, layers_field=layers_field,
        scan_field=scan_field, optimizer=optimizer, learning_rate=learning_rate, shards=shards, sets=sets or (),
        excludes=exclude or ())
    folder = _init_files(request)
    if no_golden:
        print("next: hlo-audit golden update, then commit hlo-audit.toml, the workflow and golden/")
        raise typer.Exit(EXIT_OK)
    update = _init_goldens(folder, jobs)
    if update.exit_code == EXIT_OK:
        print(init_next_line(update))
    raise typer.Exit(update.exit_code)


def _init_files(request: scaffold.InitRequest):
    """init's config and workflow written (and said, with the notes); the folder they are in."""
    folder = working_directory("init (it writes there)")
    made = scaffold.init_scaffold(folder, request)
    for path in scaffold.write(folder, made):
        print(f"wrote {path.relative_to(folder)}")
    for note in scaffold.notes(folder, made, request):
        print(f"note: {note}")
    return folder


def _init_goldens(folder, jobs: int):
    """init's first golden update (``audit.init_goldens``: refused cells excluded), said; what it did."""
    plan, results, update, excluded = audit.init_goldens(folder, lambda p: progress.run_shown(p, jobs, True, False))
    sys.stdout.write(terminal.render(terminal.print_golden_update, update, plan.config.golden_dir, results))
    for e in excluded:
        print(f"note: {accepting.excluded_line(e)}")
    return update


def main() -> None:
    """The console script: the command, in a process whose standard streams and signals are handled as a CI runner
    leaves them (``streams``, ``termination``); the exit code is the command's, or 2 for standard output that cannot
    take its report, or 128 + a signal's number when one stopped it."""
    host.setup_own_process()
    closed = streams.reopen_closed()
    with streams.guarded_stderr() as stderr:
        code = _command(closed)
    if stderr.failed and code in (EXIT_OK, EXIT_DIFFERENCE):  # what it said on stderr is lost: never a plain verdict
        code = EXIT_INPUT_ERROR
    termination.leave(termination.stopped_exit_code() or code)


def _command(closed: list[str]) -> int:
    """``main``'s command, with standard error guarded: its exit code."""
    if "stdout" in closed:
        print_error("standard output is closed (>&-): redirect it to a file or /dev/null")
        return EXIT_INPUT_ERROR
    code = EXIT_OK
    try:
        with termination.ending_on_signals(), streams.guarded_stdout():
            try:
                app()
            except SystemExit as done:
                code = done.code if isinstance(done.code, int) else EXIT_INPUT_ERROR if done.code else EXIT_OK
    except streams.StdoutError as exc:
        print_error(exc)
        code = EXIT_INPUT_ERROR
    except KeyboardInterrupt as stop:  # a signal outside any command (while parsing its options)
        termination.announce(stop)
    return code
