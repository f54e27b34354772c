"""Any JAX program's state read from the pytree the user's function received and from what the step does with it
(issue 39 items 1 and 2), on an equinox user's step (``tests/eqx_model.py``: equinox's own idiom, a model argument
named ``net``).

Before: under ``eqx.filter_jit`` every parameter was ``dynamic_donate.rest.<n>`` (a position), layers never folded
(one group per parameter), and every weight was role ``input``; under ``filter_pmap`` paths started with a position
too. Now the paths are the user's (``net.layers.*.lin1.weight``, ``opt_state.0.mu...``), layers fold, a leaf the
optimizer's update writes is a weight whatever it is called, and a block a wrong partition filter freezes is the
gradient rule's "reach lost".
"""

from __future__ import annotations

import json
import shutil
import sys
from collections import Counter
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

pytest.importorskip("equinox")
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the model module, under any import mode

import eqx_model
from hlo_audit.hlo.analysis import analyze
from hlo_audit.matrix import Cell
from hlo_audit.targets.callable import CallableTarget
from in_process import hlo_audit_here

TARGET = "eqx_model:lower"
LAYERS = 3
# Per block: two Linear (weight, bias); embed and head besides: 4 * 3 + 4 = 16 weights.
WEIGHTS = 4 * LAYERS + 4


def analysed(variant: str):
    lowering = CallableTarget(TARGET).lower(Cell(model="eqx", scan=False, quant=variant, layers=LAYERS,
                                                 target=TARGET))
    return analyze(lowering.text, variant, lowering.arg_keys, lowering.captured, lowering.arg_leaves)


@pytest.fixture(scope="module")
def base():
    return analysed("base")


def groups(analysis) -> dict[str, int]:
    return dict(Counter(p.pattern for p in analysis.params))


@pytest.mark.parametrize("variant", ["base", "pmap"])
def test_paths_are_the_users_pytree_with_layers_folded(variant, base):
    analysis = base if variant == "base" else analysed(variant)
    paths = {p.path for p in analysis.params}
    assert {"net.embed.weight", "net.layers.0.lin1.weight", "net.layers.2.lin2.bias", "net.head.bias",
            "opt_state.0.mu.layers.1.lin1.weight", "opt_state.0.count", "x", "y"} <= paths, sorted(paths)
    assert not [p for p in paths if "dynamic" in p or p.split(".")[0].isdigit()], sorted(paths)
    found = groups(analysis)
    assert found["net.layers.*.lin1.weight"] == LAYERS and found["opt_state.0.nu.layers.*.lin2.bias"] == LAYERS


@pytest.mark.parametrize("variant", ["base", "pmap", "dict"])
def test_roles_by_what_the_step_writes_back(variant, base):
    """``net`` is no name the tool knows: its leaves are weights because the update writes each as ``p + u``;
    adam's moments and count are optimizer state (optax's classes above them); the batch is input. The dict step
    (``jax.jit`` over ``p``, a dict of dicts, and ``optax.apply_updates``) likewise."""
    analysis = base if variant == "base" else analysed(variant)
    roles = Counter(p.role for p in analysis.params)
    weights = 2 * LAYERS + 2 if variant == "dict" else WEIGHTS  # the dict model: w and b per layer, and embed's
    keys = {"rng_key": 1} if variant == "dict" else {}  # its dropout key: a u32[2] that random bits are drawn from
    assert roles == {"weight": weights, "optimizer_state": 2 * weights + 1, "input": 2, **keys}, roles
    weight_roots = {p.path.split(".")[0] for p in analysis.params if p.role == "weight"}
    assert weight_roots == ({"p"} if variant == "dict" else {"net"})
    streams = [(s.path, s.verdict) for s in analysis.rng.streams]
    assert streams == ([("rng", "drawn")] if variant == "dict" else []), streams


def test_a_field_reorder_keeps_every_path(base):
    """Declaring a block's fields in another order changes where its leaves flatten, not what they are called."""
    reordered = analysed("reordered")
    assert sorted((p.path, p.role, p.shape.text) for p in reordered.params) == \
        sorted((p.path, p.role, p.shape.text) for p in base.params)


def _write_config(project: Path, quants: list[str], extra: str = "") -> None:
    (project / "hlo-audit.toml").write_text(
        f'target = "{TARGET}"\nmodels = ["eqx"]\nscan = [\"off\"]\nlayers = [{LAYERS}]\nquant = {json.dumps(quants)}\n'
        + extra)


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    project = tmp_path_factory.mktemp("eqx_project")
    shutil.copy(eqx_model.__file__, project / "eqx_model.py")
    _write_config(project, ["base"])
    updated = hlo_audit_here(project, "golden", "update")
    assert updated.returncode == 0, updated.stderr[-3000:]
    return project


