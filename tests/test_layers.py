"""The layer contract (hlo_audit.layers): every import in the package, function-local ones included, points to
the importer's own layer or a lower one; the HLO core imports nothing outside hlo/; no import cycles."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import hlo_audit
from hlo_audit import layers

ROOT = Path(hlo_audit.__file__).resolve().parent


def _sources() -> dict[str, str]:
    return {layers.module_name(str(p.relative_to(ROOT))): p.read_text() for p in sorted(ROOT.rglob("*.py"))}


def test_the_package_keeps_its_layers():
    graph = layers.import_graph(ROOT)
    assert layers.violations(graph) == []
    # The check sees the real edges: a function-local import (stages load a stage by name, platforms import jax
    # lazily) and top-level ones alike.
    assert "lowering" in graph["stages"] and "platforms" in graph["stages.optimized"]
    assert graph["hlo.text"] <= {m for m in graph if m.startswith("hlo.")}


def test_a_new_upward_import_fails_the_contract():
    sources = _sources()
    # A function-local import from a formatter into the pipeline, of the kind that used to close cycles.
    sources["report.terminal"] += "\n\ndef _explain():\n    from hlo_audit import audit\n    return audit\n"
    problems = layers.violations(layers.graph_of(sources))
    assert any("hlo_audit.report.terminal (formats) -> hlo_audit.audit (entry points)" in p for p in problems)
    # Within a layer a back edge still fails, as a cycle.
    sources = _sources()
    sources["matrix"] += "\n\ndef _result():\n    import hlo_audit.results\n"
    assert any(p.startswith("import cycle: hlo_audit.matrix -> hlo_audit.results") for p in
               layers.violations(layers.graph_of(sources)))


def test_the_hlo_core_imports_nothing_outside_it_and_type_checking_imports_count():
    sources = _sources()
    sources["hlo.params"] += "\nfrom hlo_audit.lowering import one_line\n"
    assert "hlo_audit.hlo.params -> hlo_audit.lowering: the HLO core imports nothing outside hlo/" in \
        layers.violations(layers.graph_of(sources))
    # A type named from a higher layer is that layer's record read from below (rules typed against judging's
    # comparison put rules above judging): it points up though it never runs.
    sources = _sources()
    sources["platforms.base"] += "\nif TYPE_CHECKING:\n    from hlo_audit.audit import Plan\n"
    assert ("hlo_audit.platforms.base (platforms) -> hlo_audit.audit (entry points): an import from a higher layer"
            in layers.violations(layers.graph_of(sources)))
    sources = _sources()
    sources["rules.count"] += "\nif TYPE_CHECKING:\n    from hlo_audit.judging.outcome import Outcome\n"
    assert any(p.startswith("hlo_audit.rules.count (records) -> hlo_audit.judging.outcome (judging)")
               for p in layers.violations(layers.graph_of(sources)))


def test_the_comparison_sits_below_the_rules_and_the_commands_steps_above_judging():
    """Issue 49: the records every rule reads (``CellDelta``) are in a layer rules/ may import; measure, explain,
    inputs and golden update are above the gate, below the formats that print what they return."""
    assert layers.layer_of("comparison") == layers.layer_of("rules.count")
    judging = layers.layer_of("judging.gate")
    for step in ("commands.measure", "commands.inputs", "commands.explain", "commands.golden_update"):
        assert judging < layers.layer_of(step) < layers.layer_of("report.terminal")
    graph = layers.import_graph(ROOT)
    assert "comparison" in graph["rules.count"] and not any(m.startswith("judging") for m in graph["rules.count"])


def test_a_module_in_no_layer_is_reported():
    sources = {**_sources(), "newthing": "from hlo_audit import lowering\n"}
    assert "hlo_audit.newthing: in no layer of hlo_audit.layers.LAYERS" in layers.violations(layers.graph_of(sources))


def test_the_graph_prints_as_edges():
    result = subprocess.run([sys.executable, "-m", "hlo_audit.layers"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout
    edges = result.stdout.splitlines()
    assert "hlo_audit.cli -> hlo_audit.audit" in edges and "hlo_audit.stages.compiled -> hlo_audit.stages.program" in edges
    assert all(" -> " in edge for edge in edges)
