"""The check report as JSON, both ways, in one place: its schema (``CHECK_SCHEMA``), how a check's outcome is
written (``check_record``: ``check --format json``) and how shards' reports are read back and merged into one
outcome (``merge_check_reports``: `hlo-audit merge`), every field merge reads checked against what is written here.

A finding's ``details`` are shaped by its rule's spec (``RuleSpec.details``; a named rule's by the shape they share,
``details_record``); its ``message`` is ``report.words``'. A finding read back keeps both as its shard wrote them
(``findings.Worded``).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from hlo_audit import platforms
from hlo_audit.coverage import Coverage
from hlo_audit.coverage import merged as merged_coverage
from hlo_audit.files import read_bounded
from hlo_audit.findings import (
    Accept,
    Finding,
    LoweringFailure,
    Matches,
    NamedChange,
    Worded,
)
from hlo_audit.hlo.params import ParamSummary
from hlo_audit.judging.gate import unreached_findings
from hlo_audit.judging.outcome import Outcome
from hlo_audit.matrix import MAX_DEPTH, Cell, fingerprint, id_part_problem
from hlo_audit.plan import JUDGE_PARTS, Judge, Shard
from hlo_audit.policy import Policy
from hlo_audit.report.words import message
from hlo_audit.results import SEVERITIES, CellResult, FailedCell, LoweredCell, Severity, Status, UnavailableCell
from hlo_audit.rules import registry
from hlo_audit.rules.registry import Rule
from hlo_audit.stages import STAGES
from hlo_audit.targets.vocab import QUANT_MODES, STEPS
from hlo_audit.usage import InputError

Json = dict[str, Any]  # what this module writes and reads (the edge: JSON out, merge in)

# v2 (issue 48): ``shard.judged_by.tree``, the digest of the project's files the shard judged (``provenance``).
CHECK_SCHEMA = "hlo-audit/check/v2"
MAX_REPORT_BYTES = 256 << 20  # a check report of the 122-cell matrix is ~2 MB
MAX_REPORT_DEPTH = 64  # a check report nests ~8 deep (cells -> constants -> captured -> groups)


# --------------------------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------------------------


def cell_record(r: CellResult, slope: float | None = None) -> Json:
    """A cell's result as every JSON format lists it (``run``, ``check``, ``report``): a cell that did not lower
    with its analysis fields null or empty."""
    lowered = r if isinstance(r, LoweredCell) else None
    s = lowered.summary if lowered else None
    return {
        **r.cell.record(), "status": r.status, "message": r.message,
        "entry_params": s.entry_params if s else None,
        "by_dtype": s.by_dtype if s else {},
        "by_role": s.by_role if s else {},
        "rng_params": lowered.rng_params if lowered else None,
        "groups": s.groups if s else {},
        "slope_per_layer": slope,
        # RNG streams drawn / carried / unknown with per-pattern counts (the per-stream list: `hlo-audit rng`)
        "rng_streams": lowered.rng.to_record(with_streams=False) if lowered and lowered.rng else None,
        # Compiled cells only (null otherwise): memory_analysis() bytes by kind and cost_analysis() totals.
        "memory": lowered.memory if lowered else None, "cost": lowered.cost if lowered else None,
        # GPU cells of stages optimized and compiled (null otherwise): launches per step (hlo.launches), total,
        # by kind and category, scalar, collectives, reading RNG state, the scalar groups and every group.
        "kernels": lowered.launches.to_record() if lowered and lowered.launches else None,
        # Constants, the large ones, literal RNG keys, and the arrays the step captured (with their paths)
        "constants": lowered.constants.to_record() if lowered and lowered.constants else None,
        "cached": lowered.cached if lowered else False, "lower_seconds": lowered.lower_seconds if lowered else 0.0,
        # Why this run lowered it rather than serving it from the cache ("" where served, or with --no-cache)
        "relowered_because": r.relowered_because,
    }


def _named_details(facts: NamedChange) -> Json:
    """A named rule's finding: every change of its kind (kind, action, subject, place, counts, bytes, FLOPs: the
    HLO core's record, ``hlo.changes.Change.to_record``) and the numbers it judged by."""
    return {"regression": facts.worse, "changes": [c.to_record() for c in facts.changes],
            "kernels": [{"name": k.name, "golden": list(k.golden), "now": list(k.now)} for k in facts.kernels],
            "sizes": {k: {"golden": a, "now": b} for k, (a, b) in facts.sizes.items()},
            "by_opcode": dict(facts.by_opcode), "tolerance": facts.tolerance, "regenerate": facts.command}


def details_record(finding: Finding) -> Json:
    """A finding's numbers as JSON ``details``: what a script reads (``{}`` for kinds without numbers). A rule's are
    shaped by its spec (``RuleSpec.details``, in the rule's module), a named rule's here (``_named_details``, the
    shape every named rule shares); a finding read back keeps its shard's."""
    facts = finding.facts
    if isinstance(facts, Worded):
        return json.loads(facts.details)
    if isinstance(facts, Matches | LoweringFailure):
        return {}
    shape = registry.spec_of(finding.rule).details
    return shape(facts) if shape is not None else _named_details(facts)


