"""The pipeline in one call per step, as the CLI, the pytest plugin and library users run it:
``plan`` (config -> cells), ``execute`` (cells -> results), then ``check`` (an ``Outcome`` judged by the gate),
``update_goldens``, ``report`` (the matrix view) or ``scaling``.

Each step is its module's (``plan``, ``run``, ``outcome``, ``gate``, ``golden.update``, ``report.matrix``); this one
only chains them, so the CLI parses options and formats, and a library user gets the same behaviour.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from hlo_audit.gate import judged, regenerate_command
from hlo_audit.golden.update import GoldenUpdate, update
from hlo_audit import measure as measuring
from hlo_audit.inputs import (CellNotLowered, Program, Unreadable, analyze_each, analyze_input, cell_result, cell_text,
                              diff, diff_inputs, dump_launches, explain_source, explain_trees, launches_diff,
                              load_program)
from hlo_audit.outcome import Outcome
from hlo_audit.usage import InputError
from hlo_audit.plan import Plan, is_cell_id, plan, plan_cell
from hlo_audit.report.frame import tidy_frame
from hlo_audit.report.matrix import MatrixView, matrix_view_of
from hlo_audit.results import CellResult
from hlo_audit.run import execute
from hlo_audit.scaling import Series

__all__ = ["CellNotLowered", "Plan", "Program", "Unreadable", "analyze_each", "analyze_input",
           "cell_result", "cell_text", "check", "diff", "diff_inputs", "dump_launches", "execute", "explain_source",
           "explain_trees",
           "is_cell_id", "launches_diff", "load_program", "normalized_text", "params_frame", "plan", "plan_cell",
           "report", "scaling", "slopes_by_cell", "update_goldens"]



def normalized_text(result: CellResult) -> str:
    """The cell's canonical text (``CellResult.canonical_text``)."""
    return result.canonical_text()


def check(p: Plan, results: Sequence[CellResult], config_path: str | None = None,
          report_stale: bool = True) -> Outcome:
    """The plan's outcome judged by the gate under the config's policy (``report_stale``: say which goldens have no
    cell; one shard of a sharded run does). A cell whose golden records a host figure has its own measured now
    (``measure.with_host_figures``), for the host_cost rule."""
    return judged(p, results, regenerate_command(config_path), report_stale,
                  prepare=lambda tree, ok: measuring.with_host_figures(ok, tree.golden))


def update_goldens(p: Plan, results: Sequence[CellResult], prune: bool = False) -> GoldenUpdate:
    """Write the goldens of ``results``; with ``prune``, remove hlo-audit's goldens of cells no longer in the matrix. A
    golden that records a host figure keeps one: measured again now, and rewritten where its leaves moved."""
    return update(p, results, prune,
                  prepare=lambda tree, ok: measuring.with_host_figures(ok, tree.golden, keep_held=True))


def report(p: Plan, results: Sequence[CellResult]) -> MatrixView:
    """The matrix against its goldens, scan pairs and depth scaling, for ``report`` and ``params_frame``."""
    return matrix_view_of(p, results)


def scaling(p: Plan, results: Sequence[CellResult]) -> list[Series]:
    return Outcome.of(p, results).series


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


def measure(p: Plan, rounds: measuring.Rounds, across: str = "quant", baseline: str = "none", timing: bool = True,
            record: bool = False, save_text: Callable[[str, str], None] | None = None,
            measured: Callable[[measuring.CellMeasurement], None] | None = None) -> measuring.MeasureReport:
    """The plan's cells run here (``measure.measure_cells``), each group's ``baseline`` value of ``across`` first;
    with ``record``, their figures written beside their goldens."""
    if across not in measuring.ACROSS:
        raise InputError(f"--across {across}: expected one of {', '.join(measuring.ACROSS)}")
    cells = sorted(p.cells, key=lambda c: getattr(c, across) != _typed(getattr(p.cells[0], across), baseline))
    report = measuring.measure_cells(cells, p.config.golden_dir, rounds, across, timing, save_text,
                                     p.config.rules.host_cost_tolerance, "hlo-audit measure --record", measured)
    if record:
        report = replace(report, recorded=measuring.record(report, p.config.golden_dir))
    return report


def _typed(example, value: str):
    """``value`` as the axis holds it (scan: a bool; layers: an int)."""
    if isinstance(example, bool):
        return value in ("on", "true", "1")
    return type(example)(value)
