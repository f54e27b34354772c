"""Sharding judged on what is split (issue 47 item 2): a sharding change is compared on the target mesh's sizes.

MaxText 0998c01c1 added a mesh axis of size 1 (``context_usp_ulysses``) to configs/base.yml; five cells said
"sharding: 28 <@mesh, [... {"tensor_sequence", "context"} ...]> -> <... "context_usp_ulysses" ...>", four "changed
(attributes)" with a header "frontend_attributes 1 entry -> 1 entry", and none said the axis has size 1, that nothing
is split differently, or which config line did it. Here a user's step sharded over a mesh its YAML config declares
(``mesh.yml``, MaxText's shape: ``mesh_axes``, ``ici_*_parallelism``, logical axis rules), lowered for an abstract
mesh of 8 devices, and two pull requests: one adds an axis of size 1 to the batch's rule (no effect on any split,
still a change the sharding rule decides on, placed at the config's changed lines with ``--changes``), one splits
the embedding dimension over ``data`` too (the arrays named, each dimension's pieces before and after). The module
lowered on the host's one device says every axis has size 1: there the sizes the cell's config gives its target
mesh decide (``Lowering.mesh_sizes``), never the host's.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from hlo_audit.hlo.mesh import TargetMesh, split_changes, without_meshes
from in_process import hlo_audit_here
from projects import config
from projects import edit as _edit
from projects import git as _git

MODEL = """\
import pathlib

import jax
import jax.numpy as jnp
import yaml
from jax.sharding import AbstractMesh, AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

CONFIG = pathlib.Path(__file__).with_name("mesh.yml")


def lower(cell):
    settings = yaml.safe_load(CONFIG.read_text())
    axes = tuple(settings["mesh_axes"])
    mesh = AbstractMesh(tuple(settings[f"ici_{a}_parallelism"] for a in axes), axes,
                        axis_types=(AxisType.Auto,) * len(axes))
    rules = settings["logical_axis_rules"]

    def sharding(*logical):
        return NamedSharding(mesh, P(*(tuple(rules[n]) if n else None for n in logical)))

    params = {"wq": jax.ShapeDtypeStruct((16, 32), jnp.float32, sharding=sharding("embed", "mlp")),
              "wo": jax.ShapeDtypeStruct((32, 16), jnp.float32, sharding=sharding("mlp", "embed"))}
    x = jax.ShapeDtypeStruct((8, 16), jnp.float32, sharding=sharding("batch", None))

    def loss(p, x):
        h = jax.lax.with_sharding_constraint(jnp.tanh(x @ p["wq"]), sharding("batch", "mlp"))
        return jnp.mean((h @ p["wo"]) ** 2)

    def step(params, x):
        grads = jax.grad(loss)(params, x)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)

    out = {"wq": sharding("embed", "mlp"), "wo": sharding("mlp", "embed")}
    return jax.jit(step, out_shardings=out).trace(params, x).lower(lowering_platforms=("cpu",))
"""
MESH = """\
# the mesh the step is sharded over
mesh_axes: [data, fsdp, tensor]
ici_data_parallelism: 2
ici_fsdp_parallelism: 2
ici_tensor_parallelism: 2
logical_axis_rules:
  batch: [data]
  embed: [fsdp]
  mlp: [tensor]
