"""Scenarios whose every output was captured at main 8e0abfb, before issue 28 retyped and split the pipeline
(``tests/data/unchanged_outputs/``): ``test_unchanged_outputs.py`` prints each again and compares byte for byte.

This file touches nothing of hlo-audit but ``Cell`` and the config loader (both unchanged by that work): it builds
each scenario's folder and its cells' results as *records* (the results cache's schema, ``CellResult.to_record``),
so the same code served the capture at main and serves the test now. Three scenarios:

* ``maxtext``: the built-in default matrix (122 cells) against the committed ``golden/``. Each cell's result is its
  golden's numbers (summary, opcodes, environment, memory, cost, the golden text as its canonical text), then a few
  cells are changed so every kind of finding shows: counts that grew, shrank or were renamed, a changed text, a
  changed text under another jax, memory up and down, a failing and an unavailable cell; in the copy of ``golden/``
  one golden is deleted, one damaged, one text deleted and one stale golden added.
* ``gpu``: ``hlo-audit.gpu.toml`` against the committed ``golden-gpu/`` the same way, one cell launching 42 more
  scalar kernels per step.
* ``mlp``: the example NNX MLP really lowered at main (records and canonical texts in ``mlp/results.json``) against
  the goldens main's ``golden update`` wrote for them (``mlp/golden``), edited so that counts, RNG increments,
  slopes, text and environment differ.
"""

from __future__ import annotations

import contextlib
import copy
import json
import re
import secrets
import shutil
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data" / "unchanged_outputs"

MLP_CONFIG = """\
target = "hlo_audit.examples.nnx_mlp:lower"
models = ["mlp"]
quant = ["none", "dropout0", "dropout", "int8"]
layers = [2, 3]

[[waive]]
rule = "rng_scaling"
quant = "dropout0"
reason = "the example keeps a never-drawn dropout stream on purpose"

[[waive]]
rule = "dead_rng"
quant = "dropout0"
scan = "on"
pattern = "layers*"
reason = "scanned dropout0 carries its stream on purpose"

[[waive]]
rule = "count"
quant = "dropout"
scan = "on"
reason = "a waiver that waives nothing: a stale_waiver finding"
"""

# Every command and format each scenario prints: (name, CLI arguments, files the command writes besides stdout).
CHECK = [
    ("check.table", ["check"], []),
    ("check.verbose", ["check", "--verbose"], []),
    ("check.json", ["check", "--format", "json"], []),
    ("check.markdown", ["check", "--format", "markdown", "--junit", "out.junit.xml", "--markdown", "out.md"],
     ["out.junit.xml", "out.md"]),
]
RUN = [(f"run.{fmt}", ["run", "--format", fmt], []) for fmt in ("table", "json", "csv", "markdown")]
SCALING = [(f"scaling.{fmt}", ["scaling", "--format", fmt], []) for fmt in ("table", "json", "markdown")]
REPORT = [(f"report.{fmt}", ["report", "--format", fmt], []) for fmt in ("table", "json", "csv")] + [
    ("report.markdown", ["report", "--format", "markdown", "--html", "out.html"], ["out.html"])]
LIST = [("list.table", ["list"], []), ("list.json", ["list", "--format", "json"], [])]
MLP_CELL = "mlp/scan-off/dropout0/L2"
CELL_VIEWS = [(f"{command}.{fmt}", [command, MLP_CELL, "--format", fmt, *extra], [])
              for command, extra in (("rng", ["--streams"]), ("explain", [])) for fmt in ("table", "json", "markdown")]
SHARDS = [("shard1.json", ["check", "--shard", "1/2", "--format", "json"], []),
          ("shard2.json", ["check", "--shard", "2/2", "--format", "json"], [])]
MERGE = [(f"merge.{fmt}", ["merge", "shard1.json", "shard2.json", "--format", fmt], [])
         for fmt in ("table", "json", "markdown")] + [
    ("merge.junit", ["merge", "shard1.json", "shard2.json", "--junit", "merge.junit.xml"], ["merge.junit.xml"])]
