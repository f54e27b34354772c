"""The gate's named rules end to end (issue 25): a team's own NNX model (tests/team_model.py) with goldens of its base
step, then one pull request's change at a time, through `hlo-audit check` in this process.

Each change of the issue's table is a regression whose finding names its kind and its place, with the text rule at
its default, with it at ``warn`` and under another environment than the golden's (where the text is advisory and
only the named rules and the counts gate); a rule turned off lets its change pass under ``hlo_text = "warn"``, so
each rule is what catches its change. A renamed weight is an advisory that ``golden update`` records; harmless
edits pass. The numbers come from the model (tests/test_structural_diff.py holds the diff itself to them).
"""

from __future__ import annotations

import inspect
import json
import shutil
from collections import Counter
from dataclasses import replace
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

import team_model as tm
from hlo_audit.config import load_config
from hlo_audit.golden.record import GoldenRecord, record_problem
from hlo_audit.hlo.locations import Locations
from hlo_audit.hlo.normalize import normalize_with_names
from hlo_audit.hlo.params import ParamSummary
from hlo_audit.hlo.text import parse_module
from hlo_audit.lowering import Lowering
from hlo_audit.matrix import Cell
from hlo_audit.results import CellResult, LoweredCell
from hlo_audit.stages.lowered import hlo_text, instruction_metadata
from in_process import hlo_audit_here

pytestmark = pytest.mark.xdist_group("named_rules")

BASE_CELL = "team/scan-off/base/L2"
# Each change of the table: the rule that must catch it and the kind of change its finding carries.
CAUGHT = {
    "donation_removed": ("donation", "donation"),
    "debug_print": ("host_transfer", "host_transfer"),
    "f32_up": ("precision", "precision"),
    "remat_removed": ("remat", "remat"),
    "unrolled_8x": ("loops", "loops"),
}
VARIANTS = [*CAUGHT, "up_renamed"]
# The changes whose place names the state they read (the callback reads the loss; a loop its activations).
READS_STATE = ("donation_removed", "f32_up", "remat_removed")
# The changes placed in the model's source: what they add is in the cell's module, whose metadata the lowered stage
# keeps beside its text (what they remove is in the golden's text only, which keeps none; a donation is a header's).
LOCATED = ("debug_print", "f32_up", "unrolled_8x")


def model_line(code: str) -> str:
    """``team_model.py:N``: the line of the model's source that holds ``code`` (once)."""
    lines = [n for n, line in enumerate(Path(tm.__file__).read_text().splitlines(), 1) if code in line]
    assert len(lines) == 1, (code, lines)
    return f"team_model.py:{lines[0]}"
CONFIG = """target = "team_model:target"
models = ["team"]
scan = ["off"]
quant = {quants}
layers = [2]
{extra}"""


def cell(variant: str) -> str:
    return f"team/scan-off/{variant}/L2"


def write_config(project: Path, quants, extra: str = "") -> None:
    (project / "hlo-audit.toml").write_text(CONFIG.format(quants=json.dumps(list(quants)), extra=extra))


def golden_of_base_for(golden: Path, variants, environment: dict | None = None) -> None:
    """The base cell's golden (record and text) as each variant's: a pull request's change checked against the
    golden its base accepted. ``environment``: keys of the golden's environment changed (a jax bump since)."""
    record = json.loads((golden / f"{BASE_CELL}.json").read_text())
    text = (golden / f"{BASE_CELL}.hlo.txt").read_text()
    for variant in variants:
        (golden / cell(variant)).parent.mkdir(parents=True, exist_ok=True)
        mine = {**record, "cell": cell(variant), "environment": {**record["environment"], **(environment or {})}}
        (golden / f"{cell(variant)}.json").write_text(json.dumps(mine, indent=1, sort_keys=True) + "\n")
        (golden / f"{cell(variant)}.hlo.txt").write_text(text)


def check(project: Path, *args) -> tuple[int, dict]:
    ran = hlo_audit_here(project, "check", "--format", "json", *args)
    assert ran.returncode in (0, 1), ran.stderr[-3000:]
    return ran.returncode, json.loads(ran.stdout)


def findings_of(report: dict, cell_id: str) -> list[dict]:
    return [f for f in report["findings"] if f["cell"] == cell_id and f["severity"] != "ok"]


