"""Stable machine-readable output (``--format json``). Keys are part of the CLI contract; see docs/commands.md."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict

from hlo_audit.analysed import Constants, Launches, RngSummary
from hlo_audit.comparison import CellDelta, Structural
from hlo_audit.hlo.analysis import Analysis
from hlo_audit.merge import cell_record, check_record, finding_record
from hlo_audit.report import measure_words
from hlo_audit.rules.wording import launch_change_record

COUNT_SCHEMA = "hlo-audit/count/v1"
DIFF_SCHEMA = "hlo-audit/diff/v2"


def count_record(a: Analysis, with_params: bool = False, launches: Launches | None = None) -> dict:
    s = a.summary
    record = {
        "source": a.source,
        "module": a.module.name,
        "entry_params": s.entry_params,
        "by_dtype": s.by_dtype,
        "by_role": s.by_role,
        "rng_params": s.rng_params,
        "bytes_by_role": s.bytes_by_role,
        "groups": s.groups,
        "constants": a.constants.to_record(),
        # A GPU dump folder's module: what one step launches (its thunk sequence); null for other inputs.
        "kernels": launches.to_record() if launches is not None else None,
    }
    if with_params:
        record["params"] = [{**p.to_record(), "name": p.name, "layout": p.shape.layout, "sharding": p.sharding}
                            for p in a.params]
    return record


def format_count(analyses: Sequence, with_params: bool = False, launches: Sequence | None = None) -> str:
    """Every input in order: its counts, or ``{"source", "error"}`` for one that could not be read."""
    launches = launches or [None] * len(analyses)
    modules = [count_record(a, with_params, k) if isinstance(a, Analysis) else {"source": a.source, "error": a.error}
               for a, k in zip(analyses, launches)]
    doc = {"schema": COUNT_SCHEMA, "modules": modules}
    return json.dumps(doc, indent=2) + "\n"


def diff_record(structural: Structural, old: str, new: str, launches=None) -> dict:
    d, params = structural.diff, structural.params
    return {
        "old": old,
        "new": new,
        "verdict": d.verdict,
        "changes": d.changes,
        # The entry parameters as `check` compares them (compare.ParamDelta): in all, and the deltas by dtype and role.
        "entry_params": {"old": params.golden, "new": params.now},
        "by_dtype_delta": dict(params.by_dtype),
        "by_role_delta": dict(params.by_role),
        "params_added": [asdict(g) for g in d.params_added],
        "params_removed": [asdict(g) for g in d.params_removed],
        "opcode_dtype_delta": d.opcode_dtype_delta,
        "computations_added": d.computations_added,
        "computations_removed": d.computations_removed,
        # Every difference named (hlo.changes.Change.to_record: kind, action, subject, place, count, per_step,
        # before, after, bytes, flops, instructions, groups, layers), most costly kinds first; the match in numbers.
        "named": [c.to_record() for c in d.named],
        "match": d.match.to_record() if d.match is not None else None,
        # The two programs' sizes, as `check`'s program_size finding reads them (compare.Structural.sizes).
        "sizes": {k: {"old": a, "new": b} for k, (a, b) in structural.sizes.items()},
        "per_step_by_opcode": structural.per_step_by_opcode,
        "text_diff": d.text_diff,
        "text_diff_omitted": d.text_diff_omitted,
        "constants_delta": d.constants,
        # Two GPU dump folders: kernels per step old ("golden") and new ("now"), the launch groups that moved.
        "kernels": launch_change_record(launches) if launches is not None else None,
    }


def format_diff(structural: Structural, old: str, new: str, launches=None) -> str:
    return json.dumps({"schema": DIFF_SCHEMA, **diff_record(structural, old, new, launches)}, indent=2) + "\n"


RUN_SCHEMA = "hlo-audit/run/v1"
SCALING_SCHEMA = "hlo-audit/scaling/v1"


def format_run(results, slopes: dict[str, float], source: str) -> str:
    doc = {"schema": RUN_SCHEMA, "config": source,
           "cells": [cell_record(r, slopes.get(r.cell.id)) for r in results]}
    return json.dumps(doc, indent=2) + "\n"


def series_record(s) -> dict:
    def lines(d):
        return {k: {"slope": v.slope, "intercept": v.intercept, "exact": v.exact} for k, v in d.items()}

    return {"series": s.id, "model": s.cell.model, "scan": s.cell.scan_label, "quant": s.cell.quant,
            "depths": list(s.depths), "full_depth": s.full_depth,
            "total": {"slope": s.total.slope, "intercept": s.total.intercept, "exact": s.total.exact},
            "by_dtype": lines(s.by_dtype), "by_role": lines(s.by_role),
            "kernels": lines(s.launches) if s.launches else None, "projected": s.projected()}


def format_scaling(series) -> str:
    return json.dumps({"schema": SCALING_SCHEMA, "series": [series_record(s) for s in series]}, indent=2) + "\n"


REPORT_SCHEMA = "hlo-audit/report/v1"


def report_record(view) -> dict:
    def side(r):
        return None if r is None else {
            "id": r.cell.id, "entry_params": r.entry_params, "u32": r.count("by_dtype", "u32"),
            "rng_params": r.rng_params}

    return {
        "cells": [{**cell_record(v.result), "golden": v.golden is not None, "golden_delta": v.total_delta,
                   "by_dtype_delta": v.delta("by_dtype"), "by_role_delta": v.delta("by_role"),
                   "memory_delta": v.memory_delta(), "kernels_delta": v.launches_delta(),
                   "constants_delta": v.constants_delta} for v in view.cells],
        "scan": [{"label": p.label, "model": p.cell.model, "quant": p.cell.quant, "layers": p.cell.layers,
                  "on": side(p.on), "off": side(p.off)}
                 for p in view.scan_pairs],
        "scaling": [series_record(s) for s in view.series],
        "rows": [asdict(row) for row in view.tidy_rows],
    }


def format_report(view) -> str:
    return json.dumps({"schema": REPORT_SCHEMA, **report_record(view)}, indent=2) + "\n"


EXPLAIN_SCHEMA = "hlo-audit/explain/v1"


def format_explain(node, captured=None, launches: Launches | None = None, against: CellDelta | None = None) -> str:
    return json.dumps({"schema": EXPLAIN_SCHEMA, "tree": node.to_record(),
                       "captured_tree": captured.to_record() if captured is not None else None,
                       "kernels": launches.to_record() if launches is not None else None,
                       "against_golden": delta_record(against) if against is not None else None}, indent=2) + "\n"


def delta_record(delta: CellDelta) -> dict:
    """A cell's comparison with its golden (``comparison.CellDelta``) as JSON: the numbers ``check`` judges by."""
    params, structural = delta.params, delta.structural
    return {"entry_params": {"golden": params.golden, "now": params.now},
            "by_dtype_delta": dict(params.by_dtype), "by_role_delta": dict(params.by_role),
            "text": delta.text.value,
            "sizes": ({k: {"golden": a, "now": b} for k, (a, b) in structural.sizes.items()}
                      if structural is not None else None),
            "per_step_by_opcode": structural.per_step_by_opcode if structural is not None else None}