UPDATE = [("golden-update", ["golden", "update"], [])]

COMMANDS = {
    "maxtext": [*CHECK, *RUN, *SCALING, *REPORT],
    "gpu": [*CHECK, *RUN, *REPORT, *UPDATE],
    "mlp": [*LIST, *CHECK, *RUN, *SCALING, *REPORT, *CELL_VIEWS, *SHARDS, *MERGE, *UPDATE],
}
CONFIG_ARGS = {"maxtext": [], "gpu": ["--config", "hlo-audit.gpu.toml"], "mlp": []}
# Commands that take no --config (merge reads files; rng and explain name a cell of the config found in the folder).
NO_CONFIG = ("merge", "list")


def cell_record(cell) -> dict:
    return {**asdict(cell), "overrides": [list(kv) for kv in cell.overrides]}


def result_record(cell, golden: dict) -> dict:
    """A cell's result with its golden's numbers (records of the results cache, as main's ``to_record``)."""
    launches = golden.get("launches")
    if launches is not None:  # a result's launches record holds more than its golden keeps
        launches = {"thunks": 0, "total": launches["total"], "static": 0, "by_category": launches["by_category"],
                    "by_kind": launches["by_kind"], "scalar": launches["scalar"],
                    "collectives": launches["collectives"], "exact": launches["exact"], "unknown_trip_counts": [],
                    "conditionals": 0, "attributed": True, "from_module": launches["from_module"],
                    "reading_rng": launches["reading_rng"], "scalar_groups": [], "groups": launches["groups"]}
    return {"cell": cell_record(cell), "status": "ok", "message": "",
            "summary": {"entry_params": golden["entry_params"], "by_dtype": golden["by_dtype"],
                        "by_role": golden["by_role"], "groups": golden["groups"], "bytes_by_role": {}},
            "params": [], "opcodes": golden.get("opcodes", {}), "rng": None, "memory": golden.get("memory"),
            "cost": golden.get("cost"), "constants": None, "launches": launches,
            "environment": golden["environment"], "hlo_sha256": "", "lower_seconds": 1.5, "key": ""}


def failed_record(cell, status: str, message: str) -> dict:
    return {"cell": cell_record(cell), "status": status, "message": message, "summary": None, "params": [],
            "opcodes": {}, "rng": None, "memory": None, "cost": None, "constants": None, "launches": None,
            "environment": {}, "hlo_sha256": "", "lower_seconds": 0.0, "key": ""}