def findings(report: dict, variant: str, rule: str | None = None) -> list[dict]:
    return [f for f in report["findings"] if f["cell"] == cell(variant) and rule in (None, f["rule"])]


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """The team's project: the model, goldens of its base step (lowered once), each variant lowered once into the
    project's cache by the first check."""
    folder = tmp_path_factory.mktemp("named_rules")
    shutil.copy(tm.__file__, folder / "team_model.py")
    write_config(folder, ["base"])
    updated = hlo_audit_here(folder, "golden", "update")
    assert updated.returncode == 0, updated.stderr[-3000:]
    write_config(folder, ["base", *VARIANTS])
    golden_of_base_for(folder / "golden", VARIANTS)
    return folder


@pytest.fixture(scope="module")
def reports(project, tmp_path_factory) -> dict[str, tuple[int, dict]]:
    """`check` of every variant against the base's golden: the text rule at its default, at warn, and under another
    environment than the golden's (jax bumped since: the text rule advisory by itself)."""
    out = {"default": check(project)}
    write_config(project, ["base", *VARIANTS], '[policy]\nhlo_text = "warn"\n')
    out["warn"] = check(project)
    moved = tmp_path_factory.mktemp("moved")
    shutil.copytree(project / "golden", moved / "golden")
    golden_of_base_for(moved / "golden", VARIANTS, {"jax": "0.0.1"})
    write_config(project, ["base", *VARIANTS], f'golden_dir = "{moved / "golden"}"\n')
    out["moved"] = check(project)
    write_config(project, ["base", *VARIANTS])
    return out


@pytest.mark.parametrize("how", ["default", "warn", "moved"])
@pytest.mark.parametrize("variant", list(CAUGHT))
def test_each_change_is_a_regression_naming_its_kind_and_place(reports, variant, how):
    code, report = reports[how]
    rule, kind = CAUGHT[variant]
    assert code == 1 and report["verdicts"][cell(variant)] == "regression"
    assert report["verdicts"][BASE_CELL] == "ok"
    (finding,) = findings(report, variant, rule)
    assert finding["severity"] == "regression", finding
    changes = finding["details"]["changes"]
    assert changes and {c["kind"] for c in changes} == {kind}, changes
    place = changes[0]["place"]
    # The state read where the change reads state; the model's source line and jax's op_name where the change is
    # in the cell's module (carried beside its text, which the lowered stage prints without metadata).
    assert place["computation"] == "main" and (bool(place["paths"]) is (variant in READS_STATE)), place
    located = variant in LOCATED
    assert place["op_name"].startswith("jit(train_step)/") is located, place
    if located:
        assert place["source"].startswith("team_model.py:") and not place.get("near"), place
        assert f"at {place['source']} (" in finding["message"], finding["message"]  # a long op_name's tail
    else:  # removed code, which the golden's text does not locate: near the kept code next to it, and said so
        assert not place["source"] or place.get("near") and f"near {place['source']}" in finding["message"], place
    text = findings(report, variant, "hlo_text")
    if how == "default":
        assert [f["severity"] for f in text] == ["regression"]
    else:  # advisory by policy, or by the environment moved: the named rule still fails the cell
        assert [f["severity"] for f in text] == ["advisory"]
        assert how != "moved" or "environment differs from the golden's (jax" in text[0]["message"]
    # The named finding comes before the text's, as every format lists them.
    rules = [f["rule"] for f in findings(report, variant)]
    assert rules.index(rule) < rules.index("hlo_text")