def format_cells(cells, source: str) -> str:
    return json.dumps({"schema": "hlo-audit/list/v1", "config": source, "cells": [c.record() for c in cells]},
                      indent=2) + "\n"


def format_check(outcome) -> str:
    return json.dumps(check_record(outcome), indent=2) + "\n"


RNG_SCHEMA = "hlo-audit/rng/v1"


def format_rng(label: str, rng: RngSummary, streams: bool = False, constants: Constants | None = None) -> str:
    frozen = constants.frozen_rng if constants is not None else None  # RNG state written in as literals
    return json.dumps({"schema": RNG_SCHEMA, "source": label, **rng.to_record(with_streams=streams),
                       "frozen": None if frozen is None else {
                           "literal_keys": frozen.literal_keys, "literal_key_constants": frozen.literal_key_constants,
                           "used": frozen.used, "sites": list(frozen.sites),
                           "captured_streams": frozen.captured_streams}}, indent=2) + "\n"


# v2: each finding once, under "findings" (v1 repeated the host_cost ones under "host_cost").
MEASURE_SCHEMA = "hlo-audit/measure/v2"


def measure_record(report) -> dict:
    """The report as JSON: each cell's timing and host figure, each comparison with its verdicts."""
    def comparison(c) -> dict:
        return {"baseline": c.baseline, "cell": c.cell, "recorded": c.recorded, "leaves": list(c.leaves),
                "metrics": {m.metric: {"a": m.a.to_record(), "b": m.b.to_record(), "ratio": round(m.ratio, 4),
                                       "beyond_noise": m.beyond_noise, "verdict": measure_words.measured_change(m)}
                            for m in c.changes}}

    return {"schema": MEASURE_SCHEMA, "device": report.device,
            "rounds": {"rounds": report.rounds.rounds, "warmup": report.rounds.warmup, "calls": report.rounds.calls,
                       "host_calls": report.rounds.host_calls},
            "cells": [{"cell": row.cell, "problem": row.problem or None,
                       "timing": row.timing.to_record() if row.timing else None,
                       "host": row.host.to_record() if row.host else None,
                       "golden_host": row.golden_host.to_record() if row.golden_host else None}
                      for row in report.cells],
            "comparisons": [comparison(c) for c in report.comparisons],
            # What the gate found of the measured cells, as `check` writes its findings (each once: v1 wrote the
            # host_cost ones a second time, in brief, under "host_cost").
            "findings": [finding_record(f) for f in report.findings],
            "recorded": list(report.recorded), "notes": measure_words.measure_notes(report)}


def format_measure(report) -> str:
    return json.dumps(measure_record(report), indent=2) + "\n"