def finding_record(f: Finding) -> Json:
    return {"cell": f.cell, "severity": f.severity, "rule": f.rule, "message": message(f),
            "details": details_record(f)}


def check_record(outcome: Outcome) -> Json:
    """``summary``: every finding by severity, the ``ok`` placeholders included (as v1 always had it). Added in v1
    without changing those: ``totals`` (the numbers every format prints: cells, cells by verdict, findings by
    severity without placeholders, folded advisories, stale goldens), ``verdicts`` (cell id -> verdict) and
    ``stale_goldens`` (their ids)."""
    s, shard = outcome.summary, outcome.shard
    return {"schema": CHECK_SCHEMA, "exit_code": outcome.exit_code, "summary": outcome.finding_counts,
            # shard K/N of the selection with this fingerprint, and its cell count: what `merge` checks
            "shard": None if shard is None else {"index": shard.index, "count": shard.count, "matrix": shard.matrix,
                                                 "cells": shard.cells,
                                                 "judged_by": _judge_record(shard.judge, outcome.tree)},
            "totals": {"cells": s.cells, "cells_by_verdict": dict(s.cells_by_verdict),
                       "findings_by_severity": dict(s.findings_by_severity), "folded_advisories": s.folded,
                       "stale_goldens": s.stale_goldens},
            "verdicts": outcome.verdicts, "stale_goldens": outcome.stale_goldens,
            # The one golden update that accepts every failing cell (null: none can be), and those cells' ids.
            "accept": None if outcome.accept is None else {"command": outcome.accept.command,
                                                           "cells": list(outcome.accept.ids)},
            "findings": [finding_record(f) for f in outcome.findings],
            "cells": [cell_record(r) for r in outcome.results],
            # What the cells reached of the pull request's changed lines (`check --changes`): only where given.
            **({"coverage": outcome.coverage.to_record()} if outcome.coverage is not None else {})}


def _judge_record(judge: Judge | None, tree: str) -> Json | None:
    """What judged a shard (``plan.Judge``): the project's commit, hlo-audit's version, the environment, config and
    policy fingerprints, the digest of the goldens judged against; and the digest of the project's files it judged
    (``tree``: ``provenance.tree_digest``)."""
    return None if judge is None else {**{part: getattr(judge, part) for part in JUDGE_PARTS}, "tree": tree}


# --------------------------------------------------------------------------------------------------------------
# Reading: shards' check JSON, validated, merged
# --------------------------------------------------------------------------------------------------------------

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
    details = _field(f, "details", where, dict, optional=True, default={})
    return Finding(_field(f, "cell", where, str), Severity(_one_of(f, "severity", where, SEVERITIES)),
                   _field(f, "rule", where, str), Worded(_field(f, "message", where, str), json.dumps(details),
                                                         details.get("dead_params", 0)))


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
    if (entry_params is None) == (status == Status.OK):  # a lowered cell's counts, and only a lowered cell's
        raise _Malformed(f"{where}.entry_params: {'null' if entry_params is None else entry_params} "
                         f"for a cell whose status is {status}")
    if cached and status != Status.OK:  # the results cache keeps lowered cells only
        raise _Malformed(f"{where}.cached: true for a cell whose status is {status}")
    cell = Cell.from_record(c)
    if _field(c, "id", where, str) != cell.id:
        raise _Malformed(f"{where}.id: {c['id'][:80]!r} is not the id its fields give ({cell.id})")
    if status == Status.UNAVAILABLE:
        return UnavailableCell(cell=cell, message=message)
    if status == Status.ERROR:
        return FailedCell(cell=cell, message=message)
    summary = ParamSummary(entry_params=entry_params, by_dtype=_counts(c, "by_dtype", where),
                           by_role=_counts(c, "by_role", where), groups=_counts(c, "groups", where), bytes_by_role={})
    return LoweredCell(cell=cell, message=message, summary=summary, cached=cached)


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
    if doc.get("schema") == "hlo-audit/check/v1":
        raise InputError(f"{path}: a check report of an older hlo-audit (schema hlo-audit/check/v1: it records no "
                         "digest of the tree it judged): run check again")
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
        judged_by = _field(shard, "judged_by", "shard", (dict, type(None)), optional=True)
        if judged_by is None:
            raise _Malformed("shard.judged_by: missing (written by an hlo-audit that did not record what judged its "
                             "cells: run check again)")
        judge = Judge(**{key: _field(judged_by, key, "shard.judged_by", str) for key in JUDGE_PARTS})
        tree = _field(judged_by, "tree", "shard.judged_by", str)
        findings = _field(doc, "findings", "report", list)
        cells = _field(doc, "cells", "report", list)
        parsed_findings = [_finding_from_record(f, f"findings[{i}]") for i, f in enumerate(findings)]
        results = [_result_from_cell_record(c, f"cells[{i}]") for i, c in enumerate(cells)]
    except _Malformed as exc:
        raise InputError(f"{path}: not a check JSON report: {exc}") from None
    if len(results) != shard["cells"]:
        raise InputError(f"{path}: shard {index}/{count} says {shard['cells']} cells but lists {len(results)}")
    return {**shard, "judged_by": judge, "tree": tree}, parsed_findings, results