def test_what_each_finding_says(project, reports):
    """The numbers behind each finding, from the model: the donated parameters and their bytes, the callback and
    how often a step runs it, the dots and their FLOPs, the remat and the loops."""
    _, report = reports["warn"]
    details = {v: findings(report, v, CAUGHT[v][0])[0] for v in CAUGHT}
    (donation,) = details["donation_removed"]["details"]["changes"]
    params = {p: n for p, n in donation["groups"]}
    assert (donation["action"], donation["subject"], donation["count"]) == ("removed", "input_output_alias", 20)
    assert donation["bytes"] > 0 and params["state.0.blocks.*.up.kernel"] == 2
    assert "20 parameters no longer donated" in details["donation_removed"]["message"]
    (callback,) = details["debug_print"]["details"]["changes"]
    assert (callback["subject"], callback["per_step"]) == ("custom-call xla_ffi_python_cpu_callback", 1)
    assert callback["place"]["source"] == model_line("jax.debug.print(")
    assert callback["place"]["op_name"] == "jit(train_step)/debug_print"
    assert (f"host transfer added: custom-call xla_ffi_python_cpu_callback at {model_line('jax.debug.print(')} "
            "(jit(train_step)/debug_print), 1 run per step") in details["debug_print"]["message"]
    (dots,) = details["f32_up"]["details"]["changes"]
    assert (dots["before"], dots["after"], dots["count"]) == ("bf16 x bf16 -> bf16", "f32 x f32 -> f32", 8)
    assert dots["flops"] == 8 * 2 * tm.BATCH * tm.WIDTH * tm.HIDDEN
    assert dots["place"]["paths"] == ["state.0.blocks.*.up.kernel"]
    # The `up` projection's dot: jax's name for it and the model's line that calls it (flax's Linear is machinery).
    assert dots["place"]["source"] == model_line("h = getattr(self, self.variant.up_name)"), dots["place"]
    assert dots["place"]["op_name"].endswith("dot_general"), dots["place"]
    (remat,) = details["remat_removed"]["details"]["changes"]
    assert (remat["subject"], remat["action"], remat["count"]) == ("rematerialization", "removed", 2)
    assert remat["instructions"] < 0  # fewer, and still a regression
    # Fewer instructions with remat gone: no program-size "improvement" beside it.
    assert not findings(report, "remat_removed", "program_size")
    (loops,) = details["unrolled_8x"]["details"]["changes"]
    assert (loops["subject"], loops["count"], loops["per_step"]) == ("unrolled", 6, 8)
    assert "loops: 6 loops of 8 iterations, body " in details["unrolled_8x"]["message"]
    assert "unrolled (8 copies of the body inline)" in details["unrolled_8x"]["message"]
    assert loops["place"]["source"] == model_line("jax.lax.fori_loop("), loops["place"]
    # The program grew by the body's copies, which the loops finding says: not counted again as program size.
    assert not findings(report, "unrolled_8x", "program_size")


@pytest.mark.parametrize("variant", list(CAUGHT))
def test_the_rule_is_what_catches_the_change(project, reports, variant):
    """With the text rule at warn, the variant fails; with its named rule off too, it passes: remove the rule and
    the change goes through. (A loop unrolled 8x grows the program by what the loops rule says: the size ratchet
    does not count it again, so the loops rule alone holds it.)"""
    rule, _ = CAUGHT[variant]
    assert reports["warn"][1]["verdicts"][cell(variant)] == "regression"
    write_config(project, ["base", *VARIANTS], f'[policy]\nhlo_text = "warn"\n{rule} = "off"\n')
    try:
        code, report = check(project, "--only", f"quant={variant}")
    finally:
        write_config(project, ["base", *VARIANTS])
    assert (code, report["verdicts"][cell(variant)]) == (0, "advisory"), report["findings"]
    assert not findings(report, variant, rule)


def test_a_waiver_waives_a_named_rule(project):
    write_config(project, ["base", *VARIANTS], '[policy]\nhlo_text = "warn"\n\n[[waive]]\nrule = "precision"\n'
                                               'quant = "f32_up"\nreason = "the up projection needs f32"\n')
    try:
        code, report = check(project, "--only", "quant=f32_up")
    finally:
        write_config(project, ["base", *VARIANTS])
    (finding,) = findings(report, "f32_up", "precision")
    assert (code, finding["severity"]) == (0, "waived") and "the up projection needs f32" in finding["message"]


def test_a_renamed_weight_is_an_advisory_that_golden_update_records(project, tmp_path):
    mine = tmp_path / "project"
    shutil.copytree(project, mine, ignore=shutil.ignore_patterns(".hlo-audit-cache"))
    write_config(mine, ["base", "up_renamed"], f'cache_dir = "{project / ".hlo-audit-cache"}"\n')
    code, report = check(mine)
    assert (code, report["verdicts"][cell("up_renamed")]) == (0, "advisory")
    (text,) = findings(report, "up_renamed", "hlo_text")
    assert text["severity"] == "advisory" and text["details"]["verdict"] == "renamed-only"
    (rename,) = text["details"]["renames"]
    assert (rename["kind"], rename["before"], rename["after"], rename["count"]) == ("rename", "up", "up_proj", 6)
    assert "renamed-only: the same program" in text["message"] and "rename: up -> up_proj" in text["message"]
    assert {f["rule"] for f in findings(report, "up_renamed")} == {"count", "hlo_text"}  # no named rule fires
    updated = hlo_audit_here(mine, "golden", "update", "--only", "quant=up_renamed")
    assert updated.returncode == 0, updated.stderr
    code, report = check(mine)
    assert code == 0 and report["verdicts"][cell("up_renamed")] == "ok", report["findings"]


