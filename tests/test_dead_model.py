"""A cell whose step computes none of its model (issue 46 item 3; rule ``dead_model``, the HLO core's
``hlo.model_work``): MaxText's DeepSeek 3.2 in dense warm-up lowers a train step with no dot at all, and a step whose
loss is multiplied by 0 keeps every dot, none of which can move an output. Either passes every comparison whatever
the model's code becomes: `init` and `golden update` say so, and `check` fails it unless waived.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from hlo_audit.hlo.model_work import model_work
from hlo_audit.hlo.params import entry_params
from hlo_audit.hlo.text import parse_module
from in_process import hlo_audit_here
from projects import config

# A plain jax train step: a stack of tanh layers, the loss weighted by SCALE (what a pull request edits).
MODEL = """\
import jax
import jax.numpy as jnp

SCALE = {scale}


def loss(params, x):
    h = x
    for layer in params:
        h = jnp.tanh(h @ layer["kernel"])
    return jnp.mean(h ** 2) * SCALE


def lower(cell):
    def step(params, x):
        value, grads = jax.value_and_grad(loss)(params, x)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), value

    params = [{{"kernel": jnp.zeros((8, 8))}} for _ in range(cell.layers)]
    return jax.jit(step).lower(params, jnp.ones((2, 8)))
"""
LOSS_LINE = 11  # the line of MODEL that multiplies the loss by SCALE


def _work(fn, *args):
    """What of its model a jitted step computes, with its parameters' roles as the analysis classifies them."""
    module = parse_module(jax.jit(fn).lower(*args).as_text(dialect="hlo"), "step")
    return model_work(module, entry_params(module))


def _train(loss, params, x):
    value, grads = jax.value_and_grad(loss)(params, x)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), value


PARAMS = {"params": [{"kernel": jnp.ones((8, 8))}, {"kernel": jnp.ones((8, 8))}]}
X = jnp.ones((2, 8))


def _dense(scale):
    def loss(state, x):
        h = x
        for layer in state["params"]:
            h = jnp.tanh(h @ layer["kernel"])
        return jnp.mean(h ** 2) * scale
    return loss


def test_a_loss_multiplied_by_zero_leaves_every_contraction_cut_off():
    dead = _work(lambda state, x: _train(_dense(0.0), state, x), PARAMS, X)
    live = _work(lambda state, x: _train(_dense(1.0), state, x), PARAMS, X)
    # Forward and backward dots are all there; none reaches an output once the loss is multiplied by 0.
    assert dead.contractions == live.contractions > 0
    assert dead.reaching == 0 and dead.computes_none
    assert live.reaching == live.contractions and not live.computes_none
    # The cuts: the loss times 0 and its cotangent times 0, not every value downstream of them.
    assert len(dead.zeroed) == 2 and all(i.startswith("mul") or "broadcast" in i for _, i in dead.zeroed)


def test_a_step_without_contractions_computes_its_model_where_weights_meet_its_data():
    """Weights applied elementwise (a scale and a bias) are a model all the same; a constant loss (MaxText's dense
    warm-up: the main loss 0.0, no dot lowered) reads the weights and the data apart."""
    state = {"params": [{"kernel": jnp.ones((8,)), "bias": jnp.zeros((8,))}]}

    def elementwise(s, x):
        layer = s["params"][0]
        return jnp.mean(jnp.tanh(x * layer["kernel"] + layer["bias"]) ** 2)

    def warm_up(s, x):
        return jnp.sum(x) * 0.0 + 0.0 * jnp.sum(s["params"][0]["kernel"])

    computed = _work(lambda state, x: _train(elementwise, state, x), state, X)
    assert computed.contractions == 0 and computed.mixes is True and not computed.computes_none
    skipped = _work(lambda state, x: _train(warm_up, state, x), state, X)
    assert skipped.contractions == 0 and skipped.mixes is False and skipped.computes_none


def test_a_scanned_model_and_a_step_without_weights_are_never_called_dead():
    """Conservative: a zero carried through a loop's state is not followed, and a step with no weight (a function
    of its inputs) or no data is not asked."""
    def scanned(state, x):
        def body(h, layer):
            return jnp.tanh(h @ layer), None
        h, _ = jax.lax.scan(body, x, state["params"]["stack"])
        return jnp.mean(h ** 2) * 0.0

    state = {"params": {"stack": jnp.ones((3, 8, 8))}}
    assert not _work(lambda state, x: _train(scanned, state, x), state, X).computes_none
    assert _work(lambda x: jnp.tanh(x @ x.T), X).mixes is None


