"""A pull request's changed lines against what each cell's lowering reached (``check --changes``, issue 46): the
records are ``coverage``'s; this module works them out once per check.

A changed file is matched to the files a cell used (``analysed.CodeReach``: named relative to the project, or
absolute) by its path within its repository: each file the cells used is named from its own git top level (the
project's, an editable install's checkout), so a diff taken in either repository matches; a file in no repository
matches by the end of its path. A changed line is **reached** by a cell whose lowering ran it (its lines, where the
lowering process heard them), or that used the file it is in where lines are not known (Python 3.11) or the file is
not Python (a YAML config it read); it is **in the program** of a cell where an instruction's stack names it. Of the
changed lines only those of model code count (``patch.is_model_code``, ``patch.code_lines``: comments, docstrings,
blank lines, tests and docs do not).

For lines no cell reached in a file some cell ran, what encloses them says which cell would reach them, where it is
plain: an ``if`` whose condition no cell met (read from the file: ``if self.num_layers >= 4``, and the axis it
reads), a loop no cell iterated, a function no cell called; for a branch on depth, the deeper cells of the same
series in the matrix this run did not lower.
"""

from __future__ import annotations

import ast
import functools
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from hlo_audit.analysed import CodeReach
from hlo_audit.coverage import Axis, ChangedRun, Coverage, Enclosing, ReachHint
from hlo_audit.matrix import Cell
from hlo_audit.patch import CONFIG_SUFFIXES, ChangedFile, Patch, code_lines, is_model_code, range_text
from hlo_audit.results import CellResult, LoweredCell

# Words of a condition that name a matrix axis (lower case, as identifiers hold them).
_AXIS_WORDS = ((Axis.SCAN, re.compile(r"scan")), (Axis.QUANT, re.compile(r"quant|int8|int4|fp8|nvfp4|mxfp")),
               (Axis.LAYERS, re.compile(r"layer|depth|\bidx\b|_idx\b|\bindex\b|_index\b|num_blocks|n_blocks")))
_CONDITION_SHOWN = 80
Span = tuple[int, int]  # a statement's first and last lines


@dataclass(frozen=True)
class _Used:
    """One file a cell used, as found on this machine: its absolute path, its path in its repository (None: in
    none), and the cell's reach of it."""

    cell: str
    absolute: str
    repository_path: str | None
    recorded: str  # its name in the cell's record (the key of ``CodeReach.ran`` / ``named``)
    reach: CodeReach


def coverage_of(patch: Patch, source: str, results: Sequence[CellResult], project: Path,
                matrix: Sequence[Cell] = ()) -> Coverage:
    """The change ``patch`` (read from ``source``) against the lowered ``results``; ``project``: the folder their
    records name the project's files from (``run.project_folder``); ``matrix``: the whole matrix (the deeper cells a
    hint names)."""
    _git_top.cache_clear()  # a folder's repository as it is now (a project may have been made one since)
    lowered = [r for r in results if isinstance(r, LoweredCell)]
    known = [r for r in lowered if r.reach is not None]
    used = [_Used(r.cell.id, absolute, _repository_path(absolute), name, r.reach)
            for r in known for name in r.reach.files
            if (absolute := _absolute(name, project))]
    runs: list[ChangedRun] = []
    not_model: list[str] = []
    reached: dict[str, list[str]] = {r.cell.id: [] for r in known}
    in_program: dict[str, list[str]] = {r.cell.id: [] for r in known}
    config_text: dict[str, str] = {}
    for changed in patch.files:
        if changed.deleted or changed.binary or not changed.lines:
            continue
        named_here = os.path.normpath(os.path.abspath(changed.path))
        matches = [u for u in used if _matches(u, changed.path, named_here)]
        if not is_model_code(changed.path) and not matches:
            not_model.append(changed.path)
            continue
        text = _text_of(changed, matches, project)
        lines = code_lines(changed.path, changed.lines, text)
        span = _statement_spans(text) if changed.path.endswith(".py") and text is not None else {}
        for cell in reached:
            mine = [u for u in matches if u.cell == cell]
            reached[cell] += range_text(changed.path, [n for n in lines
                                                       if any(_ran(u, span.get(n, (n, n))) for u in mine)])
            in_program[cell] += range_text(changed.path, [n for n in lines
                                                          if any(_named(u, span.get(n, (n, n))) for u in mine)])
        runs += [_run(changed.path, group, matches, text, span, known, matrix) for group in _groups(lines)]
        if text is not None and PurePosixPath(changed.path).suffix.lower() in CONFIG_SUFFIXES:
            text_lines = text.split("\n")
            config_text.update({f"{changed.path}:{n}": text_lines[n - 1] for n in lines if n <= len(text_lines)})
    return Coverage(source, tuple(runs), tuple(r.cell.id for r in known),
                    {cell: tuple(v) for cell, v in reached.items()}, {cell: tuple(v) for cell, v in in_program.items()},
                    tuple(r.cell.id for r in lowered if r.reach is None), tuple(not_model),
                    tuple(r.cell.id for r in known if not r.reach.lines_known), config_text=config_text)


