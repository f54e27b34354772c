#!/usr/bin/env python3
"""Seed 000's review table, reproduced: what its Dropout and AttentionOp fixes dropped from the optimized TPU step.

    python scripts/seed000_table.py [--models llama3-8b,deepseek3-test,qwen3-1.7b] [--maxtext] [--jobs 2]

For each of MaxText's three HLO-gate configs (v6e-4, 4 layers, batch 1, seq 128, scan on, stock model
configs) it runs the train step through XLA's TPU compiler twice, as hlo-audit's shipped TPU cells (stage
optimized: the after-optimizations module MaxText's hlo_diff_test diffs): as MaxText 0.2.5 ships it
("released") and with seed 000's fixes reverted ("reverted", tests/injected_maxtext.py, HLO_AUDIT_INJECT=
prefix), then diffs the two optimized modules with hlo-audit's diff. Per model it prints the verdict, the
u32 entry parameters each side has and how many the fixes dropped, by owner pattern.

The seed's own numbers (30 llama3_8b, 54 deepseek3, 18 qwen3_1.7b) were read off MaxText's reference files
(tests/utils/reference_hlo_*.txt: the first 2000 lines of the dump, which hold no ENTRY computation, only the
HloModule header with its entry_computation_layout). The table also gives that count: u32 shapes of rank >= 1
in the layout's parameters and results, dropped by the fixes. ``--maxtext`` also runs
MaxText's own train_compile (scripts/train_compile_dump.py: unsafe_rbg keys, as its hlo_diff_test) for both
sides and counts the same on its dumps.

Released cells come from (and stay in) the project's cache: after ``make audit`` they cost nothing. Reverted
ones are cached apart (.hlo-audit-cache/seed-000): HLO_AUDIT_INJECT is not part of a cell's key.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout

from hlo_audit import audit
from hlo_audit.cache import Cache
from hlo_audit.comparison import Structural
from hlo_audit.hlo.analysis import analyze

MODELS = ("llama3-8b", "deepseek3-test", "qwen3-1.7b")
SEED_000 = {"llama3-8b": 30, "deepseek3-test": 54, "qwen3-1.7b": 18}  # "dropped u32 RNG arrays"
# The default matrix's TPU series (a config that sets no axis keeps every default series), scanned as
# MaxText's hlo_diff_test compiles it.
CONFIG = 'target = "{target}"\ncache_dir = "{cache}"\n'


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    sides = {"released": ("maxtext", ROOT / ".hlo-audit-cache", {}),
             "reverted": ("injected_maxtext:lower", ROOT / ".hlo-audit-cache" / "seed-000",
                          {"HLO_AUDIT_INJECT": "prefix", "PYTHONPATH": str(ROOT / "tests")})}
    texts: dict[str, dict[str, str]] = {}
    with tempfile.TemporaryDirectory() as work:
        for side, (target, cache, env) in sides.items():
            config = pathlib.Path(work) / f"{side}.toml"
            config.write_text(CONFIG.format(target=target, cache=cache))
            only = ",".join(["platform=tpu", "scan=on", *(f"model={m}" for m in models)])
            run = subprocess.run([sys.executable, "-m", "hlo_audit", "run", "--config", str(config), "--jobs",
                                  str(args.jobs), "--only", only], cwd=ROOT, env={**os.environ, **env}, text=True,
                                 capture_output=True)
            if run.returncode:
                sys.exit(f"{side}: hlo-audit run failed:\n{run.stdout}{run.stderr}")
            if env:  # the callable target imports injected_maxtext from tests/
                sys.path.insert(0, env["PYTHONPATH"])
            plan = audit.plan(str(config), only=only)
            texts[side] = {r.cell.model: Cache(plan.config.cache_dir).hlo_text(r.key) for r in audit.execute(plan)}
        rows = [row(model, texts["released"][model], texts["reverted"][model]) for model in models]
        if args.maxtext:
            for model, r in zip(models, rows):
                r["maxtext"] = maxtext_row(model, pathlib.Path(work))
    print_table(rows)
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated MaxText model names")
    parser.add_argument("--maxtext", action="store_true", help="also diff MaxText's own train_compile dumps")
    parser.add_argument("--jobs", type=int, default=2, help="hlo-audit worker processes")
    return parser


def row(model: str, released: str, reverted: str) -> dict:
    """hlo-audit's diff of the reverted module against the released one, and the seed's header count."""
    old, new = analyze(reverted, f"{model} reverted"), analyze(released, f"{model} released")
    compared = Structural.of_analyses(old, new)
    d, params = compared.diff, compared.params
    return {"model": model, "verdict": d.verdict, "u32": (old.summary.by_dtype.get("u32", 0),
                                                           new.summary.by_dtype.get("u32", 0)),
            "dropped": -params.by_dtype.get("u32", 0), "entry_params": (params.golden, params.now),
            "changes": d.changes, "removed": _by_pattern(d.params_removed),
            "header_arrays": header_u32_arrays(old) - header_u32_arrays(new)}


def _by_pattern(groups) -> dict[str, int]:
    """Parameters removed per owner pattern (the diff's groups are per pattern, role and dtype)."""
    counts: dict[str, int] = {}
    for g in groups:
        counts[g.pattern] = counts.get(g.pattern, 0) + abs(g.count)
    return counts


def header_u32_arrays(analysis) -> int:
    """u32 shapes of rank >= 1 among the entry computation's parameters and results (its layout in the header).

    Read with hlo-audit's parser: XLA's own aborts the process on some compiled modules' text ("custom-call is
    not scheduled after its operand"), a check of its schedule that printing does not keep.
    """
    entry = analysis.module.entry
    result = entry.root.shape
    shapes = [p.shape for p in entry.parameters] + list(result.elements if result.is_tuple else [result])
    return sum(1 for s in shapes if s.dtype == "u32" and s.dims)


def maxtext_row(model: str, work: pathlib.Path) -> dict:
    """The same two sides through MaxText's own train_compile (unsafe_rbg keys), counted on its dumps."""
    texts = {}
    for side, inject in (("released", None), ("reverted", "prefix")):
        dump = work / f"{model}-{side}"
        command = [sys.executable, str(ROOT / "scripts" / "train_compile_dump.py"), "--model", model, "--layers", "4",
                   "--topology", "v6e-4", "--dump", str(dump)] + (["--inject", inject] if inject else [])
        record = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
        texts[side] = pathlib.Path(record["module"]).read_text()
    return row(model, texts["released"], texts["reverted"])


def print_table(rows: list[dict]) -> None:
    print("seed 000's Dropout and AttentionOp fixes, reverted vs released, optimized for TPU v6e-4 (L4, scan on)")
    header = f"{'model':<16} {'verdict':<15} {'u32 reverted -> released':>25} {'dropped u32':>12} " \
             f"{'header arrays':>14} {'seed 000':>9}"
    print(header)
    for r in rows:
        for label, data in (("", r), (" (train_compile)", r.get("maxtext"))):
            if data is None:
                continue
            print(f"{r['model'] + label:<16} {data['verdict']:<15} {data['u32'][0]:>14} -> {data['u32'][1]:<7} "
                  f"{data['dropped']:>12} {data['header_arrays']:>14} {SEED_000.get(r['model'], ''):>9}")
    print("dropped u32: entry parameters the fixes removed (hlo-audit diff); header arrays: u32 shapes of rank >= 1")
    print("the fixes removed from the HloModule header's entry_computation_layout, parameters and results together")
    for r in rows:
        changes = f" (changed: {', '.join(r['changes'])})" if r["changes"] else ""
        print(f"{r['model']}{changes}: " + ", ".join(f"{pattern} -{n}" for pattern, n in r["removed"].items()))


if __name__ == "__main__":
    sys.exit(main())