# Harmless edits of the model's source: a comment, a local renamed, the project in another folder.
HARMLESS = [("        h = nnx.gelu(h).astype(jnp.bfloat16)\n",
             "        # the activation, in bf16 as the down projection reads it\n"
             "        activated = nnx.gelu(h).astype(jnp.bfloat16)\n        h = activated\n"),
            ("            y = m(x)\n            return jnp.mean(y * y)\n",
             "            out = m(x)\n            return jnp.mean(out * out)\n")]


def test_harmless_edits_pass(project, tmp_path):
    mine = tmp_path / "elsewhere"
    mine.mkdir()
    shutil.copytree(project / "golden", mine / "golden")
    source = (project / "team_model.py").read_text()
    for before, after in HARMLESS:
        assert source.count(before) == 1
        source = source.replace(before, after)
    (mine / "team_harmless.py").write_text(source)  # its own module: this process imported team_model already
    (mine / "hlo-audit.toml").write_text(CONFIG.format(quants='["base"]', extra="").replace(
        "team_model:target", "team_harmless:target"))
    code, report = check(mine)
    assert (code, report["verdicts"]) == (0, {BASE_CELL: "ok"}), report["findings"]


def test_donation_removed_at_stage_compiled_is_a_regression_not_a_memory_improvement(tmp_path):
    """Compiled, the step without donation needs less temp memory while every donated buffer is kept beside its
    outputs (alias_bytes to 0): the donation finding names the parameters, their bytes and that memory; no memory
    "improvement". Where no text is compared, alias_bytes alone says it."""
    shutil.copy(tm.__file__, tmp_path / "team_model.py")
    policy = '[policy]\nmemory = "fail"\nhlo_text = "warn"\n'
    write_config(tmp_path, ["base"], f'stage = "compiled"\n{policy}')
    assert hlo_audit_here(tmp_path, "golden", "update").returncode == 0
    golden = tmp_path / "golden"
    record = json.loads((golden / f"{BASE_CELL}/compiled.json").read_text())
    assert record["memory"]["alias_bytes"] > 0
    for with_text in (True, False):
        (golden / cell("donation_removed")).mkdir(parents=True, exist_ok=True)
        mine = {**record, "cell": f"{cell('donation_removed')}/compiled", "hlo": record["hlo"] if with_text else None}
        (golden / f"{cell('donation_removed')}/compiled.json").write_text(json.dumps(mine))
        if with_text:
            shutil.copy(golden / f"{BASE_CELL}/compiled.hlo.txt", golden / f"{cell('donation_removed')}/compiled.hlo.txt")
        else:
            (golden / f"{cell('donation_removed')}/compiled.hlo.txt").unlink()
        write_config(tmp_path, ["base", "donation_removed"], f'stage = "compiled"\n{policy}')
        code, report = check(tmp_path)
        (finding,) = [f for f in report["findings"] if f["rule"] == "donation"]
        assert (code, finding["severity"]) == (1, "regression"), report["findings"]
        sizes = finding["details"]["sizes"]
        assert (sizes["alias_bytes"]["golden"], sizes["alias_bytes"]["now"]) == (record["memory"]["alias_bytes"], 0)
        assert "the cost of the lost donation, not a memory improvement" in finding["message"]
        assert not [f for f in report["findings"] if f["rule"] == "memory"], report["findings"]
        changes = finding["details"]["changes"]
        if with_text:
            (lost,) = changes
            assert (lost["action"], lost["count"], lost["bytes"]) == ("removed", 20, record["memory"]["alias_bytes"])
            assert "20 parameters no longer donated" in finding["message"]
        else:
            assert changes == []


