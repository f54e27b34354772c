"""What `count`, `diff`, `rng`, `explain` and `lower` read: an HLO file, '-' (stdin) or an ``--xla_dump_to``
folder, parsed now; or a cell id, its result from the cache (else lowered now). One ``Program`` either way."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from hlo_audit.analysed import Constants, Launches, Param, RngSummary
from hlo_audit.cache import Cache
from hlo_audit.commands.explain import Node, explain
from hlo_audit.comparison import CanonicalInput, CellDelta, Structural, launch_comparison
from hlo_audit.findings import LaunchChange
from hlo_audit.golden.snapshot import read_snapshot
from hlo_audit.hlo.analysis import Analysis, analyze
from hlo_audit.hlo.launches import launch_report
from hlo_audit.hlo.params import entry_params
from hlo_audit.hlo.rng_keys import placed
from hlo_audit.hlo.source import read_input
from hlo_audit.hlo.text import HloParseError, parse_module
from hlo_audit.hlo.thunks import thunk_dumps
from hlo_audit.judging.outcome import Outcome
from hlo_audit.plan import is_cell_id, plan_cell
from hlo_audit.results import LoweredCell
from hlo_audit.run import execute
from hlo_audit.usage import EXIT_DIFFERENCE, EXIT_INPUT_ERROR, EXIT_OK, InputError


@dataclass(frozen=True)
class Program:
    """What `rng` and `explain` read of one program, whether a file's or a cell's: its entry parameters, RNG
    streams, constants (None: not known) and, for a GPU program, its launches per step."""

    label: str
    params: tuple[Param, ...]
    rng: RngSummary
    constants: Constants | None = None
    launches: Launches | None = None
    # A cell's comparison with its golden (the one ``check`` judges by); None for a file, or a cell without one.
    against: CellDelta | None = None


@dataclass(frozen=True)
class Unreadable:
    """An input `count` could not read: its one-line error names the file (and line)."""

    source: str
    error: str


class CellNotLowered(Exception):
    """`lower`: the cell is unavailable here or failed to lower; the message says which and why."""

    exit_code = EXIT_DIFFERENCE


def analyze_input(spec: str, module: str | None = None, stage: str = "before") -> Analysis:
    """One HLO file, '-' or dump folder, parsed and analysed."""
    check_module_regex(module)
    text, source = read_input(spec, module, stage)
    return analyze(text, source)


def check_module_regex(module: str | None) -> None:
    """``--module`` refused as the usage error it is, whatever the inputs (a file ignores it; a folder would fail
    there alone, as if the folder were unreadable)."""
    if module is not None:
        try:
            re.compile(module)
        except re.error as exc:
            raise InputError(f"--module {module!r}: not a regular expression: {exc}") from None


def analyze_each(specs: list[str], module: str | None = None, stage: str = "before") -> list[Analysis | Unreadable]:
    """Each input analysed on its own, so one bad file costs only its own report."""
    check_module_regex(module)
    results: list[Analysis | Unreadable] = []
    for spec in specs:
        try:
            results.append(analyze_input(spec, module, stage))
        except (HloParseError, InputError) as exc:
            results.append(Unreadable(spec, str(exc)))
    return results


@dataclass(frozen=True)
class InputDiff:
    """`diff` of two inputs: the structural account, each input's name and, for two GPU dumps, their launches."""

    structural: Structural
    old: str
    new: str
    launches: LaunchChange | None

    @property
    def exit_code(self) -> int:
        """`diff`'s exit code: a difference when the programs differ (renamed-only is the same program)."""
        return EXIT_DIFFERENCE if self.structural.diff.differs else EXIT_OK


@dataclass(frozen=True)
class Counted:
    """`count` of its inputs: each one's analysis, or why it could not be read, and a GPU dump's launches."""

    analyses: tuple[Analysis | Unreadable, ...]
    launches: tuple[Launches | None, ...]

    @property
    def unreadable(self) -> list[Unreadable]:
        return [a for a in self.analyses if isinstance(a, Unreadable)]

    @property
    def exit_code(self) -> int:
        """`count`'s exit code: an input that could not be read is an input error (the others are still counted)."""
        return EXIT_INPUT_ERROR if self.unreadable else EXIT_OK


def count_inputs(specs: list[str], module: str | None = None, stage: str = "before") -> Counted:
    """`count`: each input analysed on its own (``analyze_each``), with its launches where it is a GPU dump."""
    analyses = tuple(analyze_each(specs, module, stage))
    return Counted(analyses, tuple(None if isinstance(a, Unreadable) else dump_launches(a) for a in analyses))


def diff_inputs(old_spec: str, new_spec: str, module: str | None = None, stage: str = "before",
                max_text_lines: int = 0) -> InputDiff:
    """`diff` of two files, '-' or dump folders (``diff``'s account). Each side is parsed, its launches read and made
    canonical before the other is parsed, and its raw parse dropped: a module of 100,000 computations parses to
    ~230 MB, and the two raw parses held beside the two canonical ones took `diff` past 1.4 GB."""
    (old_text, old_source), (new_text, new_source) = read_input(old_spec, module, stage), \
        read_input(new_spec, module, stage)
    if old_text == new_text:  # identical: nothing to make canonical
        a, b = analyze(old_text, old_source), analyze(new_text, new_source)
        return InputDiff(diff(a, b, max_text_lines), a.source, b.source,
                         launches_diff(dump_launches(a), dump_launches(b)))
    sides, launches = [], []
    for text, source in ((old_text, old_source), (new_text, new_source)):
        raw = analyze(text, source)
        launches.append(dump_launches(raw))
        sides.append(CanonicalInput.of(raw))
        del raw
    del old_text, new_text, text
    return InputDiff(Structural.of_canonical(*sides, max_text_lines), old_source, new_source,
                     launches_diff(*launches))