def _changed_text(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


def _grow(record: dict, dtype: str, roles: dict[str, int], pattern: str) -> None:
    """``roles`` more parameters of ``dtype`` under a path pattern (negative: fewer)."""
    s = record["summary"]
    n = sum(roles.values())
    s["entry_params"] += n
    s["by_dtype"] = {**s["by_dtype"], dtype: s["by_dtype"].get(dtype, 0) + n}
    s["by_role"] = {**s["by_role"], **{r: s["by_role"].get(r, 0) + k for r, k in roles.items()}}
    s["groups"] = {k: v for k, v in {**s["groups"], pattern: s["groups"].get(pattern, 0) + n}.items() if v}


def _synthesized(folder: Path, golden_dir: str, config: str | None) -> list[dict]:
    """Every cell of the scenario's matrix with its golden's numbers; cells without a golden are left out. A cell
    whose golden keeps no text (goldens written before issue 26 kept it at a series' shallowest depth only) is served
    its series' shallowest text: a lowered cell always has one, and `golden update` writes it (issue 26)."""
    from hlo_audit.config import load_config
    try:
        from hlo_audit.resolve import resolve
    except ImportError:  # main, before issue 28
        from hlo_audit.config import resolve

    cfg = resolve(load_config(config, folder))
    out, shallowest = [], {}
    for cell in sorted(cfg.cells(), key=lambda c: c.layers):
        text = folder / golden_dir / f"{cell.id}.hlo.txt"
        if text.exists():
            shallowest.setdefault(cell.series, text)
    for cell in cfg.cells():
        summary = folder / golden_dir / f"{cell.id}.json"
        golden = json.loads(summary.read_text())
        record = result_record(cell, golden)
        text = folder / golden_dir / f"{cell.id}.hlo.txt"
        text = text if text.exists() else shallowest.get(cell.series)
        out.append({"record": record, "normalized": text.read_text() if text is not None else None})
    return out


def _by_id(entries: list[dict]) -> dict[str, dict]:
    from hlo_audit.matrix import Cell

    return {Cell(**{**e["record"]["cell"], "overrides": tuple(map(tuple, e["record"]["cell"]["overrides"]))}).id: e
            for e in entries}


def build_maxtext(folder: Path) -> list[dict]:
    shutil.copytree(ROOT / "golden", folder / "golden")
    entries = _synthesized(folder, "golden", None)
    by_id = _by_id(entries)
    from hlo_audit.matrix import Cell

    def cell_of(cid):
        e = by_id[cid]["record"]["cell"]
        return Cell(**{**e, "overrides": tuple(map(tuple, e["overrides"]))})

    # A count regression (seed 000's leak: a stream pair per layer more) and the owner's text changed with it.
    grown = by_id["llama3-8b/scan-off/int8/L2"]
    _grow(grown["record"], "u32", {"rng_key": 42, "rng_count": 42}, "state.model.decoder.layers_*.mlp.extra.rngs.*")
    grown["normalized"] = _changed_text(grown["normalized"], "u32[2]", "u32[4]")
    # Fewer parameters: an improvement (a deeper cell: its text is not compared).
    _grow(by_id["qwen3-1.7b/scan-on/none/L4"]["record"], "f32", {"weight": -2},
          "state.model.decoder.layers.mlp.wi_0.kernel")
    # A renamed pattern: same count, same roles, another name (advisory).
    renamed = by_id["qwen3-1.7b/scan-off/fp8/L2"]["record"]["summary"]
    old = next(p for p in renamed["groups"] if "self_attention" in p)
    renamed["groups"] = {(old.replace("self_attention", "attention_op") if k == old else k): v
                         for k, v in renamed["groups"].items()}
    # Another jax and another text: advisory.
    moved = by_id["deepseek3-test/scan-on/none/L2"]
    moved["record"]["environment"] = {**moved["record"]["environment"], "jax": "0.12.1"}
    moved["normalized"] = _changed_text(moved["normalized"], "f32[", "f64[")
    # Memory up on one TPU cell, down on another.
    tpu = [cid for cid in by_id if "/tpu-" in cid]
    for cid, factor in ((tpu[0], 1.1), (tpu[1], 0.9)):
        memory = by_id[cid]["record"]["memory"]
        memory["temp_bytes"] = int(memory["temp_bytes"] * factor)
    # A cell that failed, one unavailable here.
    te = [cid for cid in by_id if "/te_" in cid]
    by_id[te[0]] = {"record": failed_record(cell_of(te[0]), "error", "RuntimeError: TE refused the recipe "
                                                                     "(transformer_engine/jax/cpp_extensions.py:12)"),
                    "normalized": None}
    by_id[te[1]] = {"record": failed_record(cell_of(te[1]), "unavailable", "transformer_engine is not installed"),
                    "normalized": None}
    # The store: a golden gone, one damaged, a text gone, one stale.
    gold = folder / "golden"
    (gold / "qwen3-1.7b/scan-on/int8/L4.json").unlink()
    (gold / "llama3-8b/scan-on/none/L4.json").write_text("{not json\n")
    (gold / "qwen3-1.7b/scan-off/none/L2.hlo.txt").unlink()
    stale = json.loads((gold / "llama3-8b/scan-on/none/L2.json").read_text())
    stale["cell"], stale["hlo"] = "llama3-8b/scan-on/none/L8", None
    (gold / "llama3-8b/scan-on/none/L8.json").write_text(json.dumps(stale, indent=1, sort_keys=True) + "\n")
    return list(by_id.values())


def build_gpu(folder: Path) -> list[dict]:
    shutil.copytree(ROOT / "golden-gpu", folder / "golden-gpu")
    shutil.copy(ROOT / "hlo-audit.gpu.toml", folder / "hlo-audit.gpu.toml")
    entries = _synthesized(folder, "golden-gpu", str(folder / "hlo-audit.gpu.toml"))
    by_id = _by_id(entries)
    cid = "llama3-8b/scan-off/te_fp8_currentscaling/L4/cuda-h100/compiled"
    launches = by_id[cid]["record"]["launches"]
    group = next(k for k in launches["groups"] if k.startswith("kernel scalar"))
    launches["groups"] = {**launches["groups"], group: launches["groups"][group] + 42}
    launches["total"] += 42
    launches["scalar"] += 42
    launches["by_category"] = {**launches["by_category"], "kernel": launches["by_category"]["kernel"] + 42}
    return list(by_id.values())


def build_mlp(folder: Path) -> list[dict]:
    """The example MLP's results as main lowered them, against its goldens edited to differ."""
    (folder / "hlo-audit.toml").write_text(MLP_CONFIG)
    shutil.copytree(DATA / "mlp" / "golden", folder / "golden")
    edit_mlp_goldens(folder / "golden")
    return json.loads((DATA / "mlp" / "results.json").read_text())


def _edit(path: Path, change) -> None:
    record = json.loads(path.read_text())
    change(record)
    path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")


def edit_mlp_goldens(gold: Path) -> None:
    def fewer_rng(r):  # the golden had one stream pair per layer fewer: a count regression with increments
        r["entry_params"] -= 2
        r["by_dtype"]["u32"] -= 2
        r["by_role"]["rng_key"] -= 1
        r["by_role"]["rng_count"] -= 1
        r["by_dtype_role"]["u32:rng_key"] -= 1  # every table adds up to entry_params (a golden's claims are checked)
        r["by_dtype_role"]["u32:rng_count"] -= 1
        pattern = next(p for p in r["groups"] if "rngs" in p)
        r["groups"][pattern] -= 2
        r["groups_by_role"][pattern] = {k: v - 1 for k, v in r["groups_by_role"][pattern].items()}
        verdicts = r["rng_increments"]["by_verdict"]
        verdicts["carried"] = verdicts["carried"] - 1
        first = next(iter(r["rng_increments"]["by_pattern"]))
        r["rng_increments"]["by_pattern"][first] -= 1

    def more_weights(r):  # the golden had more: an improvement
        r["entry_params"] += 2
        r["by_dtype"]["f32"] += 2
        r["by_role"]["weight"] += 2
        r["by_dtype_role"]["f32:weight"] += 2

    def other_slopes(r):
        r["slopes"]["total"] += 1
        r["slopes"]["by_role"]["rng_key"] = r["slopes"]["by_role"].get("rng_key", 0) + 1

    def other_jax(r):
        r["environment"]["jax"] = "0.11.0"

    _edit(gold / "mlp/scan-off/dropout0/L3.json", fewer_rng)
    _edit(gold / "mlp/scan-on/none/L3.json", more_weights)
    _edit(gold / "mlp/scan-off/dropout/L2.json", other_slopes)
    _edit(gold / "mlp/scan-on/dropout/L2.json", other_jax)
    for cid in ("mlp/scan-off/none/L2", "mlp/scan-on/dropout/L2"):
        text = gold / f"{cid}.hlo.txt"
        text.write_text(_changed_text(text.read_text(), "f32[", "f16["))


BUILDERS = {"maxtext": build_maxtext, "gpu": build_gpu, "mlp": build_mlp}


def scenario(name: str, folder: Path) -> list[dict]:
    """Build the scenario in ``folder``; its results as [{"record": ..., "normalized": ...}] in matrix order."""
    return copy.deepcopy(BUILDERS[name](folder))


@contextlib.contextmanager
def scenario_folder():
    """A fresh folder as long as the one the capture ran in (``/tmp/tmpXXXXXXXX``): messages naming a golden's path
    wrap at 100 columns, so the path's length shows in the output, the path itself does not (``clean``). Hex
    only: Markdown escapes the ``_`` mkdtemp may put in a name, which ``clean`` would then not find."""
    folder = Path("/tmp") / f"tmp{secrets.token_hex(4)}"
    folder.mkdir()
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def clean(text: str, folder: Path) -> str:
    """The output with the scenario's folder (a temporary path) written as ``<folder>``, and in what judged a shard
    (issue 34) hlo-audit's source digest, the installed versions, the commit, the goldens' digest (the goldens
    record the installed versions) and the project tree's (issue 48: the goldens are files of it) as ``<this install>``: they are this checkout's and this machine's, not the
    scenario's (the config's and the policy's fingerprints stay)."""
    text = text.replace(str(folder.resolve()), "<folder>").replace(str(folder), "<folder>")
    return re.sub(r'"judged_by": \{[^{}]*\}', lambda m: re.sub(
        r'("(?:hlo_audit|environment|commit|goldens|tree)": )"[^"]*"', r'\1"<this install>"', m.group()), text)


def golden_tree(folder: Path, golden_dir: str) -> dict[str, str]:
    root = folder / golden_dir
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


def run_scenario(name: str, folder: Path, serve) -> dict[str, dict]:
    """Print every output of scenario ``name`` built in ``folder``: {output: {exit, stdout, files}}. ``serve(entries)``
    is a context manager under which the pipeline's lowering step yields the scenario's results (the one line of
    this harness that knows hlo-audit's internals, given by the caller: main's and today's differ)."""
    import os

    from typer.testing import CliRunner

    from hlo_audit.cli import app

    entries = scenario(name, folder)
    outputs: dict[str, dict] = {}
    quiet = {"COLUMNS": None, "LINES": None, "NO_COLOR": None, "GITHUB_STEP_SUMMARY": None}
    held: dict[str, str] = {}
    with contextlib.chdir(folder), serve(entries):
        for out, args, files in COMMANDS[name]:
            if args[0] == "merge":  # the shards' reports, written once both ran (below)
                for report, text in held.items():
                    (folder / report).write_text(text)
            argv = [*args, *([] if args[0] in NO_CONFIG else CONFIG_ARGS[name])]
            result = CliRunner().invoke(app, argv, env=quiet)
            if result.exception is not None and not isinstance(result.exception, SystemExit):
                raise result.exception
            outputs[out] = {"exit": result.exit_code, "stdout": clean(result.stdout, folder),
                            "files": {f: clean((folder / f).read_text(), folder) for f in files}}
            if out.startswith("shard"):
                # Held until both shards ran: a report in the folder is a file of the tree the next shard judges
                # (issue 48: its digest is what merge compares), as a CI job's checkout holds no other job's report.
                held[out] = result.stdout
            if out == "golden-update":
                golden_dir = "golden-gpu" if name == "gpu" else "golden"
                outputs[out]["files"] = {f"{golden_dir}/{k}": v for k, v in golden_tree(folder, golden_dir).items()}
            for f in files:
                os.unlink(folder / f)
    return outputs


@contextlib.contextmanager
def serve_today(entries: list[dict]):
    """Today's seam (since issue 28): the pipeline's lowering step (``run.run_cells`` as ``run.execute`` calls it)
    yields the scenario's results, read through the results cache's record schema as a cached result would be. (At
    main the seam was ``audit.run_cells``: capture_at_main.py's ``serve``.)"""
    import dataclasses

    from hlo_audit import run
    from hlo_audit.results import CellResult, LoweredCell

    results = {}
    for entry in entries:
        result = CellResult.from_record(entry["record"])
        if isinstance(result, LoweredCell):
            result = dataclasses.replace(result, normalized=entry["normalized"])
        results[result.cell.id] = result

    def run_cells(cells, cache, jobs=1, started=None):
        for cell in cells:
            yield results[cell.id]

    saved = run.run_cells
    run.run_cells = run_cells
    try:
        yield
    finally:
        run.run_cells = saved


def expected(name: str) -> dict[str, dict]:
    import gzip

    return json.loads(gzip.decompress((DATA / f"{name}.json.gz").read_bytes()))
