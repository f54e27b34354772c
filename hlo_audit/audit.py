"""The pipeline as the CLI and the pytest plugin use it: config -> cells -> results -> scaling.

Kept apart from cli.py so that the CLI only parses options and formats, and so that library users get the
same behaviour with one call.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from hlo_audit import golden, matrix_report, platforms, preflight, scaffold
from hlo_audit.files import read_bounded
from hlo_audit.cache import Cache
from hlo_audit.config import DEFAULT_CONFIG_FILE, Config, ConfigError, load_config, resolve, validate
from hlo_audit.errors import InputError
from hlo_audit.explain import Node, explain
from hlo_audit.gate import CheckReport, Gate, Policy, Waiver, launch_changes, stale, stale_waivers
from hlo_audit.hlo.analysis import Analysis, analyze
from hlo_audit.hlo.diff import ModuleDiff, diff_modules
from hlo_audit.hlo.params import entry_params
from hlo_audit.hlo.source import read_input
from hlo_audit.hlo.text import HloParseError, parse_module
from hlo_audit.hlo.thunks import launch_report, thunk_dumps
from hlo_audit.matrix import (MAX_DEPTH, Cell, MatrixError, fingerprint, id_part_problem, parse_shard, selection,
                              shard_of)
from hlo_audit.report.frame import tidy_frame
from hlo_audit.results import SEVERITIES, CellResult, Finding
from hlo_audit.run import run_cells
from hlo_audit.scaling import Series, fit_series
from hlo_audit.stages import STAGES
from hlo_audit.targets import get_target
from hlo_audit.targets.vocab import QUANT_MODES, STEPS


@dataclass
class Plan:
    config: Config
    cells: list[Cell]  # what this run lowers: the selection, or its shard
    # Every cell of the matrix at this run's depths (before --only and --shard): which depth of a series is its
    # shallowest, and so keeps the text, is the whole series' business, not the selection's.
    universe: list[Cell] | None = None
    selected: list[Cell] | None = None  # the --only selection before --shard
    shard: tuple[int, int] | None = None

    def full_depth(self, model: str) -> int:
        return get_target(self.config.target, self.config.nnx).full_depth(model)

    @property
    def shard_record(self) -> dict:
        """What a check's JSON records so `merge` can tell its shards: K/N, the fingerprint of the selection they
        were dealt from, and this shard's cell count (0 when the dealing gave it none)."""
        k, n = self.shard or (1, 1)
        return {"index": k, "count": n, "matrix": fingerprint(self.selected if self.selected is not None
                                                              else self.cells), "cells": len(self.cells)}


def parse_layers(value: str | None) -> list[int | str] | None:
    """``--layers 32`` / ``--layers full`` / ``--layers 2,4,full`` (depths 1..MAX_DEPTH)."""
    if not value:
        return None
    depths: list[int | str] = []
    for item in value.split(","):
        item = item.strip()
        if item == "full":
            depths.append("full")
        elif re.fullmatch(r"[0-9]+", item) and int(item) >= 1:
            if int(item) > MAX_DEPTH:
                raise MatrixError(f"--layers {item}: deeper than any model (MaxText's deepest has 126 layers); at "
                                  f"most {MAX_DEPTH}, or 'full' for the model's real depth")
            depths.append(int(item))
        else:
            raise MatrixError(f"--layers expects integers >= 1 or 'full', got {item!r}")
    return depths


def _universe(config: Config, depths: list[int | str] | None) -> list[Cell]:
    needs_depth = "full" in depths if depths else config.uses_full_depth
    full_depth = get_target(config.target, config.nnx).full_depth if needs_depth else None
    return config.cells(full_depth, depths)


def plan(config_path: str | None = None, only: str | Sequence[str] | None = None, shard: str | None = None,
         layers: str | None = None, cwd: Path | None = None) -> Plan:
    """The cells a command runs. ``only``: one ``--only`` spec or several (AND across keys, OR within one); a
    selection of no cell is a ``MatrixError`` naming the key's known values."""
    config = resolve(load_config(config_path, cwd))
    picked = parse_shard(shard)
    universe = _universe(config, parse_layers(layers))
    chosen = selection(universe, only)
    cells = chosen if picked is None else shard_of(chosen, *picked)
    return Plan(config=config, cells=cells, universe=universe, selected=chosen, shard=picked)


