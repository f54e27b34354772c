"""The pipeline as the CLI and the pytest plugin use it: config -> cells -> results -> scaling.

Kept apart from cli.py so that the CLI only parses options and formats, and so that library users get the
same behaviour with one call.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from hlo_audit import golden, matrix_report
from hlo_audit.cache import Cache
from hlo_audit.config import Config, load_config
from hlo_audit.errors import InputError
from hlo_audit.explain import Node, explain
from hlo_audit.gate import CheckReport, Gate, Policy, Waiver, launch_changes, stale, stale_waivers
from hlo_audit.hlo.analysis import Analysis, analyze
from hlo_audit.hlo.diff import ModuleDiff, diff_modules
from hlo_audit.hlo.params import entry_params
from hlo_audit.hlo.source import read_input
from hlo_audit.hlo.text import HloParseError, parse_module
from hlo_audit.hlo.thunks import launch_report, thunk_dumps
from hlo_audit.matrix import Cell, MatrixError, select
from hlo_audit.report.frame import tidy_frame
from hlo_audit.results import CellResult, Finding
from hlo_audit.run import run_cells
from hlo_audit.scaling import Series, fit_series
from hlo_audit.targets import get_target


@dataclass
class Plan:
    config: Config
    cells: list[Cell]

    def full_depth(self, model: str) -> int:
        return get_target(self.config.target).full_depth(model)


def parse_layers(value: str | None) -> list[int | str] | None:
    """``--layers 32`` / ``--layers full`` / ``--layers 2,4,full``."""
    if not value:
        return None
    depths: list[int | str] = []
    for item in value.split(","):
        item = item.strip()
        if item == "full":
            depths.append("full")
        elif item.isdigit() and int(item) >= 1:
            depths.append(int(item))
        else:
            raise MatrixError(f"--layers expects integers >= 1 or 'full', got {item!r}")
    return depths


def plan(config_path: str | None = None, only: str | None = None, shard: str | None = None,
         layers: str | None = None, cwd: Path | None = None) -> Plan:
    config = load_config(config_path, cwd)
    depths = parse_layers(layers)
    needs_depth = "full" in depths if depths else config.uses_full_depth
    full_depth = get_target(config.target).full_depth if needs_depth else None
    return Plan(config=config, cells=select(config.cells(full_depth, depths), only, shard))


_CELL_ID = re.compile(r"^[^/\s]+/scan-(?:on|off)/[^/\s]+/L(\d+)(?:/[^/\s]+)*$")


def is_cell_id(spec: str) -> bool:
    return bool(_CELL_ID.match(spec))


def plan_cell(cell_id: str, config_path: str | None = None, cwd: Path | None = None) -> Plan:
    """The one-cell plan for an id such as ``llama3-8b/scan-off/int8/L32`` (any depth of a configured series)."""
    m = _CELL_ID.match(cell_id)
    if not m:
        raise InputError(f"{cell_id!r} is neither a file nor a cell id such as llama3-8b/scan-off/int8/L32")
    p = plan(config_path, only=f"id={cell_id}", layers=m.group(1), cwd=cwd)
    if not p.cells:
        raise InputError(f"{cell_id}: no such cell in the matrix of {p.config.source} (see `hlo-audit list`)")
    return p


def cell_result(cell_id: str, config_path: str | None = None, use_cache: bool = True) -> CellResult:
    """One cell's result: from the cache when it is there, else lowered now. Unavailable or failed: an input error."""
    result = next(execute(plan_cell(cell_id, config_path), use_cache=use_cache))
    if result.status != "ok":
        raise InputError(f"{cell_id}: {result.status}: {result.message}")
    return result


@dataclass(frozen=True)
class Source:
    """What `rng` and `explain` read, whether from a file or a cell: parameter, RNG and constants records."""

    label: str
    params: list[dict]  # EntryParam.to_record() of each entry parameter
    rng: dict  # RngReport.to_record()
    constants: dict | None = None  # ConstantReport.to_record(): captured state, literal RNG keys
    launches: dict | None = None  # a GPU program's launches per step (LaunchReport.to_record), when known


def load_source(spec: str, config_path: str | None = None, module: str | None = None, stage: str = "before",
                use_cache: bool = True) -> Source:
    """An HLO file, '-' or dump folder (parsed now), or a cell id (its analysed result: cached, else lowered)."""
    if spec == "-" or os.path.exists(spec) or not is_cell_id(spec):
        analysis = analyze_input(spec, module, stage)
        return Source(analysis.source, [p.to_record() for p in analysis.params], analysis.rng.to_record(),
                      analysis.constants.to_record(), dump_launches(analysis))
    result = cell_result(spec, config_path, use_cache)
    return Source(spec, result.params, result.rng, result.constants, result.launches)


