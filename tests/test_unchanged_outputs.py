"""Every output format prints what it printed before issue 28 retyped the results and split the pipeline.

``tests/unchanged_outputs.py`` builds three scenarios (the default matrix against the committed ``golden/``, the
GPU profile against ``golden-gpu/``, the example MLP as main lowered it against its goldens), each with cells
changed so that every kind of finding shows; ``tests/data/unchanged_outputs/capture_at_main.py`` printed every
command and format of them with main's code (8e0abfb) into ``<scenario>.json.gz``. Here the same results are
served to today's pipeline (in place of lowering: the one seam), every command runs through the CLI, and its
exit code, standard output and the files it writes (JUnit, Markdown, HTML, the goldens `golden update` writes) must
be byte-identical.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the scenarios' helper, under any import mode
import unchanged_outputs as scenarios


@pytest.fixture(scope="module", autouse=True)
def _maxtext_imported():
    """MaxText's import prints; it happens before any output is compared (the capture did the same)."""
    pytest.importorskip("maxtext")
    from hlo_audit.targets import get_target

    get_target("maxtext").full_depth("llama3-8b")


@pytest.mark.maxtext  # the default matrix's full depths come from MaxText's model configs
@pytest.mark.parametrize("name", list(scenarios.BUILDERS))
def test_every_format_prints_what_it_printed_at_main(name):
    with scenarios.scenario_folder() as folder:
        now = scenarios.run_scenario(name, folder, scenarios.serve_today)
    before = scenarios.expected(name)
    assert list(now) == list(before)
    for output, was in before.items():
        got = now[output]
        assert got["exit"] == was["exit"], output
        assert got["stdout"] == was["stdout"], output
        assert got["files"] == was["files"], output
