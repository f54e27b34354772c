"""Command line. Parses options, calls the pipeline, picks a formatter; no analysis lives here."""

from __future__ import annotations

import sys
from enum import Enum
from typing import Annotated

import typer

from hlo_audit.errors import InputError, exit_on_input_error
from hlo_audit.hlo.analysis import Analysis, analyze
from hlo_audit.hlo.diff import diff_modules
from hlo_audit.hlo.source import read_input
from hlo_audit.report import jsonfmt, markdown, table

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
    """Count entry parameters by dtype, role and state-path group."""
    analyses = [_load(p, module, stage) for p in paths]
    if fmt is Format.json:
        sys.stdout.write(jsonfmt.format_count(analyses, with_params=params))
    elif fmt is Format.markdown:
        sys.stdout.write(markdown.format_count(analyses, top))
    else:
        table.print_count(table.make_console(), analyses, top)


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


def main() -> None:
    app()