def _run(path: str, lines: tuple[int, ...], matches: list[_Used], text: str | None, span: Mapping[int, Span],
         known: list[LoweredCell], matrix: Sequence[Cell]) -> ChangedRun:
    """One run of changed code lines: the cells that ran any of them, those whose program names any, the lines no
    cell ran and what would reach them."""
    spans = [span.get(n, (n, n)) for n in lines]
    reached_by = tuple(dict.fromkeys(u.cell for u in matches if any(_ran(u, at) for at in spans)))
    named_by = tuple(dict.fromkeys(u.cell for u in matches if any(_named(u, at) for at in spans)))
    unreached = tuple(n for n, at in zip(lines, spans, strict=True) if not any(_ran(u, at) for u in matches))
    hint = _hint(path, unreached, matches, text, known, matrix) if unreached else None
    return ChangedRun(path, lines, reached_by, named_by, unreached, hint)


def _ran(used: _Used, span: Span) -> bool:
    """Whether the cell reached the statement spanning ``span`` of the file: ran a line of it (Python hears a
    statement's lines that hold code, not a closing bracket), or read a file that is not Python, or used a module
    whose lines its process could not hear (then the file counts whole)."""
    if not used.recorded.endswith(".py") or not used.reach.lines_known:
        return True
    return _overlaps(used.reach.ran.get(used.recorded, ()), span)


def _named(used: _Used, span: Span) -> bool:
    return _overlaps(used.reach.named.get(used.recorded, ()), span)


def _overlaps(runs, span: Span) -> bool:
    return any(first <= span[1] and span[0] <= last for first, last in runs)


def _statement_spans(text: str) -> dict[int, Span]:
    """Each line of a Python file -> the lines of the innermost statement it belongs to (a simple statement whole; a
    compound one's header, its decorators included, up to its body): what running "the line" means."""
    tree = _parsed(text)
    spans: dict[int, Span] = {}
    if tree is None:
        return spans
    for node in ast.walk(tree):  # outer statements first: an inner one's span overrides
        if not isinstance(node, ast.stmt):
            continue
        first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", ()))])
        body = getattr(node, "body", None)
        last = body[0].lineno - 1 if isinstance(body, list) and body and body[0].lineno > node.lineno else \
            (node.end_lineno or node.lineno)
        for line in range(first, max(first, last) + 1):
            held = spans.get(line)
            if held is None or held[1] - held[0] >= last - first:
                spans[line] = (first, max(first, last))
    return spans