_CELL_ID = re.compile(r"^[^/\s]+/scan-(?:on|off)/[^/\s]+/L([0-9]+)(?:/[^/\s]+)*$")


def is_cell_id(spec: str) -> bool:
    return bool(_CELL_ID.match(spec))


def plan_cell(cell_id: str, config_path: str | None = None, cwd: Path | None = None) -> Plan:
    """The one-cell plan for an id such as ``llama3-8b/scan-off/int8/L32`` (any depth of a configured series)."""
    m = _CELL_ID.match(cell_id)
    if not m:
        raise InputError(f"{cell_id!r} is neither a file nor a cell id such as llama3-8b/scan-off/int8/L32")
    depth = int(m.group(1))
    if not 1 <= depth <= MAX_DEPTH:  # the id's own depth, not a --layers nobody gave
        raise InputError(f"{cell_id}: depth L{depth}: expected L1 to L{MAX_DEPTH}")
    config = resolve(load_config(config_path, cwd))
    universe = _universe(config, [depth])
    cells = [c for c in universe if c.id == cell_id]
    if not cells:
        raise InputError(f"{cell_id}: no such cell in the matrix of {config.source} (see `hlo-audit list`)")
    return Plan(config=config, cells=cells, universe=universe, selected=cells)


def cell_result(cell_id: str, config_path: str | None = None, use_cache: bool = True,
                refresh: bool = False) -> CellResult:
    """One cell's result: from the cache when it is there, else lowered now. Unavailable or failed: an input error."""
    result = next(execute(plan_cell(cell_id, config_path), use_cache=use_cache, refresh=refresh))
    if result.status != "ok":
        raise InputError(f"{cell_id}: {result.status}: {result.message}")
    return result


class CellNotLowered(Exception):
    """`lower`: the cell is unavailable here or failed to lower; the message says which and why."""


def cell_text(cell_id: str, config_path: str | None = None, normalized: bool = False, use_cache: bool = True) -> str:
    """A cell's module as hlo-audit lowered, analysed and cached it (the stage's text: XLA's printer without
    metadata, large constants as ``{...}``), or with ``normalized`` its canonical text, the text its golden
    keeps. From the cache when the cell is there, else lowered now (and cached)."""
    p = plan_cell(cell_id, config_path)
    result = next(execute(p, use_cache=use_cache))
    if result.status != "ok":
        raise CellNotLowered(f"{cell_id}: {result.status}: {result.message}")
    cache = Cache(p.config.cache_dir, enabled=use_cache)
    if normalized:
        return normalized_text(result)
    text = result.text if result.text is not None else cache.hlo_text(result.key)
    if text is None:  # a result cached without its module: lower it again
        result = next(execute(p, use_cache=False))
        if result.status != "ok":
            raise CellNotLowered(f"{cell_id}: {result.status}: {result.message}")
        text = result.text
    return text


@dataclass(frozen=True)
class Source:
    """What `rng` and `explain` read, whether from a file or a cell: parameter, RNG and constants records."""

    label: str
    params: list[dict]  # EntryParam.to_record() of each entry parameter
    rng: dict  # RngReport.to_record()
    constants: dict | None = None  # ConstantReport.to_record(): captured state, literal RNG keys
    launches: dict | None = None  # a GPU program's launches per step (LaunchReport.to_record), when known


def load_source(spec: str, config_path: str | None = None, module: str | None = None, stage: str = "before",
                use_cache: bool = True, refresh: bool = False) -> Source:
    """An HLO file, '-' or dump folder (parsed now), or a cell id (its analysed result: cached, else lowered)."""
    if spec == "-" or os.path.exists(spec) or not is_cell_id(spec):
        analysis = analyze_input(spec, module, stage)
        return Source(analysis.source, [p.to_record() for p in analysis.params], analysis.rng.to_record(),
                      analysis.constants.to_record(), dump_launches(analysis))
    result = cell_result(spec, config_path, use_cache, refresh)
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


