"""hlo-audit's parser held to XLA's own, module by module, on a corpus of real HLO nobody here wrote.

Valid HLO is what XLA's parser accepts (jaxlib's ``hlo_module_from_text``, private API: the test suite's
judge, not a dependency of hlo-audit's core). For every module of the corpus, hlo-audit must read it, and
count what XLA's parser built: entry parameters, by dtype, computations, and instructions per opcode. And
renaming every instruction and computation (XLA's reprint, renumbered as a recompile would) must change
nothing hlo-audit's normalization can see, nor its structural match (which also matches each module with itself).

The corpus is other projects' text, so it lives outside the repository: ``--hlo-corpus DIR`` or
``HLO_AUDIT_CORPUS`` names it (``.ci/run`` uses ``../shared/hlo-corpus``); without it these tests are skipped
and say why. Its README.md says how it was built; INDEX.tsv lists each module with XLA's numbers.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import importlib.util
import json
import os
import re
from functools import cache
from pathlib import Path

import pytest

from hlo_audit.hlo.analysis import analyze
from hlo_audit.hlo.change_places import instructions_per_step
from hlo_audit.hlo.diff import diff_modules
from hlo_audit.hlo.match import match_modules
from xla_oracle import our_counts, xla_counts

NOT_GIVEN = ("no HLO corpus given: pass --hlo-corpus DIR or set HLO_AUDIT_CORPUS "
             "(.ci/run uses ../shared/hlo-corpus)")


LARGE_BYTES = 1_000_000
WHOLE_MODULE_PASSES = ("test_renumbering_is_identical_after_normalization", "test_a_module_matches_itself")


def corpus_dir(config) -> Path | None:
    value = config.getoption("--hlo-corpus") or os.environ.get("HLO_AUDIT_CORPUS")
    return Path(value) if value else None


def pytest_generate_tests(metafunc):
    if "corpus_row" not in metafunc.fixturenames:
        return
    corpus = corpus_dir(metafunc.config)
    if corpus is None or not (corpus / "INDEX.tsv").is_file():
        reason = NOT_GIVEN if corpus is None else f"{corpus}: no INDEX.tsv there, not an HLO corpus"
        metafunc.parametrize("corpus_row", [pytest.param(None, marks=pytest.mark.skip(reason=reason))], ids=["corpus"])
        return
    with open(corpus / "INDEX.tsv", newline="") as f:
        rows = [{**row, "corpus": str(corpus)} for row in csv.DictReader(f, delimiter="\t")]
    # make test's 15 minutes: the counts (the parser against XLA's) on every module; renumbering and self-matching,
    # whole-module passes, on the modules up to 1 MB (404 of 437), the 33 larger ones (85% of their time) in
    # make test-long, which .ci/run runs too.
    long = metafunc.function.__name__ in WHOLE_MODULE_PASSES
    metafunc.parametrize("corpus_row", [
        pytest.param(row, marks=[pytest.mark.long] if long and int(row["bytes"]) > LARGE_BYTES else [])
        for row in rows], ids=[row["file"].removesuffix(".hlo.gz") for row in rows])


def _text(row: dict, *folder: str) -> str:
    with gzip.open(Path(row["corpus"], *folder, row["file"]), "rb") as f:
        return f.read().decode("utf-8")


# The XLA whose parser accepted every module of the corpus and counted it (its README). An older jaxlib's parser is
# not that judge: it rejects the syntax XLA added since (``is_stable`` on topk, ``unreduced`` shardings, ...), and
# builds some modules otherwise (a ``call-start`` with no operands: no wrapped computation's parameters).
CORPUS_JAXLIB = (0, 12, 0)


def _installed_xla_is_older() -> bool:
    import jaxlib

    return tuple(int(part) for part in re.findall(r"\d+", jaxlib.__version__)[:3]) < CORPUS_JAXLIB


def test_counts_equal_xlas(corpus_row):
    """Every module parses, and hlo-audit counts what XLA's parser built."""
    text = _text(corpus_row)
    recorded = (int(corpus_row["xla_entry_params"]), json.loads(corpus_row["xla_by_dtype"]))
    if _installed_xla_is_older():
        # An older stack (make compat): hold hlo-audit to the numbers the corpus's own XLA recorded.
        ours = our_counts(text, corpus_row["file"])
        assert (ours["entry_params"], ours["by_dtype"]) == recorded
        return
    xla = xla_counts(text, corpus_row["entry_computation"])
    # The corpus's own record of XLA's numbers agrees (a corpus edited by hand would not).
    assert (xla["entry_params"], xla["by_dtype"]) == recorded
    assert our_counts(text, corpus_row["file"]) == xla


@cache
def _corpus_check(path: str):
    """The corpus's yardstick (stdlib only, beside INDEX.tsv): its renumber() is the renaming XLA validated."""
    spec = importlib.util.spec_from_file_location("corpus_check", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_renumbering_is_identical_after_normalization(corpus_row):
    """XLA's reprint with every id renumbered (what a recompile does) normalizes to the same text."""
    if corpus_row["renumber_checked"] != "yes":
        pytest.skip("the corpus has no XLA-validated renumbering of this module")
    reprint = _text(corpus_row, "xla_print")
    renumbered, _ = _corpus_check(str(Path(corpus_row["corpus"], "corpus_check.py"))).renumber(reprint)
    assert hashlib.sha1(renumbered.encode()).hexdigest() == corpus_row["renumbered_sha1"]
    old, new = analyze(reprint, "xla-reprint"), analyze(renumbered, "renumbered")
    d = diff_modules(old, new, max_text_lines=20)
    assert d.verdict in ("identical", "identical-after-normalization"), (d.verdict, d.changes, d.text_diff)
    # And the structural match (hlo.match) pairs every instruction and computation of the two as the same.
    match = match_modules(old.module, new.module, old.params, new.params)
    assert match.unchanged, (match.counts(), match.computations_inserted[:3], match.edits[:3])
    assert match.matched == match.instructions[0] == match.instructions[1]


def test_a_module_matches_itself(corpus_row):
    """The structural match of every module against itself (fingerprinted twice, as two modules): every
    instruction and computation paired and unchanged, no parameter renamed. And every other analysis `check` and
    `rng` run on a module reads it without raising (valid HLO is never a traceback): the RNG streams (one module's
    Shardy custom call once raised TypeError there), the captured constants, the instructions per step."""
    a = analyze(_text(corpus_row), corpus_row["file"])
    match = match_modules(a.module, a.module, a.params, a.params)
    assert match.unchanged, (match.counts(), match.computations_inserted[:3], match.edits[:3])
    assert match.matched == match.instructions[0] == len(list(a.module.instructions())) - len(a.params)
    assert a.rng.streams is not None and a.constants is not None
    assert sum(instructions_per_step(a.module).values()) >= len(list(a.module.entry.instructions)) - len(a.params)