KERNEL_TARGET = '''"""A user's jitted function with a Pallas kernel, its source at {where} (as from a checkout or a venv there)."""
import importlib.util
from pathlib import Path

import jax
import jax.numpy as jnp

_path = Path(__file__).parent / "{where}" / "pallas_kernel.py"
_spec = importlib.util.spec_from_file_location("{module}_kernel", _path)
kernel = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(kernel)


def target(cell):
    block = int(cell.quant.removeprefix("block"))
    x = jax.ShapeDtypeStruct((kernel.ROWS, kernel.COLUMNS), jnp.float32)
    return jax.jit(lambda x: kernel.scale_shift(x, block)).trace(x)
'''
KERNEL_CONFIG = """target = "{module}:target"
models = ["kernel"]
scan = ["off"]
quant = {quants}
layers = [1]
platform = "tpu"
topology = "v6e-4"
golden_dir = "{golden}"
[policy]
hlo_text = "warn"
"""


def kernel_project(folder: Path, where: str, module: str, quants, golden: Path) -> Path:
    """A project whose target runs tests/pallas_kernel.py from ``folder / where`` (its own module names: this
    process may have imported another copy)."""
    (folder / where).mkdir(parents=True)
    shutil.copy(Path(tm.__file__).parent / "pallas_kernel.py", folder / where / "pallas_kernel.py")
    (folder / f"{module}.py").write_text(KERNEL_TARGET.format(where=where, module=module))
    (folder / "hlo-audit.toml").write_text(KERNEL_CONFIG.format(module=module, quants=json.dumps(quants),
                                                                golden=golden))
    return folder


@pytest.mark.tpu
def test_a_kernel_body_change_fails_check_and_a_venv_elsewhere_passes(tmp_path):
    """A Pallas kernel (Mosaic, one chip of a TPU v6e-4 topology through libtpu): the golden keeps its content
    digest; its block size 128 -> 256 fails check (by the kernels rule, also with hlo_text at warn), the same
    kernel from another path passes although its body embeds that path."""
    golden = tmp_path / "checkout/golden"  # inside the project that writes it (issue 37); read from elsewhere
    here = kernel_project(tmp_path / "checkout", "src", "kernel_here", ["block128", "block256"], golden)
    (here / "hlo-audit.toml").write_text((here / "hlo-audit.toml").read_text().replace(
        '["block128", "block256"]', '["block128"]'))
    assert hlo_audit_here(here, "golden", "update").returncode == 0
    cell_128 = "kernel/scan-off/block128/L1/tpu-v6e-4"
    record = json.loads((golden / f"{cell_128}.json").read_text())
    (name, digests), = record["kernels"].items()
    assert len(digests) == 1 and len(digests[0]) == 16
    assert "<kernel body dropped>" in (golden / f"{cell_128}.hlo.txt").read_text()
    # Block 256 checked against block 128's golden.
    cell_256 = cell_128.replace("block128", "block256")
    (golden / cell_256).parent.mkdir(parents=True, exist_ok=True)
    (golden / f"{cell_256}.json").write_text(json.dumps({**record, "cell": cell_256}))
    shutil.copy(golden / f"{cell_128}.hlo.txt", golden / f"{cell_256}.hlo.txt")
    (here / "hlo-audit.toml").write_text((here / "hlo-audit.toml").read_text().replace(
        '["block128"]', '["block128", "block256"]'))
    code, report = check(here)
    assert code == 1 and report["verdicts"] == {cell_128: "ok", cell_256: "regression"}, report["findings"]
    (finding,) = [f for f in report["findings"] if f["cell"] == cell_256 and f["rule"] == "kernels"]
    (body,) = finding["details"]["kernels"]
    assert finding["severity"] == "regression" and body["name"] == name and body["golden"] == digests
    assert body["now"] != digests and f"kernel body changed: {name}" in finding["message"]
    # The kernels rule is what catches it: off, the change passes.
    config = (here / "hlo-audit.toml").read_text()
    (here / "hlo-audit.toml").write_text(config + 'kernels = "off"\n')
    code, report = check(here)
    assert (code, report["verdicts"][cell_256]) == (0, "advisory" if findings_of(report, cell_256) else "ok")
    (here / "hlo-audit.toml").write_text(config)
    # The same program from a venv at another path: its kernel's locations name that path; the digest does not.
    elsewhere = kernel_project(tmp_path / "another", "venv/site-packages/project", "kernel_elsewhere",
                               ["block128"], golden)
    code, report = check(elsewhere)
    assert (code, report["verdicts"]) == (0, {cell_128: "ok"}), report["findings"]
    # A golden written before digests were kept compares none: no kernels finding, but a missing_golden one that
    # names the digests (issue 34: the block size change passed, "matches its golden"), and `golden update` writes
    # them (the record it would write differs from the stored one: never "unchanged").
    del record["kernels"], record["format"]
    (golden / f"{cell_256}.json").write_text(json.dumps({**record, "cell": cell_256}))
    code, report = check(here, "--only", "quant=block256")
    assert not [f for f in report["findings"] if f["rule"] == "kernels"]
    (finding,) = [f for f in report["findings"] if f["rule"] == "missing_golden"]
    assert code == 1 and finding["severity"] == "regression" and finding["details"]["lacks"] == ["kernels"]
    assert "(golden format 1) without kernel digests: the rule kernels has nothing to compare" in finding["message"]
    updated = hlo_audit_here(here, "golden", "update", "--only", "quant=block256")
    assert updated.returncode == 0 and "1 written" in updated.stdout, updated.stdout
    assert json.loads((golden / f"{cell_256}.json").read_text())["kernels"] != {name: digests}