@dataclass(frozen=True)
class Unreadable:
    """An input `count` could not read: its one-line error names the file (and line)."""

    source: str
    error: str


def analyze_input(spec: str, module: str | None = None, stage: str = "before") -> Analysis:
    """One HLO file, '-' or dump folder, parsed and analysed."""
    text, source = read_input(spec, module, stage)
    return analyze(text, source)


def diff(old: Analysis, new: Analysis, max_text_lines: int) -> ModuleDiff:
    """What changed from ``old`` to ``new``, with a verdict (``hlo_audit.hlo.diff``)."""
    return diff_modules(old, new, max_text_lines=max_text_lines)


def dump_launches(analysis: Analysis) -> dict | None:
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
    return launch_report(sequence, metadata, module, params, str(dump.sequence)).to_record()


def launches_diff(old: dict | None, new: dict | None) -> dict | None:
    """Two GPU programs' launches per step side by side (``gate.launch_changes``), None unless both have them."""
    if old is None or new is None:
        return None
    return launch_changes(old, new) or {"golden": {k: old[k] for k in ("total", "scalar", "collectives")},
                                        "now": {k: new[k] for k in ("total", "scalar", "collectives")},
                                        "delta": {}, "groups": [], "lines": []}


def analyze_each(specs: list[str], module: str | None = None, stage: str = "before") -> list[Analysis | Unreadable]:
    """Each input analysed on its own, so one bad file costs only its own report."""
    results: list[Analysis | Unreadable] = []
    for spec in specs:
        try:
            results.append(analyze_input(spec, module, stage))
        except (HloParseError, InputError) as exc:
            results.append(Unreadable(spec, str(exc)))
    return results


def execute(p: Plan, jobs: int = 1, use_cache: bool = True) -> Iterator[CellResult]:
    yield from run_cells(p.cells, Cache(p.config.cache_dir, enabled=use_cache), jobs=jobs)


def scaling(p: Plan, results: list[CellResult]) -> list[Series]:
    return fit_series(results, p.full_depth)


def slopes_by_cell(p: Plan, results: list[CellResult]) -> dict[str, float]:
    """Each cell's series' entry parameters per layer (cells of a series of one depth have none)."""
    by_series = {s.cell.series: s.total.slope for s in scaling(p, results)}
    return {c.id: by_series[c.series] for c in p.cells if c.series in by_series}


def explain_source(spec: str, config_path: str | None = None, module: str | None = None, stage: str = "before",
                   use_cache: bool = True, depth: int = 3, top: int = 8) -> tuple[Node, Node | None]:
    """The explain trees of a cell id (from the cache, else lowered) or an HLO file, '-' or dump folder: its entry
    parameters', and, for a step that closes over state, its captured arrays' (known for cells only)."""
    return explain_trees(load_source(spec, config_path, module, stage, use_cache), depth, top)


def explain_trees(source: Source, depth: int = 3, top: int = 8) -> tuple[Node, Node | None]:
    """``explain_source`` of a source already loaded (its launches, for a GPU program, are the source's)."""
    # Each RNG parameter's stream verdict, so a node can say how much of it is drawn and how much buys nothing.
    verdict = {s[part]: s["verdict"] for s in source.rng["stream_list"] for part in ("key", "count")
               if s[part] is not None}
    params = [{**p, "rng_verdict": verdict.get(p["index"])} for p in source.params]
    captured = ((source.constants or {}).get("captured") or {}).get("arrays_list", [])
    tree = explain(params, source.label, depth=depth, top=top)
    return tree, explain(captured, f"{source.label} captured", depth=depth, top=top) if captured else None


# --------------------------------------------------------------------------------------------------------------
# Goldens and the gate
# --------------------------------------------------------------------------------------------------------------


def _series_by_cell(p: Plan, results: list[CellResult]) -> dict[str, Series]:
    by_series = {s.cell.series: s for s in scaling(p, results)}
    return {r.cell.id: by_series[r.cell.series] for r in results if r.cell.series in by_series}


def _text_owners(results: list[CellResult], series: dict[str, Series]) -> set[str]:
    """Cells whose normalized text is kept: the shallowest of each series, and cells without a series."""
    return {r.cell.id for r in results if r.status == "ok" and (r.cell.id not in series or series[r.cell.id].cell == r.cell)}


def normalized_text(cache: Cache, result: CellResult) -> str:
    """The cell's canonical text: computed when it was analysed, else from the cache; parsed again only for an
    entry the cache holds no canonical text for."""
    normalized = result.normalized or cache.normalized_text(result.key)
    if normalized is not None:
        return normalized
    text = result.text or cache.hlo_text(result.key)
    if text is None:
        raise InputError(f"{result.cell.id}: HLO text is not in the cache; run again without --no-cache")
    # Text-derived paths on both sides of the comparison, so golden and check always agree on names.
    return analyze(text, result.cell.id).normalized