def execute(p: Plan, jobs: int = 1, use_cache: bool = True, refresh: bool = False,
            started=None) -> Iterator[CellResult]:
    """Every cell's result (``run.run_cells``). ``use_cache=False``: the cache is neither read nor written;
    ``refresh``: every cell is lowered again and its entry rewritten; ``started(cell)``: called when a cell's
    lowering begins."""
    yield from run_cells(p.cells, Cache(p.config.cache_dir, enabled=use_cache, refresh=refresh), jobs=jobs,
                         started=started)


def scaling(p: Plan, results: list[CellResult]) -> list[Series]:
    return fit_series(results, p.full_depth)


def slopes_by_cell(p: Plan, results: list[CellResult]) -> dict[str, float]:
    """Each cell's series' entry parameters per layer (cells of a series of one depth have none)."""
    by_series = {s.cell.series: s.total.slope for s in scaling(p, results)}
    return {c.id: by_series[c.series] for c in p.cells if c.series in by_series}


def explain_source(spec: str, config_path: str | None = None, module: str | None = None, stage: str = "before",
                   use_cache: bool = True, depth: int = 3, top: int = 8,
                   refresh: bool = False) -> tuple[Node, Node | None]:
    """The explain trees of a cell id (from the cache, else lowered) or an HLO file, '-' or dump folder: its entry
    parameters', and, for a step that closes over state, its captured arrays' (known for cells only)."""
    return explain_trees(load_source(spec, config_path, module, stage, use_cache, refresh), depth, top)


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
    return {r.cell.id for r in results
            if r.status == "ok" and (r.cell.id not in series or series[r.cell.id].cell == r.cell)}


def normalized_text(result: CellResult) -> str:
    """The cell's canonical text. ``run_cells`` gives every ok result its own: computed with the analysis, or read
    from the cache with the result and verified there (a truncated or foreign text is a miss, never a golden)."""
    if result.normalized is not None:
        return result.normalized
    if result.text is None:
        raise InputError(f"{result.cell.id}: its canonical text is not known (a result not from run_cells); "
                         "run the cell again")
    # Text-derived paths on both sides of the comparison, so golden and check always agree on names.
    return analyze(result.text, result.cell.id).normalized


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
               source=(f"built-in default waive[{i}]" if p.config.waivers_built_in
                       else f"{p.config.source}: waive[{i}]"),
               built_in=p.config.waivers_built_in)
        for i, w in enumerate(p.config.waivers)), memory_tolerance=p.config.memory_tolerance)
    gate = Gate(policy, regenerate_command(config_path))
    series = _series_by_cell(p, results)
    owners = _text_owners(results, series)
    findings: list[Finding] = []
    # One tree, read whole: a `golden update` swapping it meanwhile is never half seen (golden.read_snapshot).
    goldens, stored_ids = golden.read_snapshot(p.config.golden_dir, lambda tree: (
        {r.cell.id: tree.load(r.cell.id) for r in results}, tree.stored_ids() if report_stale else []))
    for r in results:
        stored = goldens[r.cell.id]
        compared = stored is not None and (stored.hlo is not None or stored.text_problem is not None)
        text = normalized_text(r) if r.cell.id in owners and compared else None
        findings.extend(gate.check(r, stored, series.get(r.cell.id), text))
    if report_stale:
        findings.extend(stale(stored_ids, full_matrix_ids(p)))
    findings.extend(stale_waivers(gate, results, full_matrix(p)))
    return CheckReport(findings, results, shard=p.shard_record)


_SUMMARY_KEYS = ("entry_params", "by_dtype", "by_role", "groups")


