"""Canonical text: insertion-stable names, volatile parts dropped, semantics kept, deterministic."""

from __future__ import annotations

import difflib
import hashlib
import subprocess
import sys

import nnx_models
from nnx_models import ModelSpec
from hlo_audit.hlo.analysis import analyze
from hlo_audit.hlo.normalize import normalize
from hlo_audit.hlo.source import pick_dump_module
from hlo_audit.hlo.text import parse_file, parse_module


def _changed_lines(a: str, b: str) -> tuple[list[str], list[str]]:
    removed, added = [], []
    for line in difflib.unified_diff(a.splitlines(), b.splitlines(), lineterm="", n=0):
        if line.startswith("-") and not line.startswith("---"):
            removed.append(line[1:])
        elif line.startswith("+") and not line.startswith("+++"):
            added.append(line[1:])
    return removed, added


def test_inserted_rng_state_does_not_renumber_the_rest():
    """ModelSpec(dropout_rate=0) adds per-layer Rngs that are never drawn: 4 parameters, 4 Sharding calls."""
    old_text = nnx_models.hlo_text(ModelSpec(layers=4))
    new_text = nnx_models.hlo_text(ModelSpec(layers=4, dropout_rate=0.0))
    raw_removed, raw_added = _changed_lines(old_text, new_text)
    removed, added = _changed_lines(normalize(parse_module(old_text)), normalize(parse_module(new_text)))
    # Raw text: every parameter after the first inserted one is renumbered, and so on.
    assert len(raw_removed) > 5 * 2
    # Canonical text: the header and the ROOT tuple are the only old lines touched...
    assert len(removed) == 2
    assert removed[0].startswith("HloModule") and removed[1].lstrip().startswith("ROOT %tuple.")
    # ...and every added line is the new RNG state: 8 parameters, 8 key Sharding calls, header, root.
    params = [line for line in added if "parameter()" in line]
    shardings = [line for line in added if 'custom_call_target="Sharding"' in line]
    assert len(params) == 8 and all("dropout.rngs" in line for line in params)
    assert len(shardings) == 8
    assert len(added) == 8 + 8 + 2


def test_renumbered_ids_normalize_identically():
    text = nnx_models.hlo_text(ModelSpec(dropout_rate=0.5))
    import re
    renumbered = re.sub(r"\b([A-Za-z_][\w\-]*)\.(\d+)\b", lambda m: f"{m.group(1)}.{int(m.group(2)) * 7 + 1000}",
                        text)
    assert renumbered != text
    assert normalize(parse_module(renumbered)) == normalize(parse_module(text))


def test_volatile_parts_dropped_and_semantics_kept(dump_folder):
    module = parse_file(pick_dump_module(dump_folder, stage="after"))
    text = normalize(module)
    for volatile in ("metadata=", "op_name", "source_line", "stack_frame_id", "FileNames", "StackFrames",
                     "/*index="):
        assert volatile not in text
    assert "fusion(" in text and "calls=%" in text and "kind=kLoop" in text
    assert "{1,0}" in text  # layouts kept
    # Every computation a fusion calls exists under its canonical name.
    called = {line.split("calls=%", 1)[1].split(",")[0] for line in text.splitlines() if "calls=%" in line}
    defined = {line[1:].split(" ", 1)[0] for line in text.splitlines() if line.startswith("%")}
    assert called <= defined


def test_deterministic_across_processes(tmp_path):
    path = tmp_path / "m.hlo.txt"
    path.write_text(nnx_models.hlo_text(ModelSpec(bridge="draws")))
    here = hashlib.sha256(normalize(parse_file(path)).encode()).hexdigest()
    code = ("import hashlib,sys; from hlo_audit.hlo.normalize import normalize; "
            "from hlo_audit.hlo.text import parse_file; "
            "print(hashlib.sha256(normalize(parse_file(sys.argv[1])).encode()).hexdigest())")
    env_seeds = ["0", "12345"]  # different str-hash seeds must not matter
    for seed in env_seeds:
        out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True,
                             env={"PYTHONHASHSEED": seed, "PATH": "/usr/bin:/bin"})
        assert out.stdout.strip() == here


SNIPPET = '''HloModule m.3, entry_computation_layout={(f32[8]{0}, f32[8]{0})->f32[8]{0}}

ENTRY %main.4 (a.1: f32[8], b.2: f32[8]) -> f32[8] {
  %a.1 = f32[8]{0} parameter(0), sharding={devices=[2]<=[2]}
  %b.2 = f32[8]{0} parameter(1)
  %k.3 = f32[8]{0} custom-call(%a.1), custom_call_target="tpu_custom_call", backend_config="{\\"custom_call_config\\": {\\"body\\": \\"TUzvUgFNTElSMjAuMC4w\\"}}"
  ROOT %s.5 = f32[8]{0} add(%k.3, %b.2), metadata={op_name="jit(f)/add" source_file="f.py" source_line=3}
}
'''


def test_kernel_bodies_dropped_commutative_operands_sorted_shardings_kept():
    text = normalize(parse_module(SNIPPET))
    assert "TUzvUgFN" not in text and "<kernel body dropped>" in text
    assert "sharding={devices=[2]<=[2]}" in text
    swapped = SNIPPET.replace("add(%k.3, %b.2)", "add(%b.2, %k.3)")
    assert normalize(parse_module(swapped)) == text
    relaid = SNIPPET.replace("%b.2 = f32[8]{0} parameter(1)", "%b.2 = f32[8]{0:T(8)} parameter(1)")
    assert normalize(parse_module(relaid)) != text


def test_analysis_normalizes_once():
    a = analyze(nnx_models.hlo_text(ModelSpec()))
    assert a.normalized is a.normalized
