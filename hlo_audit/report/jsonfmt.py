"""Stable machine-readable output (``--format json``). Keys are part of the CLI contract; see README."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict

from hlo_audit.hlo.analysis import Analysis
from hlo_audit.hlo.diff import ModuleDiff

COUNT_SCHEMA = "hlo-audit/count/v1"
DIFF_SCHEMA = "hlo-audit/diff/v1"


def count_record(a: Analysis, with_params: bool = False) -> dict:
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
    }
    if with_params:
        record["params"] = [
            {"index": p.index, "name": p.name, "path": p.path, "role": p.role, "dtype": p.dtype,
             "dims": list(p.shape.dims), "layout": p.shape.layout, "sharding": p.sharding,
             "pattern": p.pattern, "bytes": p.bytes}
            for p in a.params
        ]
    return record


def format_count(analyses: Sequence[Analysis], with_params: bool = False) -> str:
    doc = {"schema": COUNT_SCHEMA, "modules": [count_record(a, with_params) for a in analyses]}
    return json.dumps(doc, indent=2) + "\n"


def diff_record(d: ModuleDiff, old: str, new: str) -> dict:
    return {
        "old": old,
        "new": new,
        "verdict": d.verdict,
        "changes": d.changes,
        "entry_params": {"old": d.entry_params[0], "new": d.entry_params[1]},
        "by_dtype_delta": d.by_dtype_delta,
        "by_role_delta": d.by_role_delta,
        "params_added": [asdict(g) for g in d.params_added],
        "params_removed": [asdict(g) for g in d.params_removed],
        "opcode_dtype_delta": d.opcode_dtype_delta,
        "computations_added": d.computations_added,
        "computations_removed": d.computations_removed,
        "text_diff": d.text_diff,
        "text_diff_omitted": d.text_diff_omitted,
    }


def format_diff(d: ModuleDiff, old: str, new: str) -> str:
    return json.dumps({"schema": DIFF_SCHEMA, **diff_record(d, old, new)}, indent=2) + "\n"