def update_goldens(p: Plan, results: list[CellResult], prune: bool = False) -> golden.UpdateReport:
    """Write the goldens of ``results``; with ``prune``, remove hlo-audit's goldens of cells no longer in the matrix.

    A series only partly in this run (``--only id=<one depth>``, or a depth that failed to lower) is fitted with
    the stored goldens of its other depths, so its slopes block stays; its text stays with the matrix's shallowest
    depth of the series, whichever depths this run selected.
    """
    root = p.config.golden_dir
    universe = p.universe if p.universe is not None else p.cells
    lowered = {r.cell.id for r in results if r.status == "ok"}
    touched = {r.cell.series for r in results if r.status == "ok"}
    others = []
    for cell in universe:
        if cell.series in touched and cell.id not in lowered:
            stored = golden.load(root, cell.id)
            if stored is not None and not stored.damaged:
                others.append(CellResult(cell=cell, status="ok", summary={k: stored.record[k] for k in _SUMMARY_KEYS}))
    by_series = {s.cell.series: s for s in scaling(p, [*results, *others])}
    shallowest: dict[tuple, int] = {}
    for cell in [*universe, *(r.cell for r in results)]:
        shallowest[cell.series] = min(shallowest.get(cell.series, cell.layers), cell.layers)
    entries = []
    for r in results:
        owner = r.status == "ok" and shallowest[r.cell.series] == r.cell.layers
        entries.append((r, by_series.get(r.cell.series), normalized_text(r) if owner else None))
    matrix_ids = full_matrix_ids(p) if prune else set()
    prune_ids = [cid for cid in golden.stored_ids(root) if cid not in matrix_ids] if prune else []
    return golden.update(root, entries, prune_ids)


# --------------------------------------------------------------------------------------------------------------
# merge: shards' check JSON, validated
# --------------------------------------------------------------------------------------------------------------

CHECK_SCHEMA = "hlo-audit/check/v1"
MAX_REPORT_BYTES = 256 << 20  # a check report of the 122-cell matrix is ~2 MB
MAX_REPORT_DEPTH = 64  # a check report nests ~8 deep (cells -> constants -> captured -> groups)


class _Malformed(Exception):
    """Where in a check report it stops being one, and why."""


def _nesting_depth(value) -> int:
    """How deep ``value`` nests, iteratively (a report nested 10^5 deep must not exhaust the stack)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if depth > MAX_REPORT_DEPTH:
            break
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        stack.extend((child, depth + 1) for child in children)
    return deepest


def _field(record: dict, key: str, where: str, kind, optional: bool = False, default=None):
    if key not in record:
        if optional:
            return default
        raise _Malformed(f"{where}: missing {key!r}")
    value = record[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        names = " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
        raise _Malformed(f"{where}.{key}: expected {names}, got {type(value).__name__}")
    return value


def _counts(record: dict, key: str, where: str) -> dict[str, int]:
    value = _field(record, key, where, dict)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in value.values()):
        raise _Malformed(f"{where}.{key}: expected a table of counts")
    return value


def _one_of(record: dict, key: str, where: str, known, optional: bool = False, default=None) -> str:
    value = _field(record, key, where, str, optional, default)
    if value not in known:
        raise _Malformed(f"{where}.{key}: expected one of {', '.join(known)}, got {value[:40]!r}")
    return value


def _finding_from_record(f, where: str) -> Finding:
    if not isinstance(f, dict):
        raise _Malformed(f"{where}: expected an object, got {type(f).__name__}")
    return Finding(_field(f, "cell", where, str), _one_of(f, "severity", where, SEVERITIES),
                   _field(f, "rule", where, str), _field(f, "message", where, str),
                   _field(f, "details", where, dict, optional=True, default={}))


def _result_from_cell_record(c, where: str = "cell") -> CellResult:
    if not isinstance(c, dict):
        raise _Malformed(f"{where}: expected an object, got {type(c).__name__}")
    for key in ("model", "quant", "target"):
        value = _field(c, key, where, str)
        if problem := id_part_problem(value) if key != "target" else None:
            raise _Malformed(f"{where}.{key}: {value[:40]!r} {problem}")
    for key in ("layers", "batch", "seq"):
        value = _field(c, key, where, int)
        if not 1 <= value <= (MAX_DEPTH if key == "layers" else 1 << 40):
            raise _Malformed(f"{where}.{key}: out of range: {value}")
    _field(c, "prefill", where, int, optional=True)
    _one_of(c, "scan", where, ("on", "off"))
    _one_of(c, "quant_mode", where, QUANT_MODES, optional=True, default="train")
    _one_of(c, "step", where, STEPS)
    _one_of(c, "platform", where, tuple(platforms.PLATFORMS))
    _one_of(c, "stage", where, STAGES)
    for key in ("topology", "cuda_arch"):
        value = _field(c, key, where, str, optional=True, default="")
        if value and (problem := id_part_problem(value)):
            raise _Malformed(f"{where}.{key}: {value[:40]!r} {problem}")
    status = _one_of(c, "status", where, ("ok", "unavailable", "error"))
    message = _field(c, "message", where, str)
    cached = _field(c, "cached", where, bool)
    entry_params = _field(c, "entry_params", where, (int, type(None)))
    summary = None
    if entry_params is not None:
        summary = {"entry_params": entry_params, **{k: _counts(c, k, where) for k in _SUMMARY_KEYS[1:]}}
    cell = Cell.from_record(c)
    if _field(c, "id", where, str) != cell.id:
        raise _Malformed(f"{where}.id: {c['id'][:80]!r} is not the id its fields give ({cell.id})")
    return CellResult(cell=cell, status=status, message=message, summary=summary, cached=cached)


def _read_check_report(path: str) -> dict:
    """One shard's `check --format json`, every field merge reads checked; anything else is one line naming it."""
    data = read_bounded(path, MAX_REPORT_BYTES, "a check JSON report", InputError, fifo=False)
    try:
        doc = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not a check JSON report: not UTF-8 (byte {exc.start})") from None
    except RecursionError:
        raise InputError(f"{path}: not a check JSON report: nested deeper than {MAX_REPORT_DEPTH} levels") from None
    except ValueError as exc:
        raise InputError(f"{path}: not a check JSON report: {exc}") from None
    if not isinstance(doc, dict):
        raise InputError(f"{path}: not a check JSON report: a JSON {type(doc).__name__}, not an object")
    if doc.get("schema") != CHECK_SCHEMA:
        schema = doc.get("schema")
        raise InputError(f"{path}: not a `hlo-audit check --format json` report "
                         f"(schema {schema[:60] if isinstance(schema, str) else schema!r})")
    if _nesting_depth(doc) > MAX_REPORT_DEPTH:
        raise InputError(f"{path}: not a check JSON report: nested deeper than {MAX_REPORT_DEPTH} levels")
    return doc