"""
CELL = "m/scan-off/none/L2"


@pytest.fixture()
def repo(tmp_path: Path) -> Path:
    """The step and its mesh config with their goldens, committed: the base a pull request is made against."""
    for name, text in {"model.py": MODEL, "mesh.yml": MESH, ".gitignore": ".hlo-audit-cache/\n"}.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "hlo-audit.toml").write_text(config(target="model:lower", models=["m"], layers=[2], scan=["off"]))
    made = hlo_audit_here(tmp_path, "golden", "update")
    assert made.returncode == 0, made.stderr
    _git(tmp_path, "init", "-q", ".")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-qm", "base")
    return tmp_path


def _check(repo: Path, *args: str) -> tuple[int, dict]:
    ran = hlo_audit_here(repo, "check", "--format", "json", *args)
    assert ran.returncode in (0, 1), ran.stderr
    return ran.returncode, json.loads(ran.stdout)


def _finding(report: dict, rule: str) -> dict:
    (found,) = [f for f in report["findings"] if f["cell"] == CELL and f["rule"] == rule]
    return found


def found_message(report: dict) -> str:
    return _finding(report, "sharding")["message"]


def _add_size_one_axis(repo: Path) -> None:
    """MaxText 0998c01c1's change, in small: an axis of size 1 declared and added to the batch's rule."""
    _edit(repo / "mesh.yml", "mesh_axes: [data, fsdp, tensor]", "mesh_axes: [data, fsdp, tensor, context]")
    _edit(repo / "mesh.yml", "ici_tensor_parallelism: 2\n", "ici_tensor_parallelism: 2\nici_context_parallelism: 1\n")
    _edit(repo / "mesh.yml", "batch: [data]", "batch: [data, context]")


def test_a_size_one_axis_added_is_no_effect_on_any_split_and_still_the_policy_s(repo):
    _add_size_one_axis(repo)
    code, report = _check(repo)
    assert code == 1  # a program difference all the same: the sharding rule decides (fail by default)
    found = _finding(report, "sharding")
    assert found["severity"] == "regression"
    (change,) = found["details"]["changes"]
    assert (change["subject"], change["groups"]) == ("no effect on how any array is split",
                                                     [['mesh axis "context"=1 added', 1]])
    # The input and the two constraints (forward, backward) name the axis; the header's mesh is in the same line.
    assert found["message"].startswith(
        'sharding: no effect on how any array is split: mesh axis "context"=1 added (mesh of 3 axes: "data"=2, '
        '"fsdp"=2, "tensor"=2 -> 4 axes, all of size 1 but "data"=2, "fsdp"=2, "tensor"=2, 3 shardings changed)'), \
        found["message"]
    assert (change["before"], change["after"]) == ('["data"=2, "fsdp"=2, "tensor"=2]',
                                                   '["data"=2, "fsdp"=2, "tensor"=2, "context"=1]')
    # The text rule says what kind of difference it is; `diff` of the two texts says it once, the header's mesh in
    # the same line (it said "header: frontend_attributes 1 entry -> 1 entry" beside the shardings).
    assert "changed (shardings)" in _finding(report, "hlo_text")["message"]
    golden = repo / "golden" / "m" / "scan-off" / "none" / "L2.hlo.txt"
    before = repo / "before.hlo.txt"
    before.write_text(golden.read_text())
    assert hlo_audit_here(repo, "golden", "update").returncode == 0
    shown = hlo_audit_here(repo, "diff", before, golden, env={"COLUMNS": "300"})
    assert shown.returncode == 1 and "verdict: changed (shardings)" in shown.stdout, shown.stdout
    lines = [line.strip() for line in shown.stdout.splitlines()]
    assert [line for line in lines if line.startswith(("sharding:", "header:"))] == [
        'sharding: no effect on how any array is split: mesh axis "context"=1 added (mesh of 3 axes: "data"=2, '
        '"fsdp"=2, "tensor"=2 -> 4 axes, all of size 1 but "data"=2, "fsdp"=2, "tensor"=2, 3 shardings changed); '
        'reading x'], shown.stdout
    _git(repo, "checkout", "-q", "golden")
    # Turned off, the sharding rule says nothing of it.
    (repo / "hlo-audit.toml").write_text(config(target="model:lower", models=["m"], layers=[2], scan=["off"],
                                                policy={"sharding": "off", "hlo_text": "warn"}))
    code, report = _check(repo)
    assert code == 0 and not [f for f in report["findings"] if f["rule"] == "sharding"]


def test_with_changes_the_finding_names_the_config_lines_the_cell_read(repo):
    _add_size_one_axis(repo)
    (repo / "pr.diff").write_text(_git(repo, "diff", "HEAD"))
    code, report = _check(repo, "--changes", "pr.diff")
    assert code == 1
    (change,) = _finding(report, "sharding")["details"]["changes"]
    assert change["place"]["config"] == ["mesh.yml:2", "mesh.yml:6", "mesh.yml:8"]
    assert change["place"]["on_change"] is True
    shown = hlo_audit_here(repo, "check", "--changes", "pr.diff", env={"COLUMNS": "300"})
    assert "at mesh.yml:2, mesh.yml:6, mesh.yml:8 (changed config the cell read) via model.py:27" in shown.stdout, \
        shown.stdout


def test_a_split_changed_names_the_arrays_and_their_pieces(repo):
    _edit(repo / "mesh.yml", "embed: [fsdp]", "embed: [fsdp, data]")
    code, report = _check(repo)
    assert code == 1
    changes = _finding(report, "sharding")["details"]["changes"]
    assert "no effect on how any array is split" not in {c["subject"] for c in changes}
    splits = {s for c in changes for s in c.get("splits", [])}
    assert {"params.wq: dim 0 split 2 (fsdp) -> 4 (fsdp, data)",
            "params.wo: dim 1 split 2 (fsdp) -> 4 (fsdp, data)"} <= splits, splits
    # Each value and output split differently says so: by the axes where Shardy names them, else XLA's tiles.
    values = [c for c in changes if c["subject"] in ("values", "outputs")]
    assert values and all(re.fullmatch(r"dim [01] split 2( \(fsdp\))? -> 4( \(fsdp, data\))?", s)
                          for c in values for s in c["splits"]), values
    assert "dim 0 split 2 (fsdp) -> 4 (fsdp, data)" in {s for c in values for s in c["splits"]}
    assert "split differently: params.wo: dim 1 split 2 (fsdp) -> 4 (fsdp, data)" in found_message(report)


# -- the one owner of the sizes: hlo.mesh --------------------------------------------------------------------------

ONE_DEVICE = {"frontend_attributes": '{xla.sdy.meshes={mesh = #sdy.mesh<["data"=1, "fsdp"=1, "context"=1]>}}'}
EIGHT = {"frontend_attributes": '{xla.sdy.meshes={mesh = #sdy.mesh<["data"=2, "fsdp"=4, "context"=1]>}}'}
BEFORE, AFTER = '<@mesh, [{"fsdp"}, {}]>', '<@mesh, [{"fsdp", "context"}, {}]>'


def test_a_multi_device_module_says_its_own_sizes():
    mesh = TargetMesh.of_module(EIGHT, {"data": 1, "fsdp": None, "context": 8})  # the module's win
    assert mesh.sizes_from == "module" and [a.size for a in mesh.axes] == [2, 4, 1]
    assert split_changes(mesh.split(BEFORE), mesh.split(AFTER)) == ()
    resplit = split_changes(mesh.split(BEFORE), mesh.split('<@mesh, [{"fsdp", "data"}, {}]>'))
    assert resplit == ("dim 0 split 4 (fsdp) -> 8 (fsdp, data)",)


def test_on_the_host_s_one_device_the_config_s_sizes_decide_never_the_host_s():
    """Every axis has size 1 on one device: without the config's sizes, nothing is known (an axis is compared by
    name), and adding ``context`` is a change of split; with them, context=1 is none, and fsdp (-1: the rest of the
    devices) stays of unknown size."""
    unknown = TargetMesh.of_module(ONE_DEVICE)
    assert unknown.sizes_from == "unknown"
    assert split_changes(unknown.split(BEFORE), unknown.split(AFTER)) == ("dim 0 split ? (fsdp) -> ? (fsdp, context)",)
    sized = TargetMesh.of_module(ONE_DEVICE, {"data": 1, "fsdp": None, "context": 1})
    assert sized.sizes_from == "config"
    assert split_changes(sized.split(BEFORE), sized.split(AFTER)) == ()
    grown = TargetMesh.of_module(ONE_DEVICE, {"data": 1, "fsdp": None, "context": 2})
    assert split_changes(sized.split(BEFORE), grown.split(AFTER)) == ("dim 0 split ? (fsdp) -> ? (fsdp, context)",)


@pytest.mark.maxtext  # needs MaxText (make compat's environment has none)
def test_maxtext_s_target_sizes_are_its_parallelism_lists_arithmetic():
    from hlo_audit.targets.maxtext_config import target_mesh_sizes

    axes = ["data", "fsdp", "context", "context_usp_ulysses"]
    one_slice = SimpleNamespace(mesh_axes=axes, ici_parallelism=[1, -1, 2, 1], dcn_parallelism=[-1, 1, 1, 1],
                                num_slices=1)
    assert target_mesh_sizes(one_slice) == {"data": 1, "fsdp": None, "context": 2, "context_usp_ulysses": 1}
    two_slices = SimpleNamespace(mesh_axes=axes, ici_parallelism=[1, 4, 2, 1], dcn_parallelism=[2, 1, 1, 1],
                                 num_slices=2)
    assert target_mesh_sizes(two_slices) == {"data": 2, "fsdp": 4, "context": 2, "context_usp_ulysses": 1}


def test_the_header_s_mesh_is_folded_out_of_its_frontend_attributes():
    assert without_meshes(EIGHT["frontend_attributes"]) == "{}"
    both = '{xla.sdy.meshes={mesh = #sdy.mesh<["a"=2]>},other="x"}'
    assert without_meshes(both) == '{other="x"}'


# -- the host's one device: the config's sizes, carried with the cell ------------------------------------------------

def _one_device_step(axes: tuple[str, ...], batch: tuple[str, ...]) -> str:
    """A step lowered on the host's one CPU device over a mesh of ``axes`` (every one of size 1 here), its batch
    constrained over ``batch``: what a MaxText cell on the CPU host lowers (its XLA shardings all ``{replicated}``)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices("cpu")[:1]).reshape((1,) * len(axes)), axes)

    def step(w, x):
        return jnp.sum(jax.lax.with_sharding_constraint(x @ w, NamedSharding(mesh, P(batch, None))))

    w = jax.ShapeDtypeStruct((8, 8), jnp.float32, sharding=NamedSharding(mesh, P("fsdp", None)))
    x = jax.ShapeDtypeStruct((4, 8), jnp.float32, sharding=NamedSharding(mesh, P("data", None)))
    return jax.jit(step).lower(w, x).as_text(dialect="hlo")