def test_every_format_shows_the_named_finding_before_the_text(project, tmp_path):
    """Terminal, JUnit, markdown and a merge of shards' JSON: the donation lost, named, before the text's line."""
    named = "donation: 20 parameters no longer donated (input_output_alias)"
    text = "normalized HLO differs from the golden"
    ran = hlo_audit_here(project, "check", "--only", "quant=donation_removed", "--junit", str(tmp_path / "out.xml"),
                         "--markdown", str(tmp_path / "out.md"), env={"COLUMNS": "400"})
    assert ran.returncode == 1
    terminal = " ".join(ran.stdout.split())
    assert named in terminal and terminal.index(named) < terminal.index(text)
    suite = ET.parse(tmp_path / "out.xml").getroot()
    (failure,) = [c.find("failure") for c in suite if c.find("failure") is not None]
    assert failure.get("type") == "donation" and named in failure.get("message")
    assert failure.text.index(named) < failure.text.index(text)
    markdown = (tmp_path / "out.md").read_text()
    assert named in markdown and markdown.index(named) < markdown.index(text)
    shard = hlo_audit_here(project, "check", "--only", "quant=donation_removed", "--shard", "1/1", "--format", "json")
    (tmp_path / "shard.json").write_text(shard.stdout)
    merged = hlo_audit_here(project, "merge", str(tmp_path / "shard.json"), "--format", "json")
    (finding,) = [f for f in json.loads(merged.stdout)["findings"] if f["rule"] == "donation"]
    assert merged.returncode == 1 and named in finding["message"]
    assert finding["details"]["changes"][0]["bytes"] > 0


@pytest.mark.parametrize("text,said", [
    ("program_size_tolerance = 1.5\n", "program_size_tolerance: expected a fraction in [0, 1), e.g. 0.05 for 5%"),
    ('program_size_tolerance = "5%"\n', "program_size_tolerance: expected a fraction"),
    ('[policy]\nprecision = "loud"\n', "policy.precision: expected 'fail', 'warn' or 'off'"),
    ('[[waive]]\nrule = "kernel"\nreason = "x"\n', "waive[0].rule: expected one of"),
])
def test_a_bad_named_rule_setting_is_one_line(tmp_path, text, said):
    (tmp_path / "hlo-audit.toml").write_text(text)
    ran = hlo_audit_here(tmp_path, "list")
    assert ran.returncode == 2 and said in ran.stderr and ran.stderr.count("\n") == 1, ran.stderr


def test_named_rule_settings_reach_the_policy(tmp_path):
    (tmp_path / "hlo-audit.toml").write_text('program_size_tolerance = 0.2\n[policy]\nkernels = "warn"\n')
    rules = load_config(cwd=tmp_path).rules
    assert (rules.tolerances["program_size"], rules.actions["kernels"], rules.actions["donation"]) == (0.2, "warn", "fail")
    (tmp_path / "hlo-audit.toml").write_text('[policy]\nloops = "warn"\nremat = "off"\ngradient = "fail"\n')
    rules = load_config(cwd=tmp_path).rules
    assert (rules.actions["loops"], rules.actions["remat"], rules.actions["gradient"]) == ("warn", "off", "fail")


