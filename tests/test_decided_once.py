"""What issue 28 decided once, where: the text owners with the plan, a waiver as a new finding, every sentence in
report.words, init's kinds in one registry."""

from __future__ import annotations

import pytest

from hlo_audit import scaffold
from hlo_audit.config import validate
from hlo_audit.findings import Finding, MissingGolden
from hlo_audit.plan import Plan
from hlo_audit.policy import Waiver
from hlo_audit.report.words import message
from hlo_audit.results import Severity
from hlo_audit.usage import InputError

CONFIG = {"target": "pkg.mod:lower", "models": ["m"], "quant": ["none"], "layers": [2, 4, 8]}


def test_every_cell_keeps_its_text_whatever_a_run_selects(tmp_path):
    """Issue 26: a golden text per cell, so `diff golden/<cell>.hlo.txt` reviews a finding at any depth."""
    config = validate(dict(CONFIG), "hlo-audit.toml", tmp_path)
    matrix = config.cells()
    deep = [c for c in matrix if c.layers == 8]
    plan = Plan.of(config, deep, universe=matrix, selected=deep)
    assert plan.owners == {c.id for c in matrix} and len(plan.owners) == 6
    # The pytest plugin's one-series plans keep the matrix's owners.
    one = plan.of_cells([c for c in matrix if c.scan and c.layers == 4])
    assert one.owners == plan.owners and one.full_matrix == plan.full_matrix == matrix


def test_a_waiver_makes_a_new_finding_and_the_sentence_says_so():
    found = Finding("m/scan-off/none/L2", Severity.REGRESSION, "missing_golden", MissingGolden(None, "hlo-audit x"))
    waived = found.waived(Waiver("missing_golden", "not yet", {}), Waiver("missing_golden", "known", {}))
    assert found.severity is Severity.REGRESSION and not found.waivers  # the finding the gate made stands
    assert waived.severity is Severity.WAIVED and not waived.failing
    assert message(found) == "no golden for this cell; create it with: hlo-audit x"
    assert message(waived) == message(found) + " [waived: known; not yet]"
    assert found.warned().severity is Severity.ADVISORY


def test_init_asks_the_registry_for_a_kind():
    assert list(scaffold.KINDS) == ["nnx", "callable", "maxtext"]
    options = dict(nnx=None, nnx_config=None, function=None, maxtext=False, models=(), quant=None, layers="2,4",
                   inputs=(), args=(), labels=None, layers_field=None, scan_field=None, optimizer="adamw",
                   learning_rate=1e-4, shards=2)
    with pytest.raises(InputError, match="one of --nnx package.module:Factory, --callable package.module:function, "
                                         "--maxtext$"):
        scaffold.init_request(**options)
    request = scaffold.init_request(**{**options, "maxtext": True, "models": ("llama3-8b",)})
    text = scaffold.KINDS[request.kind].config(request).text
    assert 'models = ["llama3-8b"]' in text and 'quant = ["none", "int8", "fp8", "nanoo_fp8"]' in text
