"""The named rules gate whatever the text rule says, so they must not fire on compiler-version noise (issue 32 item 6).

Goldens written with this repository's pinned stack (constraints.txt: jax 0.12.0.1, flax 0.12.12) are committed under
tests/data/pinned_goldens/: the example MLP (scan on and off, with and without a never-drawn dropout stream, L2 and
L3) and the team's model (tests/team_model.py, L2 and L3). The same models, unchanged, are checked against them
under whatever stack runs the suite: under the pinned one the texts are the same (every cell ok); under `make
compat`'s (jax 0.11.2, flax 0.12.10) the texts differ, the environment with them, and the check must still pass
with advisories only: no count, donation, host transfer, precision, program size or kernel finding, because none of
those changed. A rule that mistakes another jax's printing for a change fails here, in CI's compat step.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import team_model as tm
from in_process import hlo_audit_here
from projects import DROPOUT_WAIVER, config

PINNED = Path(__file__).resolve().parent / "data" / "pinned_goldens"
QUIET = {"ok", "advisory", "waived"}
# What the pinned goldens were written with (their records say it too).
PINNED_JAX = "0.12.0.1"


def check(project: Path) -> tuple[int, list[dict], dict]:
    ran = hlo_audit_here(project, "check", "--format", "json")
    assert ran.returncode in (0, 1), ran.stderr[-3000:]
    report = json.loads(ran.stdout)
    return ran.returncode, report["findings"], report


def written_with(golden: Path) -> str:
    record = json.loads(next(golden.rglob("*.json")).read_text())
    return record["environment"]["jax"]


@pytest.mark.parametrize("model", ["mlp", "team"])
def test_unchanged_models_pass_their_pinned_goldens_under_any_stack(tmp_path, model):
    golden = tmp_path / "golden"
    shutil.copytree(PINNED / model, golden)
    assert written_with(golden) == PINNED_JAX
    if model == "team":
        shutil.copy(tm.__file__, tmp_path / "team_model.py")
        text = config(target="team_model:target", models=["team"], scan=["off"], quant=["base"], layers=[2, 3])
    else:
        text = config(scan=["on", "off"], quant=["none", "dropout0"], layers=[2, 3], waive=[DROPOUT_WAIVER])
    (tmp_path / "hlo-audit.toml").write_text(text)
    code, findings, report = check(tmp_path)
    loud = [f for f in findings if f["severity"] not in QUIET]
    assert code == 0 and not loud, loud
    import jax

    moved = [f for f in findings if f["rule"] == "hlo_text"]
    if jax.__version__ == PINNED_JAX:
        assert not moved, moved  # the same stack prints the same text
    else:  # another jax: the text is advisory, and nothing else may have spoken
        assert all(f["severity"] == "advisory" and "environment differs" in f["message"] for f in moved), moved
        spoke = {f["rule"] for f in findings if f["severity"] not in ("ok", "waived")} - {"hlo_text", "dead_rng"}
        assert not spoke, [f for f in findings if f["rule"] in spoke]