def full_matrix(p: Plan) -> list[Cell]:
    return p.config.cells(p.full_depth if p.config.uses_full_depth else None)


def full_matrix_ids(p: Plan) -> set[str]:
    return {c.id for c in full_matrix(p)}


def regenerate_command(config_path: str | None) -> str:
    return "hlo-audit golden update" + (f" --config {config_path}" if config_path else "")


def check(p: Plan, results: list[CellResult], config_path: str | None = None, report_stale: bool = True) -> CheckReport:
    policy = Policy(p.config.policy, tuple(
        Waiver(rule=w["rule"], reason=w["reason"], pattern=w.get("pattern"),
               match={k: v for k, v in w.items() if k not in ("rule", "reason", "pattern")}, index=i,
               source=f"{p.config.source}: waive[{i}]")
        for i, w in enumerate(p.config.waivers)), memory_tolerance=p.config.memory_tolerance)
    gate = Gate(policy, regenerate_command(config_path))
    series = _series_by_cell(p, results)
    owners = _text_owners(results, series)
    cache = Cache(p.config.cache_dir)
    findings: list[Finding] = []
    for r in results:
        stored = golden.load(p.config.golden_dir, r.cell.id)
        text = normalized_text(cache, r) if r.cell.id in owners and stored is not None and stored.hlo is not None else None
        findings.extend(gate.check(r, stored, series.get(r.cell.id), text))
    if report_stale:
        findings.extend(stale(golden.stored_ids(p.config.golden_dir), full_matrix_ids(p)))
    findings.extend(stale_waivers(gate, results, full_matrix(p)))
    return CheckReport(findings, results)


def update_goldens(p: Plan, results: list[CellResult], prune: bool = False) -> golden.UpdateReport:
    series = _series_by_cell(p, results)
    owners = _text_owners(results, series)
    cache = Cache(p.config.cache_dir)
    entries = [(r, series.get(r.cell.id), normalized_text(cache, r) if r.cell.id in owners else None) for r in results]
    matrix_ids = full_matrix_ids(p) if prune else set()
    prune_ids = [cid for cid in golden.stored_ids(p.config.golden_dir) if cid not in matrix_ids] if prune else []
    return golden.update(p.config.golden_dir, entries, prune_ids)


def merge_check_reports(paths: list[str]) -> CheckReport:
    """Findings and cells of several shards' JSON; a finding reported by two shards (stale) counts once."""

    findings: dict[tuple, Finding] = {}
    results: list[CellResult] = []
    for path in paths:
        try:
            doc = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise InputError(f"{path}: no such file") from None
        except (OSError, ValueError) as exc:
            raise InputError(f"{path}: not a check JSON report: {exc}") from None
        if doc.get("schema") != "hlo-audit/check/v1":
            raise InputError(f"{path}: not a `hlo-audit check --format json` report (schema {doc.get('schema')!r})")
        for f in doc["findings"]:
            finding = Finding(f["cell"], f["severity"], f["rule"], f["message"], f.get("details", {}))
            findings[(finding.cell, finding.rule, finding.severity, finding.message)] = finding
        results.extend(_result_from_cell_record(c) for c in doc["cells"])
    return CheckReport(list(findings.values()), results)


def _result_from_cell_record(c: dict) -> CellResult:
    cell = Cell.from_record(c)
    summary = None if c["entry_params"] is None else {k: c[k] for k in ("entry_params", "by_dtype", "by_role", "groups")}
    return CellResult(cell=cell, status=c["status"], message=c["message"], summary=summary, cached=c["cached"])


# --------------------------------------------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------------------------------------------


def report(p: Plan, results: list[CellResult]) -> matrix_report.MatrixReport:
    """The matrix against its goldens, scan pairs and depth scaling, for ``report`` and ``params_frame``."""
    goldens = {}
    for r in results:
        stored = golden.load(p.config.golden_dir, r.cell.id)
        goldens[r.cell.id] = stored.record if stored is not None else None
    return matrix_report.build(results, scaling(p, results), goldens)


def params_frame(config: str | None = None, only: str | None = None, layers: str | None = None, jobs: int = 1,
                 use_cache: bool = True):
    """The tidy DataFrame of the configured matrix: one row per cell x dtype x role.

    Columns: id, model, scan, quant, layers, platform, stage, dtype, role, count, bytes, golden_count,
    golden_delta (nullable integers: <NA> where there is no golden to compare with). Cells are read from the
    results cache where they are, lowered otherwise; ``only`` and ``layers`` are the CLI's ``--only`` and
    ``--layers``.
    """
    p = plan(config, only, None, layers)
    return tidy_frame(report(p, list(execute(p, jobs=jobs, use_cache=use_cache))))