@pytest.fixture(scope="module")
def one_device_texts() -> tuple[str, str]:
    return (_one_device_step(("data", "fsdp"), ("data",)),
            _one_device_step(("data", "fsdp", "context"), ("data", "context")))


def test_one_device_with_the_config_s_sizes_a_size_one_axis_is_no_effect(one_device_texts):
    from hlo_audit.comparison import Structural

    sizes = {"data": 1, "fsdp": None, "context": 1}  # MaxText's base.yml: fsdp -1 (the rest), the others 1
    named = Structural.of(*one_device_texts, mesh_sizes=(sizes, sizes)).diff.named
    assert [(c.kind.value, c.subject, c.groups) for c in named] == [
        ("sharding", "no effect on how any array is split", (('mesh axis "context"=1 added', 1),))]


def test_one_device_without_sizes_nothing_is_taken_for_size_one(one_device_texts):
    """The host's 1 is not the target's: with no sizes given, the axis is of unknown size, the constraint's split
    changes by its name, and the mesh's change is named beside it."""
    from hlo_audit.comparison import Structural

    named = [c for c in Structural.of(*one_device_texts).diff.named if c.kind.value == "sharding"]
    assert [(c.subject, c.groups) for c in named][0] == ("mesh", (('mesh axis "context"=? added', 1),))
    (constraint,) = [c for c in named if c.subject == "sharding constraint"]
    assert constraint.splits == ("dim 0 split ? (data) -> ? (data, context)",)
    # A golden written before the sizes were kept is judged with the cell's current ones.
    assert [c.subject for c in Structural.of(*one_device_texts, mesh_sizes=(None, {"data": 1, "fsdp": None,
                                                                             "context": 1})).diff.named] == \
        ["no effect on how any array is split"]


