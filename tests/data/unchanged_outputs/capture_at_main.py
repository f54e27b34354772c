"""How the outputs in this folder were captured: run at main 8e0abfb (before issue 28), from a copy of that commit.

    git archive 8e0abfb | tar -x -C /tmp/hlo-main
    PYTHONPATH=/tmp/hlo-main:<worktree>/tests python <worktree>/tests/data/unchanged_outputs/capture_at_main.py

It lowers the example MLP once (mlp/results.json: main's result records and canonical texts), writes its goldens
with main's `golden update` (mlp/golden/), then prints every scenario of ``tests/unchanged_outputs.py`` with main's
code and stores what it printed (<scenario>.json.gz). It only works against main's internals (``audit.run_cells``);
``test_unchanged_outputs.py`` serves the same results to today's pipeline.
"""

from __future__ import annotations

import contextlib
import copy
import gzip
import json
import shutil
import sys
import tempfile
from pathlib import Path

from hlo_audit import host

host.setup_own_process()

import unchanged_outputs as scenarios  # noqa: E402
from hlo_audit import audit  # noqa: E402
from hlo_audit.results import CellResult  # noqa: E402

DATA = scenarios.DATA


@contextlib.contextmanager
def serve(entries):
    results = {}
    for entry in entries:
        result = CellResult.from_record(entry["record"])
        result.normalized = entry["normalized"]
        results[result.cell.id] = result

    def run_cells(cells, cache, jobs=1, started=None):
        for cell in cells:
            yield copy.copy(results[cell.id])

    saved = audit.run_cells
    audit.run_cells = run_cells
    try:
        yield
    finally:
        audit.run_cells = saved


def lower_mlp() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "hlo-audit.toml").write_text(scenarios.MLP_CONFIG)
        plan = audit.plan(str(folder / "hlo-audit.toml"))
        entries = [{"record": r.to_record(), "normalized": r.normalized}
                   for r in audit.execute(plan, use_cache=False)]
        (DATA / "mlp" / "results.json").write_text(json.dumps(entries, indent=1) + "\n")
        # main's golden update of those results: the goldens the scenario starts from.
        from typer.testing import CliRunner

        from hlo_audit.cli import app

        with contextlib.chdir(folder), serve(entries):
            result = CliRunner().invoke(app, ["golden", "update"])
            assert result.exit_code == 0, result.output
        shutil.rmtree(DATA / "mlp" / "golden", ignore_errors=True)
        shutil.copytree(folder / "golden", DATA / "mlp" / "golden")


def main() -> None:
    if not (DATA / "mlp" / "results.json").exists():
        lower_mlp()
    from hlo_audit.targets import get_target

    get_target("maxtext").full_depth("llama3-8b")  # MaxText imported before any output is captured
    for name in sys.argv[1:] or list(scenarios.BUILDERS):
        with scenarios.scenario_folder() as folder:
            outputs = scenarios.run_scenario(name, folder, serve)
        (DATA / f"{name}.json.gz").write_bytes(gzip.compress(json.dumps(outputs, indent=1).encode(), mtime=0))
        print(name, {k: v["exit"] for k, v in outputs.items()})


if __name__ == "__main__":
    main()