def _parsed_shard(path: str, doc: dict) -> tuple[dict, list[Finding], list[CellResult]]:
    try:
        shard = doc.get("shard")
        if shard is None:
            raise _Malformed("shard: missing (written by an hlo-audit without shard records: run check again)")
        if not isinstance(shard, dict):
            raise _Malformed(f"shard: expected an object, got {type(shard).__name__}")
        index, count = _field(shard, "index", "shard", int), _field(shard, "count", "shard", int)
        if not 1 <= index <= count:
            raise _Malformed(f"shard: {index}/{count} is not a shard K/N with 1 <= K <= N")
        _field(shard, "matrix", "shard", str), _field(shard, "cells", "shard", int)
        findings = _field(doc, "findings", "report", list)
        cells = _field(doc, "cells", "report", list)
        parsed_findings = [_finding_from_record(f, f"findings[{i}]") for i, f in enumerate(findings)]
        results = [_result_from_cell_record(c, f"cells[{i}]") for i, c in enumerate(cells)]
    except _Malformed as exc:
        raise InputError(f"{path}: not a check JSON report: {exc}") from None
    if len(results) != shard["cells"]:
        raise InputError(f"{path}: shard {index}/{count} says {shard['cells']} cells but lists {len(results)}")
    return shard, parsed_findings, results


