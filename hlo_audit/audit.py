"""The pipeline in one call per step, as the CLI, the pytest plugin and library users run it:
``plan`` (config -> cells), ``execute`` (cells -> results), then ``check`` (an ``Outcome`` judged by the gate),
``update_goldens``, ``report`` (the matrix view) or ``scaling``.

Each step is its module's (``plan``, ``run``, ``outcome``, ``gate``, ``commands.golden_update``,
``report.matrix``); this one only chains them, so the CLI parses options and formats, and a library user gets the
same behaviour.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TextIO

from hlo_audit import run as running
from hlo_audit import termination
from hlo_audit.cache.store import tracked_by_git
from hlo_audit.commands import measure as measuring
from hlo_audit.commands.golden_update import GoldenUpdate, record_figures, update, writable
from hlo_audit.commands.inputs import (
    CellNotLowered,
    Program,
    Unreadable,
    analyze_each,
    analyze_input,
    cell_result,
    cell_text,
    count_inputs,
    diff,
    diff_inputs,
    dump_launches,
    explain_source,
    explain_trees,
    launches_diff,
    load_program,
)
from hlo_audit.files import write_atomic
from hlo_audit.findings import Accept
from hlo_audit.judging import host_figures
from hlo_audit.judging.change_reach import coverage_of
from hlo_audit.judging.gate import judged, regenerate_command
from hlo_audit.judging.outcome import Lowered, Outcome
from hlo_audit.merge import check_record, failing_in, last_check_path
from hlo_audit.patch import Patch, read_patch
from hlo_audit.plan import Plan, id_depth, is_cell_id, plan, plan_cell
from hlo_audit.report.frame import tidy_frame
from hlo_audit.report.matrix import MatrixView, matrix_view_of
from hlo_audit.report.words import nothing_to_fit_line
from hlo_audit.results import CellResult, LoweredCell
from hlo_audit.rules import host_cost as host_cost_rule
from hlo_audit.run import execute
from hlo_audit.scaffold.refused import Excluded, exclude_refused
from hlo_audit.scaling import Series
from hlo_audit.usage import InputError

__all__ = ["CellNotLowered", "Plan", "Program", "Unreadable", "analyze_each", "analyze_input", "cell_result",
           "cell_text", "check", "count_inputs", "diff", "diff_inputs", "dump_launches", "execute", "explain_source",
           "explain_trees", "is_cell_id", "launches_diff", "load_program", "lowered", "normalized_text",
           "params_frame", "plan", "plan_cell", "report", "scaling", "scaling_of", "slopes_by_cell", "update_goldens"]



def normalized_text(result: LoweredCell) -> str:
    """The cell's canonical text (``LoweredCell.canonical_text``)."""
    return result.canonical_text()


def check(p: Plan, results: Sequence[CellResult], config_path: str | None = None,
          report_stale: bool = True, changes: Changes | None = None) -> Outcome:
    """The plan's outcome judged by the gate under the config's policy (``report_stale``: say which goldens have no
    cell; one shard of a sharded run does). A cell whose golden records a host figure has its own measured now
    (``judging.host_figures.with_host_figures``), for the host_cost rule. ``changes``: the pull request's diff
    (``read_changes``), against what the cells reached (``judging.change_reach``: the ``unreached`` rule)."""
    coverage = coverage_of(changes.patch, changes.source, results, running.project_folder(p.config),
                           p.full_matrix if p.full_matrix is not None else p.matrix) if changes is not None else None
    return judged(p, results, regenerate_command(config_path), report_stale, prepare=host_figures.prepared_for_check,
                  coverage=coverage)


@dataclass(frozen=True)
class Changes:
    """A pull request's diff as `check --changes` read it: the patch and where it came from."""

    patch: Patch
    source: str