def diff(old: Analysis, new: Analysis, max_text_lines: int) -> Structural:
    """What changed from ``old`` to ``new``, with a verdict: the structural account ``check`` reads of a cell against
    its golden, built the same way (``comparison.Structural.of_inputs``), so the two commands say the same numbers."""
    return Structural.of_inputs(old, new, max_text_lines)


def dump_launches(analysis: Analysis) -> Launches | None:
    """What one step of a GPU program read from an ``--xla_dump_to`` folder launches: the thunk sequence XLA wrote
    beside the module file read (``hlo.thunks.thunk_dumps``), attributed through the same module's after-optimizations
    text (the file read, when it is that one); None for any other input (a file outside a GPU dump, stdin)."""
    path = Path(analysis.source)
    if not path.is_file():
        return None
    found = [d for d in thunk_dumps(path.parent) if path.name.startswith(d.prefix + ".")]
    if not found:
        return None
    dump = max(found, key=lambda d: len(d.prefix))
    sequence, metadata, after = dump.read()
    if dump.after_optimizations is not None and dump.after_optimizations.resolve() == path.resolve():
        module, params = analysis.module, analysis.params
    elif after is not None:
        module = parse_module(after, str(dump.after_optimizations))
        params = entry_params(module)
    else:
        module, params = None, ()
    return Launches.of(launch_report(sequence, metadata, module, params, str(dump.sequence)))


def launches_diff(old: Launches | None, new: Launches | None) -> LaunchChange | None:
    """Two GPU programs' launches per step side by side (``compare.launch_comparison``), None unless both have them."""
    return launch_comparison(old, new)


def cell_result(cell_id: str, config_path: str | None = None, use_cache: bool = True,
                refresh: bool = False) -> LoweredCell:
    """One cell's result: from the cache when it is there, else lowered now. Unavailable or failed: an input error."""
    result = next(execute(plan_cell(cell_id, config_path), use_cache=use_cache, refresh=refresh))
    if not isinstance(result, LoweredCell):
        raise InputError(f"{cell_id}: {result.status}: {result.message}")
    return result


def cell_text(cell_id: str, config_path: str | None = None, normalized: bool = False, use_cache: bool = True) -> str:
    """A cell's module as hlo-audit lowered, analysed and cached it (the stage's text: XLA's printer without
    metadata, large constants as ``{...}``), or with ``normalized`` its canonical text, the text its golden
    keeps. From the cache when the cell is there, else lowered now (and cached)."""
    p = plan_cell(cell_id, config_path)
    result = next(execute(p, use_cache=use_cache))
    if not isinstance(result, LoweredCell):
        raise CellNotLowered(f"{cell_id}: {result.status}: {result.message}")
    if normalized:
        return result.canonical_text()
    text = result.text if result.text is not None else Cache(p.config.cache_dir, enabled=use_cache).hlo_text(result.key)
    if text is None:  # a result cached without its module: lower it again
        result = next(execute(p, use_cache=False))
        if not isinstance(result, LoweredCell):
            raise CellNotLowered(f"{cell_id}: {result.status}: {result.message}")
        text = result.text
    return text


def load_program(spec: str, config_path: str | None = None, module: str | None = None, stage: str = "before",
                 use_cache: bool = True, refresh: bool = False) -> Program:
    """An HLO file, '-' or dump folder (parsed now), or a cell id (its analysed result: cached, else lowered)."""
    if spec == "-" or os.path.exists(spec) or not is_cell_id(spec):
        analysis = analyze_input(spec, module, stage)
        keys = placed(analysis.keys, analysis.module, analysis.params)
        return Program(analysis.source, tuple(Param.of(p) for p in analysis.params), RngSummary.of(analysis.rng, keys),
                       Constants.of(analysis.constants), dump_launches(analysis))
    p = plan_cell(spec, config_path)
    result = next(execute(p, use_cache=use_cache, refresh=refresh))
    if not isinstance(result, LoweredCell):
        raise InputError(f"{spec}: {result.status}: {result.message}")
    return read_snapshot(p.config.golden_dir, lambda tree: cell_program(result, Outcome.of(p, [result], tree)))


def cell_program(result: LoweredCell, outcome: Outcome) -> Program:
    """A lowered cell as `rng` and `explain` read it, against its golden as ``outcome`` compares it
    (``Outcome.delta``: a checked outcome's is the comparison the gate judged by, the same object)."""
    return Program(result.cell.id, result.params, result.rng, result.constants, result.launches,
                   outcome.delta(result, texts=True))


def explain_trees(program: Program, depth: int = 3, top: int = 8) -> tuple[Node, Node | None]:
    """The explain trees of a program: its entry parameters' (each RNG parameter with its stream's verdict, so a
    node says how much of it is drawn and how much buys nothing) and, for a step that closes over state, its
    captured arrays' (known for cells only)."""
    tree = explain(program.params, program.label, depth=depth, top=top, verdicts=program.rng.verdict_of_param())
    captured = program.constants.captured if program.constants is not None else None
    arrays = (captured.arrays_list or ()) if captured is not None else ()
    return tree, explain(arrays, f"{program.label} captured", depth=depth, top=top) if arrays else None


def explain_source(spec: str, config_path: str | None = None, module: str | None = None, stage: str = "before",
                   use_cache: bool = True, depth: int = 3, top: int = 8,
                   refresh: bool = False) -> tuple[Node, Node | None]:
    """The explain trees of a cell id (from the cache, else lowered) or an HLO file, '-' or dump folder."""
    return explain_trees(load_program(spec, config_path, module, stage, use_cache, refresh), depth, top)