def merge_check_reports(paths: list[str]) -> CheckReport:
    """The shards of one `check --shard K/N` run as one report; a finding reported by two shards (stale) counts once.

    Every shard of the run must be there exactly once, all from the same selection of the same matrix (the
    fingerprint each records), and together they must hold exactly that selection's cells: a missing shard, a
    repeated one, one from another matrix or a shard that lost cells is one line and exit 2. A shard the dealing
    left empty is fine: its record says 0 cells, and the others add up to the matrix without it.
    """
    if not paths:
        raise InputError("merge: give the check JSON report of every shard")
    shards: dict[int, str] = {}
    findings: dict[tuple, Finding] = {}
    results: list[CellResult] = []
    first: tuple[str, dict] | None = None
    for path in paths:
        shard, parsed_findings, parsed_results = _parsed_shard(path, _read_check_report(path))
        if first is None:
            first = (path, shard)
        elif (shard["count"], shard["matrix"]) != (first[1]["count"], first[1]["matrix"]):
            what = "shard count" if shard["count"] != first[1]["count"] else "matrix"
            raise InputError(f"{path}: shard {shard['index']}/{shard['count']} of matrix {shard['matrix']} is not from "
                             f"the run of {first[0]} (shard {first[1]['index']}/{first[1]['count']} of matrix "
                             f"{first[1]['matrix']}): another {what}")
        if shard["index"] in shards:
            raise InputError(f"{path}: shard {shard['index']}/{shard['count']} is given twice "
                             f"({shards[shard['index']]} and {path})")
        shards[shard["index"]] = path
        for finding in parsed_findings:
            findings[(finding.cell, finding.rule, finding.severity, finding.message)] = finding
        results.extend(parsed_results)
    count, matrix = first[1]["count"], first[1]["matrix"]
    missing = [k for k in range(1, count + 1) if k not in shards]
    if missing:
        raise InputError(f"merge: shard {', '.join(f'{k}/{count}' for k in missing)} missing (given: "
                         f"{', '.join(f'{k}/{count}' for k in sorted(shards))})")
    ids = [r.cell.id for r in results]
    repeated = sorted(i for i, n in Counter(ids).items() if n > 1)
    if repeated:
        raise InputError(f"merge: cell {repeated[0]} is in two shards")
    if fingerprint(r.cell for r in results) != matrix:
        raise InputError(f"merge: the shards' {len(ids)} cells are not the matrix they were dealt from "
                         f"(fingerprint {matrix}): a shard lost or gained cells")
    return CheckReport(list(findings.values()), results,
                       shard={"index": 1, "count": 1, "matrix": matrix, "cells": len(results)})


# --------------------------------------------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------------------------------------------


def report(p: Plan, results: list[CellResult]) -> matrix_report.MatrixReport:
    """The matrix against its goldens, scan pairs and depth scaling, for ``report`` and ``params_frame``."""
    loaded = golden.read_snapshot(p.config.golden_dir, lambda tree: {r.cell.id: tree.load(r.cell.id) for r in results})
    goldens = {cid: stored.record if stored is not None and not stored.damaged else None
               for cid, stored in loaded.items()}
    return matrix_report.build(results, scaling(p, results), goldens)


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


# --------------------------------------------------------------------------------------------------------------
# init: a user's repository put under the gate
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class InitRequest:
    """What `hlo-audit init` was asked for: one target kind and its options."""

    kind: str  # "maxtext", "callable" or "nnx"
    models: tuple[str, ...] = ()
    layers: tuple[int, ...] = (2, 4)
    quants: tuple[str, ...] = ()  # maxtext: its quantizations
    function: str = ""  # callable: package.module:function
    factory: str = ""  # nnx: package.module:Factory
    factory_config: str | None = None  # nnx: package.module:callable returning the model's config object
    inputs: tuple[tuple[str, str], ...] = ()  # nnx: argument -> DTYPE[DIMS]
    args: tuple[tuple[str, object], ...] = ()  # nnx: constructor keyword arguments
    labels: str | None = None
    layers_field: str | None = None
    scan_field: str | None = None
    optimizer: str = "adamw"
    learning_rate: float = 1e-4
    shards: int = 2


def init_request(*, nnx: str | None, nnx_config: str | None, function: str | None, maxtext: bool,
                 models: Sequence[str], quant: str | None, layers: str, inputs: Sequence[str], args: Sequence[str],
                 labels: str | None, layers_field: str | None, scan_field: str | None, optimizer: str,
                 learning_rate: float, shards: int) -> InitRequest:
    """`hlo-audit init`'s options as a request: exactly one target kind, depths (no 'full': a scaffold names its
    series), ``NAME=VALUE`` pairs; a bad option is an InputError naming it."""
    kinds = [k for k, given in (("nnx", nnx), ("callable", function), ("maxtext", maxtext)) if given]
    if len(kinds) != 1:
        raise InputError("init: name the target: one of --nnx package.module:Factory, --callable "
                         "package.module:function, --maxtext")
    depths = parse_layers(layers) or []
    if not depths or "full" in depths:
        raise InputError(f"init --layers: give depths such as 2,4, got {layers!r}")
    return InitRequest(
        kind=kinds[0], models=tuple(models), layers=tuple(int(d) for d in depths),
        quants=tuple(q.strip() for q in quant.split(",")) if quant else (), function=function or "",
        factory=nnx or "", factory_config=nnx_config, inputs=tuple(_pairs(inputs, "--input")),
        args=tuple((k, _toml_value(v)) for k, v in _pairs(args, "--arg")), labels=labels,
        layers_field=layers_field, scan_field=scan_field, optimizer=optimizer, learning_rate=learning_rate,
        shards=shards)


