"""A green check is verified, not taken from a golden's word (issue 37 items 2-4).

The team's model (tests/team_model.py): the base step's golden, lowered once, copied as the golden of a cell whose
step really changed (``f32_up``: one projection in f32, the precision rule's; ``unrolled_8x``: a loop unrolled, the
loops rule's), then edited the ways a pull request could edit it. Each is a program change the gate must see:

* the code under test's version moved (``maxtext 0.2.3`` recorded, as MaxText's release bump; ``flax`` edited; an
  extra ``environment.note``): judged as the change, never advisory (only the compiler stack relaxes);
* the golden's jax edited to another jax (OTHER_JAX): advisory on a local run, saying so; a failure on a pinned
  (CI) run, naming the command that re-blesses;
* a key twice, an unknown key, a malformed optional key, NaN, an impossible host figure: one line, exit 2, naming
  the file and the key; `golden update` rewrites it;
* a host figure deleted beside the timing `measure --record` wrote with it: a missing_golden finding;
* a cell with a golden that is unavailable here: a failing finding, unless a waiver with a reason accepts it.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import jax
import pytest

import team_model as tm
from hlo_audit import comparison as compare
from hlo_audit.comparison import environment_changes
from hlo_audit.stack import StackMode, is_compiler, stack_mode
from hlo_audit.usage import InputError
from in_process import hlo_audit_here
from test_named_rules import BASE_CELL, cell, write_config

# A jax that writes closed calls otherwise than the one running (compare.CLOSED_CALLS_AS_CALLS): 0.10 writes them as
# calls, 0.11 and later inline; never the running one (make compat runs jax 0.10.2).
OTHER_JAX = "0.10.1" if jax.__version_info__ >= (0, 11) else "0.12.0"

pytestmark = pytest.mark.xdist_group("golden_claims")

CHANGED = "f32_up"  # the precision rule's change
PINNED = {"HLO_AUDIT_STACK": "pinned"}


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """The team's project with the base step's golden (lowered once; each test copies it)."""
    folder = tmp_path_factory.mktemp("claims")
    shutil.copy(tm.__file__, folder / "team_model.py")
    write_config(folder, ["base"])
    assert hlo_audit_here(folder, "golden", "update").returncode == 0
    return folder


@pytest.fixture
def project(base, tmp_path) -> Path:
    folder = tmp_path / "p"
    shutil.copytree(base, folder)
    return folder


def as_golden_of(project: Path, variant: str, edit=None, raw: str | None = None) -> Path:
    """The base's golden as ``variant``'s (a pull request's change against what its base accepted), its record
    edited by ``edit`` (dict -> None) or its summary replaced by ``raw``; returns the summary's path."""
    golden = project / "golden"
    record = json.loads((golden / f"{BASE_CELL}.json").read_text())
    record["cell"] = cell(variant)
    if edit is not None:
        edit(record)
    summary = golden / f"{cell(variant)}.json"
    summary.parent.mkdir(parents=True, exist_ok=True)
    summary.write_text(raw if raw is not None else json.dumps(record, indent=1, sort_keys=True) + "\n")
    shutil.copy(golden / f"{BASE_CELL}.hlo.txt", golden / f"{cell(variant)}.hlo.txt")
    write_config(project, ["base", variant])
    return summary


def check(project: Path, env: dict | None = None) -> tuple[int, list[dict]]:
    ran = hlo_audit_here(project, "check", "--format", "json", env=env)
    assert ran.returncode in (0, 1), ran.stderr[-3000:]
    return ran.returncode, [f for f in json.loads(ran.stdout)["findings"] if f["severity"] != "ok"]


def environment(**changes):
    def edit(record):
        record["environment"].update(changes)
    return edit


def test_which_versions_are_the_compiler_stack_and_when_a_run_is_pinned():
    assert all(is_compiler(k) for k in ("jax", "jaxlib", "libtpu", "jax-cuda12-plugin", "nvidia-cudnn-cu12",
                                        "transformer-engine-jax", "gpu_target_sha256", "platform", "stage"))
    assert not any(is_compiler(k) for k in ("maxtext", "flax", "optax", "note", "my-model"))
    assert stack_mode({}) is StackMode.LOCAL and stack_mode({"CI": "false"}) is StackMode.LOCAL
    assert stack_mode({"CI": "true"}) is StackMode.PINNED and stack_mode({"GITHUB_ACTIONS": "true"}) is StackMode.PINNED
    assert stack_mode({"CI": "true", "HLO_AUDIT_STACK": "local"}) is StackMode.LOCAL
    assert stack_mode({"HLO_AUDIT_STACK": "pinned"}) is StackMode.PINNED
    with pytest.raises(InputError, match="HLO_AUDIT_STACK='pin': expected 'pinned' or 'local'"):
        stack_mode({"HLO_AUDIT_STACK": "pin"})


def test_a_code_under_test_version_never_relaxes_a_change(project):
    """MaxText's PR 89b8bf976 with the release's version bump passed as "environment differs: advisory" (here flax's:
    the callable target records no maxtext; a key its cells do not record is refused, below)."""
    as_golden_of(project, CHANGED, environment(flax="0.12.11"))
    code, found = check(project)
    rules = {f["rule"]: f["severity"] for f in found}
    assert code == 1 and rules.get("precision") == "regression" and rules.get("hlo_text") == "regression", found
    assert not [f for f in found if f["severity"] == "advisory"], found


def test_a_golden_of_another_jax_is_advisory_locally_and_fails_a_pinned_run(project):
    """The golden's jax edited to another jax (OTHER_JAX) made program_size and loops advisory: an 8x unroll passed.
    Locally the text stays advisory (another stack prints another text), but the golden's text holds no closed call
    as OTHER_JAX would write it: the loops rule is not relaxed on its word (issue 48)."""
    summary = as_golden_of(project, "unrolled_8x", environment(jax=OTHER_JAX))
    code, found = check(project)
    assert code == 1 and {f["rule"]: f["severity"] for f in found}.get("loops") == "regression", found
    advisory = [f for f in found if f["severity"] == "advisory"]
    assert advisory and all("advisory on this local run (a pinned CI run fails it" in f["message"]
                            for f in advisory), found
    ran = hlo_audit_here(project, "check", env={"HLO_AUDIT_STACK": "pin"})
    assert ran.returncode == 2 and ran.stderr.splitlines()[-1] == (
        "hlo-audit: error: HLO_AUDIT_STACK='pin': expected 'pinned' or 'local'"), ran.stderr[-2000:]
    code, found = check(project, PINNED)
    by_rule = {f["rule"]: f for f in found}
    # The unroll is the loops rule's (its growth not counted again as program size), a regression when pinned.
    assert code == 1 and by_rule["loops"]["severity"] == "regression" and "program_size" not in by_rule, found
    stack = by_rule["missing_golden"]
    assert stack["severity"] == "regression" and stack["details"]["stack"]["jax"]["golden"] == OTHER_JAX
    assert stack["message"].startswith(f"{summary}: recorded under another compiler stack (jax {OTHER_JAX} -> ")
    assert "pinned (HLO_AUDIT_STACK=pinned" in stack["message"]
    assert stack["message"].endswith(f"re-bless it under this stack: hlo-audit golden update --only "
                                     f"id={cell('unrolled_8x')}")
    assert not [f for f in found if f["severity"] == "advisory"], found


LR_CHANGE = "lr_up"  # the learning rate doubled: a constant of the step, the constants rule's


@pytest.mark.parametrize("key,value,said", [
    ("libtpu", "0.0.52", "'environment.libtpu' is no key of this cell's environment (this stack records flax, jax, "
                         "jaxlib, platform, stage)"),
    ("maxtext", "0.2.3", "'environment.maxtext' is no key of this cell's environment"),
    ("note", "reviewed", "'environment.note' is no key of this cell's environment"),
    ("platform", "tpu", "'environment.platform' is 'tpu': the cell's platform is 'cpu'"),
    ("stage", "compiled", "'environment.stage' is 'compiled': the cell's stage is 'lowered'"),
    ("jax", jax.__version__ + " ", f"'environment.jax' is malformed: '{jax.__version__} ' has stray whitespace"),
    ("jaxlib", None, "'environment.jaxlib' is missing (this stack records it for the cell: "),
], ids=["libtpu", "maxtext", "note", "platform", "stage", "jax-space", "jaxlib-missing"])
@pytest.mark.parametrize("env", [{}, PINNED], ids=["local", "pinned"])
def test_a_golden_environment_is_read_against_the_running_stack(project, key, value, said, env):
    """Issue 48: with CI unset, an extra "libtpu" in a CPU cell's golden, "platform": "tpu", or a jax with a trailing
    space, each beside a learning-rate change, read as another compiler stack: exit 0, constants and hlo_text
    advisory. Refused in one line naming the file and the key, locally as on CI; `golden update` rewrites it."""
    def edit(record):
        if value is None:
            del record["environment"][key]
        else:
            record["environment"][key] = value
    summary = as_golden_of(project, LR_CHANGE, edit)
    ran = hlo_audit_here(project, "check", env=env)
    errors = [line for line in ran.stderr.splitlines() if not line.startswith("hlo-audit: cell ")]
    assert ran.returncode == 2 and len(errors) == 1 and "Traceback" not in ran.stderr, ran.stderr[-3000:]
    assert errors[0].startswith(f"hlo-audit: error: {summary}: not a golden summary: {said}"), errors
    assert errors[0].endswith(f"rewrite it with: hlo-audit golden update --only id={cell(LR_CHANGE)}"), errors
    assert hlo_audit_here(project, "golden", "update").returncode == 0
    assert key not in ("libtpu", "maxtext", "note") or key not in json.loads(summary.read_text())["environment"]
    assert hlo_audit_here(project, "check").returncode == 0


def test_a_learning_rate_change_is_found_against_a_sound_golden(project):
    """The learning-rate change of the test above, against the base's golden as written: the constants rule fails."""
    as_golden_of(project, LR_CHANGE)
    code, found = check(project)
    assert code == 1 and "constants" in {f["rule"] for f in found if f["severity"] == "regression"}, found


def test_a_golden_claiming_a_jax_its_text_was_not_written_by_relaxes_nothing(project):
    """Issue 48: the golden's jax set to 0.10.2 (whose jax writes closed_calls as calls) beside a loop unrolled 8x:
    "1 advisory", exit 0 on a local run. Its text, written by the running jax, holds no closed_call written as a call
    (on 0.10.2: the claim is 0.12, over a text that holds them): the claim relaxes nothing, and the loops rule fails
    the unroll."""
    claimed = "0.10.2" if jax.__version_info__ >= (0, 11) else "0.12.0.1"
    as_golden_of(project, "unrolled_8x", environment(jax=claimed))
    code, found = check(project)
    loops = [f for f in found if f["rule"] == "loops"]
    assert code == 1 and [f["severity"] for f in loops] == ["regression"], found


# Lines of the team model's step as jax 0.10.2 writes it (a closed_call as a call) and as 0.12 writes jnp's own
# nested jit inside a loop body (a call in every jax), canonical (``%name.<hash>``) and as jax prints them.
CLOSED_CALL_0_10 = ("  %call.a1 = bf16[4,32]{1,0} call(%get-tuple-element.b2), to_apply=%closed_call_0.c3, "
                    'metadata={op_name="jit(train_step)/while/body/closed_call"}')
CLOSED_CALL_PRINTED = "  closed_call.1 = bf16[4,32]{1,0} call(get-tuple-element.2), to_apply=closed_call_0.2"
NESTED_JIT = "  %call.d4 = bf16[4,32]{1,0} call(%get-tuple-element.e5, %sub.f6), to_apply=%dynamic_index_in_dim.a7"


@pytest.mark.parametrize(("golden", "now", "golden_text", "now_text", "relaxed"), [
    ("0.12.0.1", "0.10.2", NESTED_JIT, CLOSED_CALL_0_10 + "\n" + NESTED_JIT, True),  # make compat's real case
    ("0.10.2", "0.12.0.1", CLOSED_CALL_PRINTED, NESTED_JIT, True),  # a golden 0.10.2 wrote, checked on 0.12
    ("0.10.2", "0.12.0.1", NESTED_JIT, NESTED_JIT, False),  # claimed 0.10.2 over 0.12's text: no closed_call
    ("0.12.0.1", "0.10.2", CLOSED_CALL_0_10, CLOSED_CALL_0_10, False),  # claimed 0.12 over 0.10.2's text
    ("0.12.0.1", "0.11.2", NESTED_JIT, NESTED_JIT, False),  # both inline: nothing to relax
])
def test_closed_calls_relax_only_where_both_texts_bear_their_jax_out(golden, now, golden_text, now_text, relaxed):
    changes = environment_changes({"jax": golden}, {"jax": now})
    counts = (compare._closed_calls_in(golden_text), compare._closed_calls_in(now_text))
    assert compare.closed_calls_borne_out(changes, *counts) is relaxed, counts


STACK_SETTER = """import os

os.environ["HLO_AUDIT_STACK"] = "local"  # code under test switching a CI run's pinned mode off at import

from team_model import target  # noqa: E402,F401
"""


def test_code_under_test_cannot_switch_pinned_mode_off(project, monkeypatch):
    """Issue 48: under CI=true, a target module that sets HLO_AUDIT_STACK=local when imported, beside a golden forged
    to another jax: exit 0. The mode is read at start-up, before the target is imported: the golden of another
    stack fails the pinned run."""
    as_golden_of(project, LR_CHANGE, environment(jax=OTHER_JAX))  # a local run: constants advisory, exit 0
    (project / "stack_setter.py").write_text(STACK_SETTER)
    config = project / "hlo-audit.toml"
    config.write_text(config.read_text().replace("team_model:target", "stack_setter:target"))
    monkeypatch.delenv("HLO_AUDIT_STACK", raising=False)  # restored after the test: the target sets it here
    try:
        code, found = check(project, {"CI": "true"})
    finally:
        sys.modules.pop("stack_setter", None)
    stack = [f for f in found if f["rule"] == "missing_golden"]
    assert code == 1 and stack and stack[0]["details"]["stack"]["jax"]["golden"] == OTHER_JAX, found
    assert "pinned (CI=true" in stack[0]["message"], stack


def test_code_under_test_cannot_switch_pinned_mode_off_in_the_pytest_plugin(project):
    """The same through `pytest --hlo-audit` (a process: the plugin reads the mode when pytest configures it, before
    the target is imported by the cell's item)."""
    import os
    import subprocess

    as_golden_of(project, LR_CHANGE, environment(jax=OTHER_JAX))  # a local run: constants advisory, exit 0
    (project / "stack_setter.py").write_text(STACK_SETTER)
    config = project / "hlo-audit.toml"
    config.write_text(config.read_text().replace("team_model:target", "stack_setter:target"))
    env = {k: v for k, v in os.environ.items() if k != "HLO_AUDIT_STACK"} | {"CI": "true"}
    ran = subprocess.run([sys.executable, "-m", "pytest", "--hlo-audit", "-p", "no:cacheprovider", "-q",
                          "-p", "no:xdist"], cwd=project, capture_output=True, text=True, timeout=600, env=env)
    assert ran.returncode == 1 and f"FAILED hlo-audit::{cell(LR_CHANGE)}" in ran.stdout, ran.stdout[-3000:]
    assert "recorded under another compiler stack" in ran.stdout, ran.stdout[-3000:]


def test_golden_update_writes_no_golden_for_a_code_version_alone(project):
    summary = project / "golden" / f"{BASE_CELL}.json"
    record = json.loads(summary.read_text())
    record["environment"]["flax"] = "0.12.11"
    summary.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    before = summary.read_bytes()
    updated = hlo_audit_here(project, "golden", "update")
    assert updated.returncode == 0 and "0 written, 1 unchanged" in updated.stdout, updated.stdout
    assert summary.read_bytes() == before
    record["environment"]["jax"] = OTHER_JAX  # the compiler stack is a change to write
    summary.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    assert "1 written" in hlo_audit_here(project, "golden", "update").stdout
    assert json.loads(summary.read_text())["environment"]["jax"] != OTHER_JAX


def _duplicate_environment(text: str) -> str:
    return text.rstrip().removesuffix("}") + f', "environment": {{"jax": "{OTHER_JAX}"}}\n}}\n'


def _edited(key: str, value):
    def edit(record):
        section, _, name = key.partition(".")
        if name:
            record[section][name] = value
        else:
            record[section] = value
    return edit


CLAIMS = [
    ("duplicate", None, "key 'environment' appears twice"),
    ("unknown", _edited("note", "looks fine"), "unknown key 'note'"),
    ("environment", _edited("environment", ["jax"]), "'environment' is malformed"),
    ("rng_increments", _edited("rng_increments", "x"), "'rng_increments' is malformed"),
    ("slopes.depths", _edited("slopes", {"depths": 5, "total": 1, "by_dtype": {}, "by_role": {}}),
     "'slopes.depths' is malformed"),
    ("entry_params", _edited("entry_params", 1), "'by_dtype' adds up to"),
    ("entry_params as a string", _edited("entry_params", "13"), "'entry_params' is malformed"),
    ("host.leaves", _edited("host", {"caller": "nnx.jit", "leaves": 10**9, "per_call_us": [1, 2, 3],
                                     "machine": "m"}), "'host.leaves' is 1000000000: no figure of a step"),
    ("host.per_call_us", _edited("host", {"caller": "nnx.jit", "leaves": 5, "per_call_us": [3, 2, -1],
                                          "machine": "m"}), "'host.per_call_us' is malformed"),
]


@pytest.mark.parametrize("name,edit,said", CLAIMS, ids=[c[0] for c in CLAIMS])
def test_a_golden_claiming_what_hlo_audit_never_writes_is_refused_in_one_line(project, name, edit, said):
    """A second "environment" appended (json keeps the last, a reviewer reads the first), an unknown key, a malformed
    optional key (a traceback before), counts that do not add up, a host figure forged: exit 2, one line naming file
    and key; `golden update` rewrites it, and the change is then found."""
    summary = as_golden_of(project, CHANGED, edit)
    if edit is None:
        summary.write_text(_duplicate_environment(summary.read_text()))
    ran = hlo_audit_here(project, "check")
    errors = [line for line in ran.stderr.splitlines() if not line.startswith("hlo-audit: cell ")]
    assert ran.returncode == 2 and len(errors) == 1 and "Traceback" not in ran.stderr, ran.stderr[-3000:]
    assert errors[0].startswith(f"hlo-audit: error: {summary}: not a golden summary: {said}"), errors
    assert errors[0].endswith(f"rewrite it with: hlo-audit golden update --only id={cell(CHANGED)}")
    assert hlo_audit_here(project, "golden", "update").returncode == 0
    assert hlo_audit_here(project, "check").returncode == 0


def test_a_non_finite_figure_is_refused_in_one_line(project):
    summary = as_golden_of(project, CHANGED)
    summary.write_text(summary.read_text().replace('"entry_params": ', '"cost": {"flops": NaN}, "entry_params": ', 1))
    ran = hlo_audit_here(project, "check")
    assert ran.returncode == 2 and ran.stderr.splitlines()[-1] == (
        f"hlo-audit: error: {summary}: not a golden summary: NaN is no number a golden holds; rewrite it with: "
        f"hlo-audit golden update --only id={cell(CHANGED)}"), ran.stderr[-2000:]


MEASURED = {"cell": BASE_CELL, "caller": "nnx.jit", "leaves": 20, "compile_s": 1.0, "blocked_ms": [1, 1, 1],
            "queued_ms": [1, 1, 1], "host_ms": [1, 1, 1], "argument_bytes": None, "temp_bytes": None,
            "runtime_peak_bytes": None, "device": "cpu"}


def test_a_host_figure_deleted_beside_its_timing_is_a_finding(project):
    """`measure --record` writes the figure and the timing together: the timing without its figure turned host_cost
    off for the cell ("no findings")."""
    summary = project / "golden" / f"{BASE_CELL}.json"
    record = json.loads(summary.read_text())
    summary.write_text(json.dumps({**record, "measured": MEASURED}, indent=1, sort_keys=True) + "\n")
    code, found = check(project)
    (finding,) = found
    assert code == 1 and finding["rule"] == "missing_golden" and finding["details"]["lacks"] == ["host"], found
    assert "without its host figure" in finding["message"] and "host_cost" in finding["message"]


GATED = '''
[[waive]]
rule = "unjudged"
quant = "f32_up"
reason = "no GPU on this runner: judged by the GPU job"
'''


def test_an_unavailable_cell_with_a_golden_fails_unless_waived(project):
    """A target that raises Unavailable for a cell with a committed golden: "check passed: 1 cells: 1 unavailable"."""
    as_golden_of(project, CHANGED)
    (project / "gated.py").write_text(
        "from hlo_audit import Unavailable\nimport team_model\n\n\ndef target(cell):\n"
        "    if cell.quant == 'f32_up':\n        raise Unavailable('needs a GPU this host lacks')\n"
        "    return team_model.target(cell)\n\n\ntarget.full_depth = {'team': 8}\n")
    config = project / "hlo-audit.toml"
    config.write_text(config.read_text().replace("team_model:target", "gated:target"))
    code, found = check(project)
    (finding,) = found
    assert code == 1 and (finding["rule"], finding["severity"]) == ("unjudged", "regression"), found
    assert "cannot be judged here (unavailable: needs a GPU this host lacks)" in finding["message"]
    assert f"golden/{cell(CHANGED)}.json" in finding["message"]
    config.write_text(config.read_text() + GATED)
    code, found = check(project)
    (finding,) = found
    assert code == 0 and finding["severity"] == "waived" and "judged by the GPU job" in finding["message"], found
