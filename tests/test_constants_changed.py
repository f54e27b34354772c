"""A constant changed is its own kind of change (issue 41): both values, the type and the place, in `diff` (table,
JSON, Markdown) and in `check`, whose `constants` rule fails; the verdict says `changed (constants)`, never
"attributes". A learning rate changed in a real jax/optax train step (a callable target in the user's project) is
the case in point; a large literal is summarized (its elements, a digest, the first that differ)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from jax._src.lib import hlo

from in_process import cli, hlo_audit_here

MODULE = """HloModule m, entry_computation_layout={{(f32[4]{{0}})->f32[4]{{0}}}}

%c (p: f32[4]) -> f32[4] {{
  %p = f32[4]{{0}} parameter(0)
  %k = f32[] constant({called})
  %b = f32[4]{{0}} broadcast(%k), dimensions={{}}
  ROOT %m = f32[4]{{0}} multiply(%p, %b), metadata={{op_name="jit(step)/mul" source_file="/src/model.py" source_line=7}}
}}

%sum (a: f32[], b: f32[]) -> f32[] {{
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %add = f32[] add(%a, %b)
}}

ENTRY %main (x: f32[4]) -> f32[4] {{
  %x = f32[4]{{0}} parameter(0)
  %e = f32[] constant({entry}), metadata={{op_name="jit(step)/eps" source_file="/src/model.py" source_line=3}}
  %eb = f32[4]{{0}} broadcast(%e), dimensions={{}}
  %y = f32[4]{{0}} add(%x, %eb)
  %t = f32[64]{{0}} constant({table})
  %s = f32[] reduce(%t, %e), dimensions={{0}}, to_apply=%sum
  %sb = f32[4]{{0}} broadcast(%s), dimensions={{}}
  %z = f32[4]{{0}} add(%y, %sb)
  ROOT %r = f32[4]{{0}} call(%z), to_apply=%c
}}
"""
TABLE = [float(i) for i in range(64)]


def module(called="77", entry="0.5", table=TABLE) -> str:
    text = MODULE.format(called=called, entry=entry, table="{" + ", ".join(f"{v:g}" for v in table) + "}")
    hlo.hlo_module_from_text(text)  # XLA's parser reads it: a module users have
    return text


def diff(tmp_path: Path, old: str, new: str, *args: str):
    (tmp_path / "old.hlo").write_text(old)
    (tmp_path / "new.hlo").write_text(new)
    return cli("diff", tmp_path / "old.hlo", tmp_path / "new.hlo", *args)


def test_a_literal_changed_in_a_called_computation_and_in_the_entry(tmp_path):
    old, new = module(), module(called="1", entry="0.25")
    ran = diff(tmp_path, old, new)
    assert ran.exit_code == 1, ran.output
    lines = ran.output.splitlines()
    assert lines[0] == "verdict: changed (constants)", ran.output
    assert "  constants: f32[] literal 77 -> 1 at model.py:7 (jit(step)/mul) in c" in lines, ran.output
    assert "  constants: f32[] literal 0.5 -> 0.25 at model.py:3 (jit(step)/eps)" in lines, ran.output
    assert "attributes" not in ran.output and "ops:" not in ran.output
    doc = json.loads(diff(tmp_path, old, new, "--format", "json").output)
    assert doc["changes"] == ["constants"]
    named = {(c["place"]["computation"], c["before"], c["after"], c["subject"]) for c in doc["named"]
             if c["kind"] == "constants"}
    assert named == {("c", "77", "1", "f32[]"), ("main", "0.5", "0.25", "f32[]")}, doc["named"]
    markdown = diff(tmp_path, old, new, "--format", "markdown").output
    assert "literal 77 -\\> 1" in markdown and "literal 0.5 -\\> 0.25" in markdown, markdown
    # The same literal again is no change; one changed back is one change fewer.
    assert diff(tmp_path, old, module()).exit_code == 0
    assert "0.5 -> 0.25" not in diff(tmp_path, old, module(called="1")).output


def test_a_large_literal_is_summarized_with_the_first_elements_that_differ(tmp_path):
    table = [*TABLE]
    table[3], table[40], table[50], table[60] = 0.5, -1.0, 2.5, 7.0
    ran = diff(tmp_path, module(), module(table=table))
    (line,) = [line for line in ran.output.splitlines() if "constants:" in line]
    assert line.startswith("  constants: f32[64] literal {64 elements, digest "), line
    assert "; [3] 3, [40] 40, [50] 50} -> {64 elements, digest " in line, line
    assert "; [3] 0.5, [40] -1, [50] 2.5} (4 of 64 differ)" in line, line
    assert "60" not in line.split("differ")[0].split("[50]")[1]  # three shown, the count says the rest
    assert ran.output.splitlines()[0] == "verdict: changed (constants)"


def test_an_elided_literal_is_told_by_its_digest(tmp_path):
    """A constant printed as ``{...}`` (hlo-audit's own lowering) carries its values' digest (``literal_sha256``):
    a change of its values is a change of its digest, named as such."""
    def elided(digest: str) -> str:
        return module().replace("f32[64]{0} constant({" + ", ".join(f"{v:g}" for v in TABLE) + "})",
                                f'f32[64]{{0}} constant({{...}}), frontend_attributes={{literal_sha256="{digest}"}}')
    ran = diff(tmp_path, elided("aa" * 32), elided("bb" * 32))
    assert ran.exit_code == 1
    assert "  constants: f32[64] literal {digest aaaaaaaa} -> {digest bbbbbbbb}" in ran.output, ran.output


# A user's train step: a linear model under optax.adam, its learning rate by the cell's quant (what a pull request
# that changes the learning rate does to the step).
LR_STEP = '''"""A linear model's train step under optax.adam."""
import jax
import jax.numpy as jnp
import optax

LEARNING_RATES = {"base": 1e-3, "lr2": 2e-3}


def target(cell):
    optimizer = optax.adam(LEARNING_RATES[cell.quant])
    params = {"w": jnp.zeros((8, 4)), "b": jnp.zeros((4,))}

    def step(params, opt_state, x, y):
        def loss(p):
            return jnp.mean((x @ p["w"] + p["b"] - y) ** 2)
        updates, opt_state = optimizer.update(jax.grad(loss)(params), opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    return jax.jit(step).trace(params, optimizer.init(params), jnp.zeros((2, 8)), jnp.zeros((2, 4)))
'''
CONFIG = """target = "lr_step:target"
models = ["linear"]
scan = ["off"]
quant = {quant}
layers = [2]
"""


@pytest.fixture(scope="module")
def lr_project(tmp_path_factory) -> Path:
    """Goldens of the step at lr 1e-3; the lr 2e-3 cell's golden is the base's (the change checked against it)."""
    project = tmp_path_factory.mktemp("lr_project")
    (project / "lr_step.py").write_text(LR_STEP)
    (project / "hlo-audit.toml").write_text(CONFIG.format(quant='["base"]'))
    updated = hlo_audit_here(project, "golden", "update")
    assert updated.returncode == 0, updated.stderr[-3000:]
    golden = project / "golden" / "linear" / "scan-off"
    (golden / "lr2").mkdir()
    shutil.copy(golden / "base" / "L2.hlo.txt", golden / "lr2" / "L2.hlo.txt")
    record = json.loads((golden / "base" / "L2.json").read_text())
    (golden / "lr2" / "L2.json").write_text(json.dumps({**record, "cell": "linear/scan-off/lr2/L2"}))
    (project / "hlo-audit.toml").write_text(CONFIG.format(quant='["base", "lr2"]'))
    return project


def test_a_learning_rate_changed_fails_check_named_with_both_values_and_its_line(lr_project):
    ran = hlo_audit_here(lr_project, "check", env={"COLUMNS": "200"})  # the line whole, whatever the terminal
    assert ran.returncode == 1, ran.stdout[-3000:] + ran.stderr[-3000:]
    line = "constants: 2 f32[] literals -0.001 -> -0.002 at lr_step.py:16 (jit(step)/mul)"
    assert line in ran.stdout, ran.stdout
    assert "changed (constants)" in ran.stdout
    doc = json.loads(hlo_audit_here(lr_project, "check", "--format", "json").stdout)
    found = {f["rule"]: f for f in doc["findings"] if f["cell"] == "linear/scan-off/lr2/L2"}
    assert found["constants"]["severity"] == "regression", found
    (change,) = found["constants"]["details"]["changes"]
    assert (change["before"], change["after"], change["subject"], change["count"]) == ("-0.001", "-0.002", "f32[]", 2)
    assert change["place"]["source"] == "lr_step.py:16" and change["place"]["op_name"] == "jit(step)/mul"
    assert doc["verdicts"]["linear/scan-off/base/L2"] == "ok"


def test_the_constants_rule_at_warn_is_advisory_and_off_is_silent(lr_project):
    config = lr_project / "hlo-audit.toml"
    text = config.read_text()
    try:
        for action, severity, code in (("warn", "advisory", 0), ("off", None, 0)):
            config.write_text(text + f'\n[policy]\nconstants = "{action}"\nhlo_text = "{action}"\n')
            ran = hlo_audit_here(lr_project, "check", "--format", "json")
            rules = {f["rule"]: f["severity"] for f in json.loads(ran.stdout)["findings"]
                     if f["cell"] == "linear/scan-off/lr2/L2"}
            assert (ran.returncode, rules.get("constants")) == (code, severity), rules
    finally:
        config.write_text(text)


# A step that multiplies by a 16-entry table baked in (a window, a Hadamard row): printed ``{...}``, its values
# known only by their digest. ``flipped`` changes one entry's sign.
TABLE_STEP = '''"""A step scaled by a baked-in 16-entry table."""
import jax
import jax.numpy as jnp
import numpy as np

TABLE = np.linspace(-1.0, 1.0, 16, dtype=np.float32)


def target(cell):
    table = TABLE.copy()
    if cell.quant == "flipped":
        table[5] = -table[5]

    def step(x):
        return jnp.tanh(x * jnp.asarray(table)).sum()

    return jax.jit(step).trace(jnp.ones((4, 16)))
'''


@pytest.mark.parametrize("stage", ["lowered", "compiled"])
def test_an_elided_16_entry_table_changed_fails_by_the_constants_rule_with_the_text_rule_advisory(tmp_path, stage):
    """Issue 47, item 3: a constant the text prints as ``{...}`` is compared by its values' digest at every stage,
    named as a constant of its shape and type that changed, and fails by the constants rule where the text rule is
    only advisory."""
    from projects import checking, judged_against_base

    module = tmp_path / "table_step.py"
    module.write_text(TABLE_STEP)
    project = judged_against_base(tmp_path / "project", module, "table", ["flipped"], stage=stage)
    checking(project, module, "table", ["flipped"], stage=stage, policy={"hlo_text": "warn"})
    ran = hlo_audit_here(project, "check", "--format", "json", "--no-cache")
    report = json.loads(ran.stdout)
    rules = {f["rule"]: f for f in report["findings"]}
    assert ran.returncode == 1 and rules.get("constants", {}).get("severity") == "regression", report["findings"]
    assert re.search(r"constants: f32\[(1,)?16\] literal {digest [0-9a-f]{8}} -> {digest [0-9a-f]{8}} at table_step.py:15 ",
                     rules["constants"]["message"]), rules["constants"]["message"]
    assert rules["hlo_text"]["severity"] == "advisory"
