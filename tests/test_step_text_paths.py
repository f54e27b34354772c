"""State paths survive in text, for every step kind the tool lowers (issue 26, item 4).

An ``nnx.jit`` step's HLO names its parameters by flat index (``model_states_0__17_``): only the graph knows the
paths, which ``check`` and ``rng CELL`` read from args_info. The text the tool stores and prints (the golden's
canonical text, ``lower``'s output) is told them (``attribution.name_parameters``), so ``diff`` and ``rng FILE``
on it say what ``check`` and ``rng CELL`` say. Run on ``forked_steps``' target (a per-layer ``rngs.fork()``) in
each kind: ``nnx.jit`` traced and lowered, ``jax.jit`` over ``nnx.split``'s state, a plain pytree (raw keys and
counts, or typed keys: told their kind, ``frontend_attributes={hlo_audit_kind="prng_key"}``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from forked_steps import KINDS
from hlo_audit.attribution import name_parameters
from hlo_audit.hlo.analysis import analyze
from hlo_audit.hlo.params import ArgLeaf
from hlo_audit.matrix import Cell
from hlo_audit.targets.callable import CallableTarget
from in_process import hlo_audit_here

TARGET = "forked_steps:forked_target"
# What the fork adds at depth 2, by each kind's paths: the parameters, and the streams `rng` reports.
STREAM = {"nnx": "model.layers.{}.rngs.default", "nnx_lowered": "model.layers.{}.rngs.default",
          "jax": "model.layers.{}.rngs.default", "pytree": "state.rngs.layers_{}"}
FORKED = {kind: [f"{stream.format(i)}.{leaf}" for i in (0, 1) for leaf in ("key", "count")]
          for kind, stream in STREAM.items()} | {"pytree_typed": ["state.rngs.layers_0", "state.rngs.layers_1"]}
# rng's streams: a typed key per layer is a stream of its own, with no count (one per key: both carried).
STREAMS = {kind: [stream.format(i) for i in (0, 1)] for kind, stream in STREAM.items()} | {
    "pytree_typed": ["state.rngs.layers_0", "state.rngs.layers_1"]}


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A repository gated on every kind, base and fork, at depths 2 and 4, with its goldens."""
    folder = tmp_path_factory.mktemp("steps")
    (folder / "hlo-audit.toml").write_text(f'target = "{TARGET}"\nmodels = {json.dumps(list(KINDS))}\n'
                                           "layers = [2, 4]\n")
    made = hlo_audit_here(folder, "golden", "update")
    assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]
    return folder


def cell_analysis(kind: str, variant: str):
    """The cell as check reads it: the lowering's text with args_info's keys and leaf kinds."""
    lowering = CallableTarget(TARGET).lower(Cell(model=kind, scan=False, quant=variant, layers=2, target=TARGET))
    return lowering, analyze(lowering.text, "<cell>", lowering.arg_keys, lowering.captured, lowering.arg_leaves)


def described(analysis) -> list[tuple]:
    return [(p.path, p.role, p.dtype, p.shape.dims, p.pattern) for p in analysis.params]


@pytest.mark.parametrize("kind", KINDS)
def test_golden_and_lowered_text_name_the_paths_check_reads(project, kind):
    cell = f"{kind}/scan-off/fork/L2"
    lowered = hlo_audit_here(project, "lower", cell, "-o", f"{kind}.txt")
    assert lowered.returncode == 0, lowered.stderr
    text = (project / f"{kind}.txt").read_text()
    _, checked = cell_analysis(kind, "fork")
    expected = described(checked)
    assert set(FORKED[kind]) <= {p[0] for p in expected}
    assert {p[1] for p in expected if p[0] in FORKED[kind]} == {"rng_key", "rng_count"} - (
        {"rng_count"} if kind == "pytree_typed" else set())
    # The file as `diff` and `rng FILE` read it (no args_info): every parameter's path, role and group as check's.
    assert described(analyze(text, f"{kind}.txt")) == expected
    golden = (project / "golden" / f"{cell}.hlo.txt").read_text()
    assert described(analyze(golden, "golden")) == expected
    assert "states_0" not in text and "states_0" not in golden
    from jax._src.lib import hlo  # XLA's own parser reads what the tool told the text (the oracle)

    assert hlo.hlo_module_from_text(text).computations()  # the golden's canonical text is the tool's own format


@pytest.mark.parametrize("kind", KINDS)
def test_rng_on_the_file_and_on_the_cell_agree(project, kind):
    cell = f"{kind}/scan-off/fork/L2"
    assert hlo_audit_here(project, "lower", cell, "-o", f"{kind}-rng.txt").returncode == 0
    on_file = hlo_audit_here(project, "rng", f"{kind}-rng.txt", "--format", "json", "--streams")
    on_cell = hlo_audit_here(project, "rng", cell, "--format", "json", "--streams")
    assert on_file.returncode == on_cell.returncode == 1, (on_file.stdout, on_cell.stdout)
    from_file, from_cell = json.loads(on_file.stdout), json.loads(on_cell.stdout)
    for report in (from_file, from_cell):
        report.pop("source")
    assert from_file == from_cell
    assert [s["path"] for s in from_file["stream_list"] if s["verdict"] == "carried"] == STREAMS[kind]