def merge_check_reports(paths: list[str]) -> Outcome:
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
    coverages: list[Coverage | None] = []
    first: tuple[str, dict] | None = None
    for path in paths:
        doc = _read_check_report(path)
        shard, parsed_findings, parsed_results = _parsed_shard(path, doc)
        if first is None:
            first = (path, shard)
        elif (shard["count"], shard["matrix"]) != (first[1]["count"], first[1]["matrix"]):
            what = "shard count" if shard["count"] != first[1]["count"] else "matrix"
            raise InputError(f"{path}: shard {shard['index']}/{shard['count']} of matrix {shard['matrix']} is not from "
                             f"the run of {first[0]} (shard {first[1]['index']}/{first[1]['count']} of matrix "
                             f"{first[1]['matrix']}): another {what}")
        else:
            _same_judge(path, shard, *first)
        if shard["index"] in shards:
            raise InputError(f"{path}: shard {shard['index']}/{shard['count']} is given twice "
                             f"({shards[shard['index']]} and {path})")
        shards[shard["index"]] = path
        for finding in parsed_findings:
            if finding.rule != Rule.UNREACHED:  # of one shard's cells: judged again below, of all of them
                findings[(finding.cell, finding.rule, finding.severity, finding.facts.message)] = finding
        results.extend(parsed_results)
        coverages.append(_coverage(path, doc))
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
    changes = None
    if any(c is not None for c in coverages):
        if not all(c is not None for c in coverages):
            raise InputError("merge: some shards were checked with --changes and some without: check every shard "
                             "with the same diff")
        changes = merged_coverage(coverages)
        policy = Policy({Rule.UNREACHED: changes.action}, changes.waivers)
        findings.update({(f.cell, f.rule, f.severity, str(i)): f
                         for i, f in enumerate(unreached_findings(policy, changes))})
    return Outcome.merged(results, list(findings.values()), Shard(index=1, count=1, matrix=matrix, cells=len(results),
                                                                  judge=first[1]["judged_by"]), first[1]["tree"],
                          changes)


def _coverage(path: str, doc: dict) -> Coverage | None:
    """A shard's ``coverage`` (``check --changes``), None where it was checked without; one line where it is not
    one."""
    record = doc.get("coverage")
    if record is None:
        return None
    try:
        return Coverage.from_record(record)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise InputError(f"{path}: not a check JSON report: coverage: not a record of changed lines "
                         f"({exc!r})") from None


LAST_CHECK = "last-check.json"  # in cache_dir: the last `check`'s JSON report, what `golden update --failing` reads


def last_check_path(cache_dir: Path) -> Path:
    return Path(cache_dir) / LAST_CHECK


def failing_in(path: Path, judge: Judge) -> Accept | None:
    """The cells that failed in a check's JSON report (``path``: the last check's, kept in cache_dir), as its one
    accept command names them (``findings.Accept``); None when none failed. A report of another config (``judge``:
    this one's) is refused: its cells are not this matrix's."""
    if not path.exists():
        raise InputError(f"{path}: no check report here: run `hlo-audit check` first (every check keeps its report "
                         "there), then `hlo-audit golden update --failing`")
    shard, findings, _ = _parsed_shard(str(path), _read_check_report(str(path)))
    if shard["judged_by"].config != judge.config:
        raise InputError(f"{path}: the last check was of another config (matrix or golden folder) than this one: "
                         "run `hlo-audit check` again, then `hlo-audit golden update --failing`")
    return Accept.of(findings)


_JUDGE_PARTS = {"commit": "at another commit", "hlo_audit": "under another hlo-audit",
                "environment": "under another environment", "config": "under another config (matrix or golden folder)",
                "goldens": "against other goldens (the golden folder's content differs)",
                "policy": "under another policy (rule actions, waivers, tolerances)",
                "tree": "on another tree (the project's files differ: tracked or untracked, the config, the goldens)"}


def _same_judge(path: str, shard: dict, first_path: str, first: dict) -> None:
    """A shard judged otherwise than the first (at another commit, against other goldens, under another policy,
    config, hlo-audit or environment) is refused: merged, its cells' verdicts would read as this run's."""
    differences = first["judged_by"].differences(shard["judged_by"])
    # The tree by content after the commit's name: one HEAD with an edit left uncommitted between the two runs, or
    # two trees without git ("unknown" both), is another tree (``provenance``).
    if not differences and shard["tree"] != first["tree"]:
        differences = (("tree", first["tree"], shard["tree"]),)
    if differences:
        what, firsts, this = differences[0]
        raise InputError(f"{path}: shard {shard['index']}/{shard['count']} was judged "
                         f"{_JUDGE_PARTS[what]} than {first_path} (shard {first['index']}/{first['count']}): "
                         f"{this!r}, not {firsts!r}; merge only the shards of one run")


