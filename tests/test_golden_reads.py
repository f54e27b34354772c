"""One snapshot of the golden store per command: `golden update` (with --prune, which reads every summary) and
`check` open each golden file at most once (at main 8e0abfb one update read each summary two or three times: to
fit a partial series, to compare, to prune).

Counted as the interpreter sees it: every ``open`` audit event (``builtins.open``, ``io.open``, ``os.open``) of a
file inside the golden folder, for reading. The results are the example MLP's as main lowered them (the
``mlp`` scenario of ``unchanged_outputs``), so nothing is lowered here.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections import Counter
from pathlib import Path

from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the scenarios' helper, under any import mode
import unchanged_outputs as scenarios
from hlo_audit.cli import app

_COUNTERS: list[tuple[str, Counter]] = []
_LAST_OPEN: list[str | None] = [None]  # the path of the last io.open: its opener's os.open is the same open


def _audit(event: str, args: tuple) -> None:
    if event != "open" or not _COUNTERS:
        return
    path, mode, flags = args
    if not isinstance(path, (str, bytes, os.PathLike)):
        return  # an open file descriptor (os.fdopen)
    path = os.path.abspath(os.fsdecode(path))
    if mode is None and _LAST_OPEN[0] == path:  # os.open called by io.open's opener: counted as the io.open
        _LAST_OPEN[0] = None
        return
    _LAST_OPEN[0] = path if isinstance(mode, str) else None
    reading = ("r" in mode and "+" not in mode) if isinstance(mode, str) else (flags & os.O_ACCMODE) == os.O_RDONLY
    for root, counter in _COUNTERS:
        if reading and path.startswith(root + os.sep) and not os.path.isdir(path):
            counter[os.path.relpath(path, root)] += 1


sys.addaudithook(_audit)  # audit hooks cannot be removed: this one counts only while a test asks (_COUNTERS)


@contextlib.contextmanager
def reads_under(root: Path):
    counter: Counter = Counter()
    _COUNTERS.append((str(root.resolve()), counter))
    try:
        yield counter
    finally:
        _COUNTERS.pop()


def _invoke(*args: str) -> int:
    return CliRunner().invoke(app, list(args), env={"COLUMNS": None, "GITHUB_STEP_SUMMARY": None}).exit_code


def test_one_golden_update_reads_each_golden_file_once():
    with scenarios.scenario_folder() as folder:
        entries = scenarios.scenario("mlp", folder)
        golden = folder / "golden"
        files = {str(p.relative_to(golden)) for p in golden.rglob("*") if p.is_file()}
        with contextlib.chdir(folder), scenarios.serve_today(entries), reads_under(golden) as reads:
            assert _invoke("golden", "update", "--prune") == 0
        # Every summary was read (--prune asks which are hlo-audit's) and every text a cell keeps (compared with
        # what it would write), each once; the texts of the deeper depths, which goldens written before issue 26
        # did not keep, were looked for once and are written now.
        after = {str(p.relative_to(golden)) for p in golden.rglob("*") if p.is_file()}
        added = after - files
        assert added and all(p.endswith("/L3.hlo.txt") for p in added), added
        assert set(reads) == files | added, set(reads) ^ (files | added)
        assert max(reads.values()) == 1, {path: n for path, n in reads.items() if n > 1}
        with contextlib.chdir(folder), scenarios.serve_today(entries), reads_under(golden) as again:
            assert _invoke("golden", "update", "--prune") == 0  # nothing to write now: only reads
        assert set(again) == after and max(again.values()) == 1


def test_one_check_reads_each_golden_file_once():
    with scenarios.scenario_folder() as folder:
        entries = scenarios.scenario("mlp", folder)
        golden = folder / "golden"
        with contextlib.chdir(folder), scenarios.serve_today(entries), reads_under(golden) as reads:
            assert _invoke("check", "--format", "json") == 1
        assert reads and max(reads.values()) == 1, {path: n for path, n in reads.items() if n > 1}
        assert {p for p in reads if p.endswith(".json")} == {
            str(p.relative_to(golden)) for p in golden.rglob("*.json")}  # stale goldens: every summary, once