def test_a_golden_keeps_the_config_s_sizes(repo):
    from hlo_audit.golden.record import GoldenRecord, record_problem

    record = json.loads((repo / "golden" / "m" / "scan-off" / "none" / "L2.json").read_text())
    assert "mesh_sizes" not in record  # a callable target says none
    sized = {**record, "mesh_sizes": {"data": 1, "fsdp": None}}
    assert record_problem(sized, CELL) is None
    assert GoldenRecord.from_json(sized).mesh_sizes == {"data": 1, "fsdp": None}
    assert GoldenRecord.from_json(sized).to_json()["mesh_sizes"] == {"data": 1, "fsdp": None}
    for forged in ({"data": 0}, {"data": "2"}, [1, 2]):
        assert record_problem({**record, "mesh_sizes": forged}, CELL) == \
            "not a golden summary: 'mesh_sizes' is malformed"


TUPLE = """HloModule t, frontend_attributes={xla.sdy.meshes={mesh = #sdy.mesh<["data"=2, "fsdp"=4, "context"=1]>}}

ENTRY main {
  a = f32[8,8]{1,0} parameter(0)
  b = f32[8,8]{1,0} parameter(1)
  ROOT pair = (f32[8,8]{1,0}, f32[8,8]{1,0}) custom-call(a, b), custom_call_target="Sharding", frontend_attributes={xla.sdy.sharding="#sdy.sharding_per_value<[<@mesh, [{\\"fsdp\\"}, {}]>, <@mesh, [{\\"data\\"}, {}]>]>"}
}
"""