def _groups(lines: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Changed code lines in runs of consecutive lines: each run one place (``path:a-b``) and one statement's worth
    of what would reach it (a line two statements down may sit under another ``if``)."""
    groups: list[list[int]] = []
    for line in lines:
        if groups and line == groups[-1][-1] + 1:
            groups[-1].append(line)
        else:
            groups.append([line])
    return [tuple(g) for g in groups]


def _absolute(name: str, project: Path) -> str:
    return os.path.normpath(name if os.path.isabs(name) else os.path.join(project, name))


@functools.cache
def _git_top(folder: str) -> str | None:
    here = Path(folder)
    for above in (here, *here.parents):
        if (above / ".git").exists():
            return str(above)
    return None


def _repository_path(absolute: str) -> str | None:
    top = _git_top(os.path.dirname(absolute))
    return Path(os.path.relpath(absolute, top)).as_posix() if top else None


def _matches(used: _Used, path: str, named_here: str) -> bool:
    """Whether the diff's ``path`` is this file: its path in its repository, else the end of its absolute path (a
    file in no repository), or the same file named absolutely or from here (``named_here``)."""
    if used.repository_path is not None and used.repository_path == path:
        return True
    if used.repository_path is None and used.absolute.replace(os.sep, "/").endswith("/" + path.lstrip("/")):
        return True
    return named_here == used.absolute


def _text_of(changed: ChangedFile, matches: list[_Used], project: Path) -> str | None:
    """The changed file's text now: the file a cell used, else the diff's path from the project's repository, the
    project or here; None where none is found (every changed line then counts as code)."""
    top = _git_top(str(project))
    candidates = [u.absolute for u in matches]
    candidates += [os.path.join(folder, changed.path) for folder in (top, str(project), os.getcwd()) if folder]
    for candidate in candidates:
        try:
            return Path(candidate).read_text(encoding="utf-8", errors="replace")
        except (OSError, ValueError):  # not there, a folder, a name the system refuses (a NUL in a diff's path)
            continue
    return None


def _hint(path: str, lines: tuple[int, ...], matches: list[_Used], text: str | None, known: list[LoweredCell],
          matrix: Sequence[Cell]) -> ReachHint:
    """What would reach ``lines``: nothing plainer than "no cell loaded the file" where none did; else the innermost
    statement around them that some cell ran (its header line), read from the file."""
    loaded_by = tuple(dict.fromkeys(u.cell for u in matches))
    if not loaded_by:
        return ReachHint(Enclosing.FILE)
    tree = _parsed(text) if path.endswith(".py") and text is not None else None
    name = PurePosixPath(path).name
    for node, part in reversed(_enclosing(tree, lines[0]) if tree is not None else []):
        ran_by = tuple(dict.fromkeys(u.cell for u in matches if _ran(u, (node.lineno, node.lineno))))
        if not ran_by:
            continue
        kind, shown = _described(node, part, text)
        axis = _axis_of(shown) if kind in (Enclosing.BRANCH, Enclosing.ELSE, Enclosing.LOOP) else Axis.NONE
        deeper = _deeper(ran_by, known, matrix) if axis is Axis.LAYERS else ()
        return ReachHint(kind, f"{name}:{node.lineno}", shown, ran_by, axis, deeper, loaded_by)
    return ReachHint(Enclosing.FILE, name, "", (), Axis.NONE, (), loaded_by)


@functools.lru_cache(maxsize=64)
def _parsed(text: str) -> ast.Module | None:
    try:
        return ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _enclosing(tree: ast.Module, line: int) -> list[tuple[ast.stmt, str]]:
    """The statements whose bodies hold ``line``, outermost first, each with the part that holds it (``body``,
    ``orelse``, ``handlers``: an except clause's body, ``finalbody``)."""
    chain: list[tuple[ast.stmt, str]] = []
    body: list = tree.body
    while (stmt := _holding(body, line)) is not None:
        for part in ("body", "orelse", "handlers", "finalbody"):
            statements = getattr(stmt, part, None)
            if isinstance(statements, list) and (inner := _holding(statements, line)) is not None:
                break
        else:
            return chain
        chain.append((stmt, part))
        body = inner.body if part == "handlers" else statements
    return chain


def _holding(statements: list, line: int):
    return next((s for s in statements if s.lineno <= line <= (s.end_lineno or s.lineno)), None)


def _described(node: ast.stmt, part: str, text: str | None) -> tuple[Enclosing, str]:
    def source(expr: ast.AST) -> str:
        shown = " ".join((ast.get_source_segment(text or "", expr) or ast.unparse(expr)).split())
        return shown if len(shown) <= _CONDITION_SHOWN else shown[:_CONDITION_SHOWN - 3] + "..."

    if isinstance(node, ast.If):
        return (Enclosing.ELSE if part == "orelse" else Enclosing.BRANCH), source(node.test)
    if isinstance(node, (ast.For, ast.AsyncFor)):
        return Enclosing.LOOP, source(node.iter)
    if isinstance(node, ast.While):
        return Enclosing.LOOP, source(node.test)
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return Enclosing.FUNCTION, node.name
    if isinstance(node, ast.Try) and part == "handlers":
        return Enclosing.HANDLER, ""
    return Enclosing.FILE, ""


def _axis_of(condition: str) -> Axis:
    lowered = condition.lower()
    return next((axis for axis, words in _AXIS_WORDS if words.search(lowered)), Axis.NONE)


def _deeper(ran_by: tuple[str, ...], known: list[LoweredCell], matrix: Sequence[Cell]) -> tuple[str, ...]:
    """The matrix's cells deeper than the deepest of their series among the cells that ran the branch's line, and
    not lowered by this run: where a deeper cell of the same series may take the branch."""
    lowered = {r.cell.id for r in known}
    deepest: dict[tuple, int] = {}
    for r in known:
        if r.cell.id in ran_by:
            deepest[r.cell.series] = max(deepest.get(r.cell.series, 0), r.cell.layers)
    return tuple(c.id for c in matrix if c.series in deepest and c.layers > deepest[c.series] and c.id not in lowered)
