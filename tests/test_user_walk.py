"""The path a new user walks (issue 26), every step as the output tells them to take it.

A user repository around ``tinylm`` (tests/nnx_library.py, a model library the suite holds, written into the test's
folder as the user's own package): ``init --nnx`` (scan on and off, depths 2 and 4), ``check`` passes; an intended
change (a weight per layer) fails, the user runs exactly the accept command the failure printed, ``check`` passes,
and the same command again writes nothing and says so. First the user accepts one depth alone, as the tool used to
print: the series' slope then made of the new L2 and the old L4 is growth, a regression that prints the whole
series' command, never an "improvement" that loops. Every cell of a depth series can be reviewed with the README's
step (``lower`` + ``diff golden/<cell>.hlo.txt``). The reverse: an unintended change (a never-drawn Dropout per
layer) fails, and reverting it passes.

Every command runs in this process (tests/in_process.py) with the library imported anew each time, as a user's
separate runs import it after an edit; lowerings: 4 per version of the library (12 in all, ~1 s each).
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import pytest

from in_process import Ran, hlo_audit_here
from nnx_library import add_layer_dropout, add_layer_weight, write_library

SERIES = ("tiny/scan-off/none", "tiny/scan-on/none")
ACCEPT = re.compile(r"cells? at once: (hlo-audit golden update --only \S+)")


@pytest.fixture
def user(tmp_path, monkeypatch) -> tuple[Path, Path]:
    """(the library's folder, the user's repository after ``init``)."""
    library = write_library(tmp_path / "site")
    monkeypatch.syspath_prepend(str(library))
    repo = tmp_path / "repo"
    repo.mkdir()
    made = run(repo, "init", "--nnx", "tinylm.model:TinyLM", "--nnx-config", "tinylm.model:ModelConfig.tiny")
    assert made.returncode == 0, made.stderr[-3000:]
    return library, repo


def run(repo: Path, *args: str) -> Ran:
    """``hlo-audit ARGS``, the library imported anew (a user's next command is a new process)."""
    for name in [m for m in sys.modules if m == "tinylm" or m.startswith("tinylm.")]:
        del sys.modules[name]
    return hlo_audit_here(repo, *args)


def flat(text: str) -> str:
    return " ".join(text.split())


def goldens(repo: Path) -> dict[str, bytes]:
    return {str(p.relative_to(repo / "golden")): p.read_bytes() for p in sorted((repo / "golden").rglob("*"))
            if p.is_file()}


def printed_commands(output: str) -> list[str]:
    """The accept commands a failing check printed, each once, in order."""
    return list(dict.fromkeys(ACCEPT.findall(flat(output))))


def test_an_intended_change_is_accepted_by_the_printed_command_and_an_unintended_one_reverted(user):
    library, repo = user
    assert run(repo, "check").returncode == 0
    before = (library / "tinylm/model.py").read_text()

    add_layer_weight(library)  # intended: a weight per layer
    failed = run(repo, "check")
    assert failed.returncode == 1, failed.stdout[-3000:]
    assert "improvement" not in failed.stdout
    commands = printed_commands(failed.stdout)
    # One command for the failing check (issue 40), naming every depth of each series: a depth's golden holds the
    # series' slopes.
    assert commands == ["hlo-audit golden update --only " + ",".join(f"id={s}/L{d}" for s in SERIES for d in (2, 4))
                        ], commands
    _review_every_depth(repo, expect=1)

    # The user accepts one depth alone (what the tool printed before issue 26): the L2 golden now holds a slope
    # made of the new L2 and the old L4. That is growth per layer, a regression naming the whole series.
    assert run(repo, "golden", "update", "--only", f"id={SERIES[0]}/L2").returncode == 0
    partial = run(repo, "check", "--only", "scan=off")
    out = flat(partial.stdout)
    assert partial.returncode == 1 and "improvement" not in out, out
    assert re.search(r"regression tiny/scan-off/none/L2 count entry parameters per layer golden \+12 -> now \+18",
                     out), out
    assert printed_commands(partial.stdout) == [f"hlo-audit golden update --only id={SERIES[0]}/L2,id={SERIES[0]}/L4"]

    for command in commands:  # exactly what was printed
        accepted = run(repo, *shlex.split(command)[1:])
        assert accepted.returncode == 0, accepted.stdout + accepted.stderr[-2000:]
    passed = run(repo, "check")
    assert passed.returncode == 0, passed.stdout[-3000:]
    assert "hlo-audit check passed: 4 cells: 4 ok" in passed.stdout
    _review_every_depth(repo, expect=0)

    accepted = goldens(repo)
    for command in commands:  # the same command again: a no-op that says so
        again = run(repo, *shlex.split(command)[1:])
        assert again.returncode == 0
        assert again.stdout.splitlines()[-2:] == [
            "nothing to write: the goldens of these 4 cells already hold what they lower",
            f"golden update ({repo / 'golden'}): 0 written, 4 unchanged, 0 skipped, 0 pruned"], again.stdout
    assert goldens(repo) == accepted

    weighted = (library / "tinylm/model.py").read_text()
    assert weighted != before
    add_layer_dropout(library)  # unintended: a Dropout(0.0) per layer, a stream never drawn from
    leaked = run(repo, "check")
    assert leaked.returncode == 1 and "state.model.layers.*.dropout.rngs.*" in flat(leaked.stdout)
    (library / "tinylm/model.py").write_text(weighted)  # reverted
    reverted = run(repo, "check")
    assert reverted.returncode == 0, reverted.stdout[-3000:]
    assert goldens(repo) == accepted


def _review_every_depth(repo: Path, expect: int) -> None:
    """The README's review step at every cell of both depth series: ``lower`` then ``diff`` against the cell's own
    golden text (``expect``: diff's exit code, 1 while the model differs from its goldens)."""
    for series in SERIES:
        for depth in (2, 4):
            cell = f"{series}/L{depth}"
            lowered = run(repo, "lower", cell, "-o", "new.hlo.txt")
            assert lowered.returncode == 0, lowered.stderr[-2000:]
            review = run(repo, "diff", f"golden/{cell}.hlo.txt", "new.hlo.txt")
            assert review.returncode == expect, (cell, review.stdout[-2000:], review.stderr[-2000:])
            if expect:
                assert "layers" in review.stdout and "scale" in review.stdout, review.stdout[-3000:]