def test_a_tuple_s_shardings_are_judged_value_by_value():
    """A tuple's Shardy shardings are one per value: the one that changed is compared alone, its dimensions its own
    (``dim 0`` of the second value, not a fourth dimension of both)."""
    from hlo_audit.hlo.change_structure import _sharding_pairs
    from hlo_audit.hlo.text import parse_module

    old = parse_module(TUPLE).entry.root
    new = parse_module(TUPLE.replace('[{\\"data\\"}, {}]', '[{\\"data\\", \\"fsdp\\"}, {}]')).entry.root
    assert _sharding_pairs(old, new) == [('<@mesh, [{"data"}, {}]>', '<@mesh, [{"data", "fsdp"}, {}]>')]
    mesh = TargetMesh.of_module(parse_module(TUPLE).header_attrs)
    (before, after), = _sharding_pairs(old, new)
    assert split_changes(mesh.split(before), mesh.split(after)) == ("dim 0 split 2 (data) -> 8 (data, fsdp)",)


def test_the_header_s_mesh_alone_changed_is_a_sharding_change_of_no_effect(one_device_texts):
    """MaxText's llama3-8b at 0998c01c1: the axis added to the mesh, no sharding of the step naming it; only the
    header differs ("changed (attributes)", and a sharding line claiming "1 sharding changed", before)."""
    from hlo_audit.comparison import Structural
    from hlo_audit.rules.structure import SHARDING

    header_only = _one_device_step(("data", "fsdp", "context"), ("data",))
    sizes = {"data": 1, "fsdp": None, "context": 1}
    made = Structural.of(one_device_texts[0], header_only, mesh_sizes=(sizes, sizes))
    assert made.diff.changes == ["shardings"]
    (change,) = made.diff.named
    assert (change.subject, change.count) == ("no effect on how any array is split", 0)
    (words,) = SHARDING.words
    assert words.line(change, "sharding", "") == (
        'sharding: no effect on how any array is split: mesh axis "context"=1 added (mesh of 2 axes, all of size 1 '
        'but "fsdp"=? -> 3 axes, all of size 1 but "fsdp"=?)')
