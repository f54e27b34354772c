"""Re-record outputs that changed on purpose since the capture at main 8e0abfb (``capture_at_main.py``), and only those.

    PYTHONPATH=<worktree>:<worktree>/tests python tests/data/unchanged_outputs/recapture.py OUTPUT[:FILE] ...

Each scenario is printed with today's code (``test_unchanged_outputs``' own seam, ``serve_today``); the outputs named
(``report.markdown:out.html``: that one file of that output; ``check.table``: the whole output, exit code, stdout and
files) are replaced in ``<scenario>.json.gz`` by what today's code printed. Every other output must still be byte for
byte what was captured: if one is not, nothing is written and the script names it (an unintended change, or one that
needs naming here too). Re-run it after a merge that changed a named output on both sides.

Recaptured on purpose so far:

* ``report.markdown:out.html`` (issue 26, item 10): the HTML report's label column fits the longest cell id (ids
  were cut at the left edge), and the depth-scaling chart is one panel per model with every line named at its end
  (it was one axis of 24-51 lines, repeated colours and a legend as long).
"""

from __future__ import annotations

import gzip
import json
import sys

from hlo_audit import host

host.setup_own_process()

import unchanged_outputs as scenarios  # noqa: E402


def recapture(name: str, wanted: list[tuple[str, str | None]]) -> list[str]:
    """Replace the ``wanted`` (output, file or None) of scenario ``name``; the other outputs that differ, if any."""
    with scenarios.scenario_folder() as folder:
        now = scenarios.run_scenario(name, folder, scenarios.serve_today)
    before = scenarios.expected(name)
    updated = json.loads(json.dumps(before))
    for output, file in wanted:
        if file is None:
            updated[output] = now[output]
        else:
            updated[output]["files"][file] = now[output]["files"][file]
    differing = [output for output in before if now[output] != updated[output]]
    if not differing:
        data = gzip.compress(json.dumps(updated, indent=1).encode(), mtime=0)
        (scenarios.DATA / f"{name}.json.gz").write_bytes(data)
    return differing


def main() -> None:
    wanted = [(arg.partition(":")[0], arg.partition(":")[2] or None) for arg in sys.argv[1:]]
    if not wanted:
        sys.exit(__doc__)
    from hlo_audit.targets import get_target

    get_target("maxtext").full_depth("llama3-8b")  # MaxText imported before any output is printed
    failed = False
    for name in scenarios.BUILDERS:
        differing = recapture(name, wanted)
        failed |= bool(differing)
        print(name, "recaptured" if not differing else f"NOT written: other outputs differ: {', '.join(differing)}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