@pytest.fixture()
def dead_project(tmp_path: Path) -> Path:
    (tmp_path / "model.py").write_text(MODEL.format(scale=0.0))
    made = hlo_audit_here(tmp_path, "init", "--callable", "model:lower", "--model", "m", "--layers", "2")
    assert made.returncode == 0, made.stderr
    # init writes the goldens but never blesses the cells silently: each is said, and the next step says check fails.
    said = [line for line in made.stdout.splitlines() if "computes none of its model" in line]
    assert len(said) == 3, made.stdout  # the two cells, and the line saying what to do next
    assert said[0].startswith("m/scan-off/none/L2: computes none of its model: none of its train step's 5 "
                              "contractions reaches an output, cut off by a zero at ")
    assert f"model.py:{LOSS_LINE} (jit(step)/jvp()/mul)" in said[0]  # the loss times 0, where the model multiplies it
    assert said[-1].startswith("next: hlo-audit check fails 2 cells whose step computes none of its model"), said
    assert "it passes now" not in made.stdout
    return tmp_path


def _check(folder: Path) -> tuple[int, list[dict]]:
    ran = hlo_audit_here(folder, "check", "--format", "json")
    return ran.returncode, json.loads(ran.stdout)["findings"]


def test_check_fails_a_cell_that_computes_none_of_its_model_though_its_golden_matches(dead_project):
    code, findings = _check(dead_project)
    assert code == 1
    assert {(f["rule"], f["severity"]) for f in findings} == {("dead_model", "regression")}, findings
    first = findings[0]
    assert first["details"] == {"weights": 2, "contractions": 5, "reaching": 0, "step": "train",
                                "zeroed_at": first["details"]["zeroed_at"]}
    # Each cut placed: its source line and op_name where jax's metadata has them (jax 0.10 gives the transposed
    # multiply its op_name alone).
    zeroed = first["details"]["zeroed_at"]
    assert len(zeroed) == 2 and f"model.py:{LOSS_LINE} (jit(step)/jvp()/mul)" in zeroed
    assert all("jit(step)/" in z and "mul" in z for z in zeroed), zeroed
    assert "a check of this cell passes whatever the model's code becomes" in first["message"]


@pytest.mark.parametrize("settings, severity, code", [
    ({"policy": {"dead_model": "warn"}}, "advisory", 0),
    ({"waive": [{"rule": "dead_model", "model": "m", "reason": "the warm-up stage, on purpose"}]}, "waived", 0),
    ({"policy": {"dead_model": "off"}}, None, 0),
])
def test_the_policy_decides_as_for_any_rule(dead_project, settings, severity, code):
    (dead_project / "hlo-audit.toml").write_text(config(target="model:lower", models=["m"], layers=[2], **settings))
    got, findings = _check(dead_project)
    assert got == code
    assert [f["severity"] for f in findings if f["rule"] == "dead_model"] == ([severity] * 2 if severity else [])


def test_a_model_that_computes_again_is_no_finding(dead_project):
    """The fix (the loss weighted again) changes the program: accepted, the cells pass with no dead_model finding."""
    (dead_project / "model.py").write_text(MODEL.format(scale=1.0))
    updated = hlo_audit_here(dead_project, "golden", "update")
    assert updated.returncode == 0 and "computes none" not in updated.stdout, updated.stdout
    code, findings = _check(dead_project)
    assert code == 0 and not [f for f in findings if f["rule"] == "dead_model"], findings


# MaxText's DeepSeek 3.2 as the pinned release ships it: the sparse indexer on, trained in dense warm-up (the main loss
# skipped: 0.0), and 2 layers. Its train step lowers 54 weights and no dot; sparse training computes the model.
DEEPSEEK32 = """
target = "maxtext"
models = ["deepseek3.2-671b"]
scan = ["off"]
quant = ["none"]
layers = [2]
overrides = {{"deepseek3.2-671b" = {{attention = "dot_product"{extra}}}}}
"""


@pytest.mark.maxtext
@pytest.mark.long
@pytest.mark.xdist_group("maxtext")
@pytest.mark.parametrize("extra, dead", [("", True), (", indexer_sparse_training = true", False)],
                         ids=["dense-warm-up", "sparse-training"])
def test_maxtext_s_deepseek_3_2_in_dense_warm_up_computes_none_of_its_model(tmp_path, session_lowerings, extra, dead):
    (tmp_path / "hlo-audit.toml").write_text(session_lowerings.cache_dir + DEEPSEEK32.format(extra=extra))
    cells = session_lowerings.cells_of(tmp_path / "hlo-audit.toml")
    with session_lowerings.locked(cells, ""):
        updated = hlo_audit_here(tmp_path, "golden", "update")
        assert updated.returncode == 0, updated.stderr[-3000:]
        assert ("computes none of its model: its train step takes 54 weights and holds no contraction"
                in updated.stdout) is dead, updated.stdout
        code, findings = _check(tmp_path)
    assert [f["rule"] for f in findings if f["severity"] == "regression"] == (["dead_model"] if dead else [])
    assert code == (1 if dead else 0)