def _pairs(values: Sequence[str], option: str) -> list[tuple[str, str]]:
    """``NAME=VALUE`` options as pairs; anything else is a usage error naming the option."""
    pairs = []
    for value in values:
        name, sep, rest = value.partition("=")
        if not sep or not name.strip() or not rest.strip():
            raise InputError(f"{option} expects NAME=VALUE, got {value!r}")
        pairs.append((name.strip(), rest.strip()))
    return pairs


def _toml_value(text: str):
    """``--arg width=16`` gives 16, ``rate=0.1`` 0.1, ``flag=true`` True; anything else stays a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def init_scaffold(folder: Path, request: InitRequest) -> scaffold.Scaffold:
    """The config and workflow for ``request``, the config read back and resolved as any config is (a bad option
    is a ConfigError or InputError naming it, before anything is written). Nothing is overwritten: a file init
    would write that exists already is an InputError naming it."""
    found = scaffold.existing(folder)
    if found:
        raise InputError(f"init: {', '.join(found)} already there in {folder}: init writes only what is not "
                         "(edit the config by hand, or remove them first)")
    if problem := scaffold.unwritable(folder):  # every path checked before any is written
        raise InputError(f"init: {problem}; nothing was written")
    library = None
    if request.kind == "maxtext":
        text = scaffold.maxtext_config(request.models or DEFAULTS_MODELS, request.quants or DEFAULTS_QUANTS,
                                       request.layers)
    elif request.kind == "callable":
        if not request.models:
            raise InputError("init --callable: name the models the function lowers (--model NAME, repeatable)")
        text = scaffold.callable_config(request.function, request.models, request.layers)
    else:
        preflight.check_jax_variables()
        from hlo_audit.targets import nnx  # noqa: PLC0415 (imports jax and the model's library)
        from hlo_audit.targets.nnx_spec import SpecError  # noqa: PLC0415

        try:
            spec = nnx.describe(request.factory, request.factory_config, dict(request.inputs), request.layers_field,
                                request.scan_field, request.labels, dict(request.args) or None)
        except SpecError as exc:
            raise InputError(f"init {exc.key}: {' '.join(str(exc).split())}") from None
        name = request.models[0] if request.models else _model_name(request)
        if len(request.models) > 1:
            raise InputError("init --nnx describes one model (--model NAME); add more to [nnx.models] by hand")
        text = scaffold.nnx_config(name, spec, request.layers, request.optimizer, request.learning_rate)
        library = nnx.library_versions(spec)
    try:
        resolve(validate(tomllib.loads(text), DEFAULT_CONFIG_FILE, folder))
    except ConfigError as exc:
        raise InputError(f"init: the config it would write is refused: {exc}") from None
    return scaffold.Scaffold(config=text, workflow=scaffold.workflow(
        scaffold.install_lines(request.kind, folder, library), request.shards))


DEFAULTS_MODELS = ("llama3-8b", "qwen3-1.7b", "deepseek3-test")
DEFAULTS_QUANTS = ("none", "int8", "fp8", "nanoo_fp8")


def _model_name(request: InitRequest) -> str:
    """A model's name from where it comes from: the config preset (``ModelConfig.qwen3_0p6b`` -> qwen3_0p6b), else
    the factory (``TinyLM`` -> tinylm)."""
    path = request.factory_config or request.factory
    name = path.rpartition(":")[2].rpartition(".")[2].lower()
    if problem := id_part_problem(name):
        raise InputError(f"init: model name {name!r} {problem}: give --model NAME")
    return name