def test_the_golden_record_keeps_kernel_digests_and_reads_old_ones():
    base = {"cell": "k/scan-off/none/L1", "entry_params": 1, "by_dtype": {"f32": 1}, "by_role": {"input": 1},
            "groups": {"x": 1}, "environment": {"jax": "0.12.0.1"}}
    with_kernels = {**base, "kernels": {"scale_shift": ["0123456789abcdef"]}}
    assert record_problem(with_kernels, base["cell"]) is None
    record = GoldenRecord.from_json(with_kernels)
    assert record.kernels == {"scale_shift": ("0123456789abcdef",)}
    assert record.to_json()["kernels"] == {"scale_shift": ["0123456789abcdef"]}
    old = GoldenRecord.from_json(base)  # written before digests were kept: none, and none written back
    assert old.kernels is None and "kernels" not in old.to_json()
    assert record_problem({**base, "kernels": {"scale_shift": "0123"}}, base["cell"]) == \
        "not a golden summary: 'kernels' is malformed"


def test_the_lowered_stage_reads_each_instruction_s_place_as_jax_s_debug_text_prints_it():
    """The places the lowered stage keeps beside its text (read from the serialized module's metadata and stack
    frames) are those jax's own text with debug info says, instruction by instruction (the text's table numbering and
    ``hlo.locations``' walk to the model's frame are the oracle); the text the stage prints stays without them."""
    here = f"test_named_rules.py:{inspect.currentframe().f_lineno + 1}"
    lowered = tm.traced(tm.VARIANTS["debug_print"]).lower(lowering_platforms=("cpu",))
    module = lowered.compiler_ir(dialect="hlo").as_hlo_module()
    places = instruction_metadata(module).places()
    debug = parse_module(lowered.as_text(dialect="hlo", debug_info=True))
    said = Locations(debug)
    oracle = {(c.name, i.name): (i.op_name.replace("\\'", "'"), chain[0] if chain else "", chain[1:])
              for c in debug.computations.values() for i in c.instructions
              if (chain := said.chain_of(i)) or i.op_name}
    assert places == oracle
    # Each instruction keeps the user's frames that called its source: the model's step, then this test's call.
    assert any(origin.callers[0].startswith("team_model.py:") and here in origin.callers
               for origin in places.values() if origin.callers), sorted({o.callers for o in places.values()})[:3]
    sources = Counter(source for _, source, _ in places.values())
    assert sources[model_line("jax.debug.print(")] >= 1 and all("/" not in s for s in sources), sources
    assert "metadata=" not in hlo_text(lowered, module)


def test_places_follow_the_canonical_names_and_the_result_record():
    """Keyed by the canonical text's names (what the structural diff reads), the callback is placed at the model's
    line; the lowering's metadata and the result's places come back from the cache's records as they went in, and
    a result without places writes none."""
    lowered = tm.traced(tm.VARIANTS["debug_print"]).lower(lowering_platforms=("cpu",))
    module = lowered.compiler_ir(dialect="hlo").as_hlo_module()
    text, _, names = normalize_with_names(parse_module(hlo_text(lowered, module)))
    metadata = instruction_metadata(module)
    cached = Lowering.from_cache(text, json.loads(json.dumps(Lowering(text, metadata=metadata).meta()))).metadata
    assert cached == metadata  # the cache keeps it raw: the analysis, not the lowering, decides the model's frame
    places = cached.places(names)
    canonical = parse_module(text)
    held = {(c.name, i.name) for c in canonical.computations.values() for i in c.instructions}
    assert places and set(places) <= held
    (callback,) = [(c.name, i.name) for c in canonical.computations.values() for i in c.instructions
                   if i.custom_call_target == "xla_ffi_python_cpu_callback"]
    assert places[callback][:2] == ("jit(train_step)/debug_print", model_line("jax.debug.print("))
    assert places[callback].callers  # the model's frames that called it, kept through the cache's record
    result = LoweredCell(cell=Cell("team", False, "base", 2), places=places,
                         summary=ParamSummary(entry_params=0, by_dtype={}, by_role={}, groups={}, bytes_by_role={}))
    assert CellResult.from_record(json.loads(json.dumps(result.to_record()))).places == places
    assert "places" not in replace(result, places=None).to_record()