def read_changes(path: str, stdin: TextIO) -> Changes:
    """The unified diff at ``path`` (``-``: ``stdin``), read whole before any cell runs: a file that cannot be read
    or is no diff is the user's to fix (``InputError``, one line naming it)."""
    source = "stdin" if path == "-" else path
    try:
        text = stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise InputError(f"--changes {path}: cannot be read ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"--changes {path}: not text ({exc.reason})") from None
    return Changes(read_patch(text, source), source)


def recorded_inputs(p: Plan) -> list:
    """What each cell's cached lowering read (``check --explain-cache``)."""
    return running.recorded_inputs(p)


def keep_check(p: Plan, outcome: Outcome) -> str | None:
    """Keep the check's JSON report in cache_dir (``merge.LAST_CHECK``: what `golden update --failing` reads);
    None when kept, else why not, for a warning (a report that cannot be kept does not change the verdict). A
    cache_dir git tracks is never written (``cache.store.tracked_by_git``: a committed cache is not the run's; the
    cache has said so)."""
    # The record and its path made first, then the cache asked: the flow goes down from the formats to the cache.
    kept, path = json.dumps(check_record(outcome)) + "\n", last_check_path(p.config.cache_dir)
    if tracked_by_git(Path(p.config.cache_dir)):
        return None
    try:
        write_atomic(path, kept)
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def failing_plan(config: str | None = None, given: bool = False) -> tuple[Plan, Accept | None]:
    """The plan of `golden update --failing`: the cells that failed in the last check (``merge.failing_in``), at
    their own depths; (the config's plan, None) when none failed. ``given``: --only or --layers given too."""
    if given:
        raise InputError("--failing accepts the cells that failed in the last check: give it, or --only/--layers, "
                         "not both")
    p = plan(config)
    if tracked_by_git(Path(p.config.cache_dir)):
        raise InputError(f"--failing reads the last check's report from cache_dir {p.config.cache_dir}, which holds "
                         "files git tracks: a committed cache is never read (untrack it, or use --only)")
    accept = failing_in(last_check_path(p.config.cache_dir), p.shard.judge)
    if accept is None:
        return p, None
    depths = sorted({depth for cell_id in accept.ids if (depth := id_depth(cell_id)) is not None})
    return plan(config, ",".join(f"id={cell_id}" for cell_id in accept.ids), None, ",".join(map(str, depths))), accept


def init_goldens(folder: Path, run: Callable[[Plan], list[CellResult]]
                 ) -> tuple[Plan, list[CellResult], GoldenUpdate, list[Excluded]]:
    """`init`'s first golden update: the config's cells run (``run``), the ones the target refused written into
    the config as [[exclude]] with their reason (``scaffold.exclude_refused``), the others' goldens made from the
    same run."""
    p = plan(None, cwd=folder)
    writable(p)
    results = run(p)
    excluded = exclude_refused(folder, p.cells, results)
    if excluded:
        p = plan(None, cwd=folder)
        kept = {c.id for c in p.cells}
        results = [r for r in results if r.cell.id in kept]
    update = update_goldens(p, results)
    # Every cell refused: a config with no golden would pass every check ("1 unavailable"): init fails instead.
    refused_all = bool(results) and all(r.refused for r in results)
    return p, results, replace(update, every_cell_refused=refused_all), excluded


def goldens_writable(p: Plan) -> None:
    """One line (``GoldenError``) where the plan's goldens could not be written: a golden folder outside the project
    (``commands.golden_update.writable``). Asked before lowering, so a refusal costs nothing."""
    writable(p)


def update_goldens(p: Plan, results: Sequence[CellResult], prune: bool = False) -> GoldenUpdate:
    """Write the goldens of ``results``; with ``prune``, remove hlo-audit's goldens of cells no longer in the matrix. A
    golden that records a host figure keeps one: measured again now, and rewritten where its leaves moved."""
    return update(p, results, prune, prepare=host_figures.prepared_for_update)


def report(p: Plan, results: Sequence[CellResult]) -> MatrixView:
    """The matrix against its goldens, scan pairs and depth scaling, for ``report`` and ``params_frame``."""
    return matrix_view_of(p, results)


def scaling(p: Plan, results: Sequence[CellResult]) -> list[Series]:
    return Outcome.of(p, results).series


def lowered(p: Plan, results: Sequence[CellResult]) -> Lowered:
    """`run`'s and `scaling`'s view of the plan's results (``outcome.Lowered``), its exit code with it."""
    return Lowered.of(Outcome.of(p, results))


def scaling_of(p: Plan, results: Sequence[CellResult]) -> Lowered:
    """`scaling`'s view; nothing to fit (every cell unavailable here, or no series of two or more depths), with no
    cell failed, is the user's to fix (``InputError``)."""
    view = lowered(p, results)
    if not view.series and not view.failed:
        raise InputError(nothing_to_fit_line(view.results))
    return view


def slopes_by_cell(p: Plan, results: Sequence[CellResult]) -> dict[str, float]:
    """Each cell's series' entry parameters per layer (cells of a series of one depth have none)."""
    return Outcome.of(p, results).slopes_by_cell


def params_frame(config: str | None = None, only: str | None = None, layers: str | None = None, jobs: int = 1,
                 use_cache: bool = True, refresh: bool = False):
    """The tidy DataFrame of the configured matrix: one row per cell x dtype x role.

    Columns: id, model, scan, quant, layers, platform, stage, dtype, role, count, bytes, golden_count,
    golden_delta (nullable integers: <NA> where there is no golden to compare with). Cells are read from the
    results cache where they are, lowered otherwise; ``only`` and ``layers`` are the CLI's ``--only`` and
    ``--layers``, ``use_cache=False`` and ``refresh`` its ``--no-cache`` and ``--refresh``.
    """
    p = plan(config, only, None, layers)
    return tidy_frame(report(p, list(execute(p, jobs=jobs, use_cache=use_cache, refresh=refresh))))


def measure(p: Plan, rounds: measuring.Rounds, across: str = "quant", baseline: str | None = None,
            timing: bool = True, record: bool = False, save_text: Callable[[str, str], None] | None = None,
            measured: Callable[[measuring.CellMeasurement], None] | None = None,
            config_path: str | None = None) -> measuring.MeasureReport:
    """The plan's cells run here (``measure.measure_cells``), each group's ``baseline`` value of ``across`` first
    (default ``none``, where a cell has it), then judged (``judge_measured``); with ``record``, their figures written
    beside their goldens once judged."""
    if across not in measuring.ACROSS:
        raise InputError(f"--across {across}: expected one of {', '.join(measuring.ACROSS)}")
    if record:
        writable(p)  # before anything is measured
    labels = {c: _axis_label(c, across) for c in p.cells}
    if baseline is not None and baseline not in labels.values():
        raise InputError(f"--baseline {baseline}: no selected cell has {across} {baseline!r} (they have "
                         f"{', '.join(sorted(set(labels.values())))})")
    first = "none" if baseline is None else baseline
    cells = sorted(p.cells, key=lambda c: labels[c] != first)
    report = judge_measured(p, measuring.measure_cells(cells, p.config.golden_dir, rounds, across, timing, save_text,
                                                       measured), config_path)
    if record:
        termination.raise_if_stopped()  # nothing is recorded after a Ctrl-C, even one a library swallowed
        report = replace(report, recorded=record_figures(report.cells, p.config.golden_dir, p.config.project))
    return report


def judge_measured(p: Plan, report: measuring.MeasureReport,
                   config_path: str | None = None) -> measuring.MeasureReport:
    """``report`` with its outcome: the cells whose golden records a host figure (``measure.judgeable``), lowered as
    `check` lowers them (the cache's results), each with the figure measured now, judged by the gate as `check`
    judges them (``gate.judged``: the config's ``[policy]``, host_cost's action and tolerance, and its waivers), the
    host_cost rule alone: a cell without a golden is no failure of a measurement."""
    figures = measuring.judgeable(report)
    if not figures:
        return report
    judged_plan = p.of_cells([c for c in p.cells if c.id in figures])
    outcome = judged(judged_plan, list(execute(judged_plan)), regenerate_command(config_path), report_stale=False,
                     prepare=host_figures.with_measured_figures(figures), rules=(host_cost_rule.NAME,))
    return replace(report, outcome=outcome)


def _axis_label(cell, axis: str) -> str:
    """The cell's value of ``axis`` as its id and ``--baseline`` write it (scan: on / off; layers: 4)."""
    return cell.scan_label if axis == "scan" else str(getattr(cell, axis))
