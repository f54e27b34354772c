"""Capture the outputs in this folder again with today's code, after a deliberate change of wording or of what a
command writes (capture_at_main.py made them at main 8e0abfb, through main's internals; this serves the same
scenario results through today's seam, ``unchanged_outputs.serve_today``, as test_unchanged_outputs.py does).

    PYTHONPATH=<worktree>:<worktree>/tests python <worktree>/tests/data/unchanged_outputs/recapture.py [SCENARIO...]

It prints, per scenario, which outputs changed; review them (``git diff`` cannot read the .json.gz) before
committing, and say in the commit what changed on purpose.
"""

from __future__ import annotations

import gzip
import json
import sys

from hlo_audit import host

host.setup_own_process()

import unchanged_outputs as scenarios  # noqa: E402


def main() -> None:
    from hlo_audit.targets import get_target

    get_target("maxtext").full_depth("llama3-8b")  # MaxText imported before any output is captured
    for name in sys.argv[1:] or list(scenarios.BUILDERS):
        before = scenarios.expected(name)
        with scenarios.scenario_folder() as folder:
            outputs = scenarios.run_scenario(name, folder, scenarios.serve_today)
        changed = [k for k in outputs if outputs[k] != before.get(k)]
        (scenarios.DATA / f"{name}.json.gz").write_bytes(
            gzip.compress(json.dumps(outputs, indent=1).encode(), mtime=0))
        print(name, f"{len(changed)} of {len(outputs)} outputs changed:", ", ".join(changed))


if __name__ == "__main__":
    main()
