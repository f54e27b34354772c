"""strip_rng_state on every committed golden text (real MaxText modules: train, inference, TE, TPU): what it
returns is a whole module, every computation an instruction names is in it. A rewritten copy of a threefry whose
key went used to stay behind, naming while bodies that had gone with the original (`diff` of the inference step's
golden against the step with its state as arguments raised KeyError: 'region.7508cd69')."""

from __future__ import annotations

from pathlib import Path

import pytest

from hlo_audit.hlo.analysis import analyze
from hlo_audit.hlo.normalize import normalize_with_printed
from hlo_audit.hlo.rng import strip_rng_state

ROOT = Path(__file__).resolve().parents[1]
TEXTS = sorted(p for folder in ("golden", "golden-gpu") for p in (ROOT / folder).rglob("*.hlo.txt")
               if "threefry" in p.read_text() or "rng" in p.read_text())


@pytest.mark.parametrize("path", TEXTS, ids=[str(p.relative_to(ROOT)) for p in TEXTS])
def test_the_stripped_module_names_only_computations_it_has(path):
    analysis = analyze(path.read_text(), str(path))
    stripped, kept = strip_rng_state(analysis.module, analysis.params)
    dangling = sorted({callee for comp in stripped.computations.values() for instr in comp.instructions
                       for callee in instr.called_computations() if callee not in stripped.computations})
    assert dangling == []
    assert len(kept) == len([p for p in analysis.params if not p.is_rng])
    normalize_with_printed(stripped, kept)  # and it normalizes, as diff and the text rule do