def _as_base(project: Path, variant: str) -> None:
    """The base cell's golden as ``variant``'s: the change checked against what the base accepted."""
    golden = project / "golden" / "eqx" / "scan-off"
    (golden / variant).mkdir(exist_ok=True)
    record = json.loads((golden / "base" / f"L{LAYERS}.json").read_text())
    record["cell"] = record["cell"].replace("/base/", f"/{variant}/")
    (golden / variant / f"L{LAYERS}.json").write_text(json.dumps(record, indent=1) + "\n")
    shutil.copy(golden / "base" / f"L{LAYERS}.hlo.txt", golden / variant / f"L{LAYERS}.hlo.txt")


def test_a_block_frozen_by_a_wrong_filter_is_gradient_reach_lost(project):
    _as_base(project, "frozen")
    _write_config(project, ["frozen"], '[policy]\nhlo_text = "warn"\n')
    ran = hlo_audit_here(project, "check", "--format", "json")
    assert ran.returncode == 1, ran.stderr[-3000:]
    findings = [f for f in json.loads(ran.stdout)["findings"] if f["rule"] == "gradient"]
    assert findings and findings[0]["severity"] == "regression", json.loads(ran.stdout)["findings"]
    lost = findings[0]["details"]["changes"][0]
    assert lost["subject"].endswith("lost") and lost["count"] == 4  # the first block's two Linear: w and b each
    assert sorted(lost["place"]["paths"]) == ["net.layers.0.lin1.bias", "net.layers.0.lin1.weight",
                                              "net.layers.0.lin2.bias", "net.layers.0.lin2.weight"]


def test_a_field_reorder_passes_the_gate_as_renamed_only(project):
    """The reorder against the base's golden: the same program, its leaves in another order (exit 0, advisory)."""
    _as_base(project, "reordered")
    _write_config(project, ["reordered"])
    ran = hlo_audit_here(project, "check", "--format", "json")
    assert ran.returncode == 0, ran.stdout[-3000:]
    (text,) = [f for f in json.loads(ran.stdout)["findings"] if f["rule"] == "hlo_text"]
    assert text["severity"] == "advisory" and "renamed-only" in text["message"], text


def test_a_change_made_through_equinox_is_placed_at_the_model_s_line():
    """``eqx.filter_checkpoint`` wraps ``jax.checkpoint`` in equinox's own ``_ad.py``: the remat the model asked for
    is placed at the model's call, the first frame outside equinox and jax, not inside equinox."""
    import equinox as eqx

    from hlo_audit.hlo.locations import Locations
    from hlo_audit.hlo.text import parse_module

    net = eqx_model.build(2)

    def forward(net, x):
        h = net.embed(x)
        for block in net.layers:
            h = eqx.filter_checkpoint(lambda b, h: b(h))(block, h)  # the model's line
        return jnp.sum(net.head(h))

    x = jnp.ones((eqx_model.IN,))
    text = jax.jit(jax.grad(forward, argnums=1)).lower(net, x).as_text(dialect="hlo", debug_info=True)
    module = parse_module(text)
    places = Locations(module)
    line = next(n for n, src in enumerate(Path(__file__).read_text().splitlines(), 1) if "# the model's line" in src)
    remat = Counter(places.of(i) for c in module.computations.values() for i in c.instructions
                    if i.op_name.endswith("remat2"))
    # The checkpoint at the model's call; what it recomputes at the block's own lines (eqx_model.py): none in equinox.
    assert remat and set(remat) == {f"{Path(__file__).name}:{line}"}, remat


@pytest.mark.parametrize("variant,rules", [
    ("remat", {"remat"}),  # remat's checkpoints and recomputation: the growth is remat's, not program size's too
    ("remat_wide", {"remat", "program_size"}),  # work beside it that no rule names: program size says it
    ("l2", {"gradient"}),  # a loss term with its backward pass (2c * w per weight), not ops beside it
    ("print", {"host_transfer"}),  # the callbacks with what they print (sums, sliced per example), not ops
])
def test_what_one_finding_explains_is_not_counted_again(project, variant, rules):
    _as_base(project, variant)
    _write_config(project, [variant], '[policy]\nhlo_text = "warn"\n')
    ran = hlo_audit_here(project, "check", "--format", "json")
    assert ran.returncode == 1, ran.stderr[-3000:]
    findings = json.loads(ran.stdout)["findings"]
    assert {f["rule"] for f in findings if f["severity"] == "regression"} == rules, findings
    if variant == "l2":
        (change,) = [c for f in findings if f["rule"] == "gradient" for c in f["details"]["changes"]]
        assert (change["kind"], change["action"]) == ("loss_term", "added"), change
        assert change["after"] != "0 instructions of its backward pass", change


def test_gradient_reach_lost_names_the_blocks_not_the_argument_s_root(project):
    """A stop_gradient after the first block cuts the embedding and that block off the loss: named as such
    (``net.layers.0.* (4), net.embed.* (2)``), not as ``net.* (6)``."""
    _as_base(project, "cut")
    _write_config(project, ["cut"], '[policy]\nhlo_text = "warn"\n')
    ran = hlo_audit_here(project, "check", env={"COLUMNS": "300"})
    assert "reach lost: 6 weights no longer updated" in ran.stdout, ran.stdout
    assert "net.layers.0.* (4), net.embed.* (2)" in ran.stdout, ran.stdout