@pytest.mark.parametrize("kind", KINDS)
def test_diff_of_base_and_forked_text_is_rng_state_only(project, kind):
    assert hlo_audit_here(project, "lower", f"{kind}/scan-off/fork/L2", "-o", f"{kind}-fork.txt").returncode == 0
    base = project / "golden" / f"{kind}/scan-off/base/L2.hlo.txt"
    diffed = hlo_audit_here(project, "diff", str(base), f"{kind}-fork.txt", "--format", "json")
    assert diffed.returncode == 1, diffed.stderr
    report = json.loads(diffed.stdout)
    assert report["verdict"] == "rng-state-only", report["verdict"]
    # x, two kernels, two biases; + a key and a count per layer (a typed key: the key alone)
    assert report["entry_params"] == {"old": 5, "new": 7 if kind == "pytree_typed" else 9}
    # The golden of the forked cell and the forked cell's `lower` output are one program, named alike.
    same = hlo_audit_here(project, "diff", str(project / "golden" / f"{kind}/scan-off/fork/L2.hlo.txt"),
                          f"{kind}-fork.txt", "--format", "json")
    assert same.returncode == 0 and json.loads(same.stdout)["verdict"] == "identical-after-normalization", same.stdout[:500]


def test_check_agrees_with_the_goldens_written_from_the_told_text(project):
    """The goldens hold the told text; check reads its cells the same way: the base series passes, and the forked
    one fails on its RNG scaling alone (its text matches its golden)."""
    base = hlo_audit_here(project, "check", "--only", "model=nnx", "--only", "quant=base")
    assert base.returncode == 0, base.stdout[-3000:]
    forked = hlo_audit_here(project, "check", "--only", "model=nnx", "--only", "quant=fork")
    assert forked.returncode == 1 and "hlo-audit check FAILED: 2 cells: 1 ok, 1 regression" in forked.stdout
    assert "rng_scaling" in forked.stdout and "hlo_text" not in forked.stdout, forked.stdout[-3000:]


@pytest.mark.parametrize("kind", ["nnx", "nnx_lowered"])
def test_a_compiled_nnx_jit_step_is_told_its_paths_in_its_op_names(kind):
    """Stage compiled prints XLA's module with metadata, which a reading trusts before names: its op_name says
    ``model.states[0][3]`` until told the path."""
    cell = Cell(model=kind, scan=False, quant="fork", layers=2, target=TARGET, stage="compiled")
    lowering = CallableTarget(TARGET).lower(cell)
    checked = analyze(lowering.text, "<cell>", lowering.arg_keys, lowering.captured, lowering.arg_leaves)
    assert described(analyze(lowering.text, "compiled.txt")) == described(checked)
    assert "model[\\'layers\\'][\\'0\\'][\\'rngs\\'][\\'default\\'][\\'key\\']" in lowering.text
    assert "states" not in "".join(p.path for p in checked.params)


def test_text_that_already_names_its_paths_is_left_byte_for_byte():
    """jax.jit over state jax names by key (MaxText's train step): nothing to tell, nothing changes; an nnx.jit
    step's text is told, its op_name where it has one (XLA's dumps), else its name."""
    lowering, _ = cell_analysis("jax", "fork")
    assert name_parameters(lowering.text, lowering.arg_keys, lowering.arg_leaves) == lowering.text
    text = ("HloModule m\n\nENTRY main {\n  model_states_0__0_.1 = u32[2]{0} parameter(0), "
            "metadata={op_name=\"model.states[0][0]\"}\n  model_states_0__1_.1 = u32[] parameter(1)\n"
            "  ROOT t = (u32[2]{0}, u32[]) tuple(model_states_0__0_.1, model_states_0__1_.1)\n}\n")
    keys, leaves = [("rngs", "default", "key"), ("rngs", "default", "count")], [ArgLeaf("model", None)] * 2
    told = name_parameters(text, keys, leaves)
    assert "op_name=\"model[\\'rngs\\'][\\'default\\'][\\'key\\']\"" in told
    assert "model__rngs____default____count__.1 = u32[] parameter(1)" in told
    assert "tuple(model_states_0__0_.1, model__rngs____default____count__.1)" in told
    assert [p.path for p in analyze(told).params] == ["model.rngs.default.key", "model.rngs.default.count"]
    assert name_parameters(text, keys[:1], leaves[:1]) == text  # keys that do not match: untouched
    # A typed key the text cannot tell (a lone u32[2] under no `rngs`): told its kind, beside attributes it has.
    typed = text.replace('parameter(0), metadata', 'parameter(0), frontend_attributes={a="b"}, metadata')
    told = name_parameters(typed, [("noise",), ("step",)], [ArgLeaf("state", "prng_key"), ArgLeaf("state", None)])
    assert 'parameter(0), frontend_attributes={a="b",hlo_audit_kind="prng_key"}, metadata' in told
    assert [(p.path, p.role) for p in analyze(told).params] == [("state.noise", "rng_key"), ("state.step", "step")]
