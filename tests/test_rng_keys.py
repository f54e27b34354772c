"""Literal keys, reused keys and unused keys by value, whatever they are called (issue 39, item 3).

Every step is a real lowering of tests/rng_key_steps.py (plain JAX with optax, and a Flax NNX model). The reference
for what is reuse is jax's own checker (``jax.experimental.key_reuse``): ``random_bits`` and ``split`` consume a key,
``fold_in`` does not; each step's verdict here is checked against it where it runs.
"""

from __future__ import annotations

import functools
import json

import jax
import pytest

import rng_key_steps as steps
from hlo_audit.attribution import arg_keys, arg_leaves
from hlo_audit.hlo.analysis import analyze
from hlo_audit.hlo.rng_keys import LITERAL, REUSED
from hlo_audit.hlo.text import parse_module
from in_process import hlo_audit_here

CASES = [("jax", v) for v in steps.JAX_VARIANTS] + [("nnx", v) for v in steps.NNX_VARIANTS]


@functools.cache
def analysed(framework: str, variant: str):
    lowered = steps.lower(framework, variant)
    return analyze(lowered.as_text(dialect="hlo", debug_info=True), variant, arg_keys(lowered), None,
                   arg_leaves(lowered))


def hazards(analysis) -> list[tuple[str, int]]:
    return [(h.kind, h.draws) for h in analysis.keys.hazards]


@pytest.mark.parametrize("framework,variant", CASES, ids=lambda c: str(c))
def test_literal_and_reused_keys_are_found_and_nothing_else(framework, variant):
    expected = {"reused": [(REUSED, 2)], "literal": [(LITERAL, 1)]}.get(variant, [])
    analysis = analysed(framework, variant)
    assert hazards(analysis) == expected
    for h in analysis.keys.hazards:  # placed: each draw at its line of rng_key_steps.py
        assert len(h.sites) == h.draws if h.kind == REUSED else 1
        assert all(computation.startswith("main") for computation, _ in h.sites)


@pytest.mark.parametrize("variant", ["split", "fold_in", "reused", "literal"])
def test_jax_key_reuse_checker_agrees(variant):
    """jax's own checker, on the same step: it raises exactly where the analysis finds a reused key (a literal key
    is no reuse to it: drawn once per step, the same bits every step)."""
    from jax.errors import KeyReuseError

    step = steps.jax_step(variant)
    state, x = steps.jax_state(variant), steps.batch()
    state["key"] = jax.random.key(1)  # the checker follows typed keys
    with jax.debug_key_reuse(True):
        try:
            jax.jit(step).trace(state, x)
            reused = False
        except KeyReuseError:
            reused = True
    assert reused == (variant == "reused") == any(k == REUSED for k, _ in hazards(analysed("jax", variant)))


def test_a_key_drawn_on_every_loop_iteration_unchanged_is_reused_fold_in_per_iteration_is_not():
    """A scan whose layers draw from the key it carries unchanged draws the same bits on each of its 3 iterations;
    ``fold_in(key, i)`` is another key per iteration."""
    w, x, key = steps.jax_state("split")["w"], steps.batch(), jax.random.PRNGKey(0)
    report = analyze(steps.forward("scan_reused").lower(w, x, key).as_text(dialect="hlo")).keys
    assert [(h.kind, h.draws, h.in_loop) for h in report.hazards] == [(REUSED, steps.LAYERS, True)]
    assert analyze(steps.forward("scan_fold_in").lower(w, x, key).as_text(dialect="hlo")).keys.hazards == ()


def test_an_unused_key_under_a_neutral_name_is_dead_rng_state():
    analysis = analysed("jax", "init_seed")
    roles = {p.path: p.role for p in analysis.params}
    assert roles["state.init_seed"] == "rng_key"
    assert {s.path: s.verdict for s in analysis.rng.streams} == {"state.init_seed": "carried", "state.key": "drawn"}
    # From the text alone (the mangled name says nothing): the same verdicts.
    text_only = analyze(steps.lower("jax", "init_seed").as_text(dialect="hlo"))
    assert sorted(s.verdict for s in text_only.rng.streams) == ["carried", "drawn"]


def test_jax_own_rng_computations_raise_no_alarm_in_the_suite_s_steps():
    """The construct steps (remat, barriers, loops, conds, calls; private, shared and idle NNX-style streams): no
    literal and no reused key."""
    import rng_constructs

    for construct in rng_constructs.CONSTRUCTS:
        for rngs in rng_constructs.RNG_STATES:
            text = rng_constructs.hlo_text(rng_constructs.StepSpec(construct, rngs))
            assert analyze(text).keys.hazards == (), (construct, rngs)


# ---------------------------------------------------------------------------------------------------------------
# The gate, `diff` and `rng`
# ---------------------------------------------------------------------------------------------------------------

TARGET = """\
import rng_key_steps


def target(cell):
    return rng_key_steps.target(cell)
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    folder = tmp_path_factory.mktemp("rng_keys")
    (folder / "steps.py").write_text(TARGET)
    (folder / "hlo-audit.toml").write_text('target = "steps:target"\nmodels = ["jax", "nnx"]\nscan = ["off"]\n'
                                           'quant = ["none"]\nlayers = [1]\n')
    assert hlo_audit_here(folder, "golden", "update", env={"STEP_VARIANT": "split"}).returncode == 0
    return folder


def check(project, variant: str):
    return hlo_audit_here(project, "check", "--no-cache", "--format", "json",
                          env={"STEP_VARIANT": variant, "COLUMNS": "200"})


def findings(ran, rule: str) -> list[dict]:
    doc = json.loads(ran.stdout)
    return [f for f in doc["findings"] if f["rule"] == rule]


@pytest.mark.parametrize("model", ["jax", "nnx"])
@pytest.mark.parametrize("variant", ["literal", "reused"])
def test_a_literal_or_reused_key_fails_the_gate_named_and_placed(project, model, variant):
    ran = check(project, variant)
    assert ran.returncode == 1, ran.stdout + ran.stderr
    named = [f for f in findings(ran, "rng_keys") if f["cell"].startswith(model)]
    assert len(named) == 1 and named[0]["severity"] == "regression", ran.stdout
    message = named[0]["message"]
    what = "a literal key drawn from" if variant == "literal" else "one key drawn from 2 times without a split"
    assert what in message and "rng_key_steps.py:" in message, message


def test_split_and_fold_in_do_not_alarm(project):
    for variant in ("split", "fold_in"):
        ran = check(project, variant)
        assert findings(ran, "rng_keys") == [], (variant, ran.stdout)


def test_rng_lists_the_reused_key_and_exits_1(tmp_path):
    lowered = steps.lower("jax", "reused")
    path = tmp_path / "reused.hlo"
    path.write_text(lowered.as_text(dialect="hlo", debug_info=True))
    ran = hlo_audit_here(tmp_path, "rng", path, env={"COLUMNS": "200"})
    assert ran.returncode == 1
    out = " ".join(ran.stdout.split())
    assert "reused: one key drawn from 2 times without a split or fold_in between, at rng_key_steps.py:" in out
    doc = json.loads(hlo_audit_here(tmp_path, "rng", path, "--format", "json").stdout)
    assert [(k["kind"], k["draws"]) for k in doc["key_hazards"]] == [(REUSED, 2)]


def test_diff_names_a_key_reused_instead_of_split(tmp_path):
    for variant in ("split", "reused"):
        (tmp_path / f"{variant}.hlo").write_text(steps.lower("jax", variant).as_text(dialect="hlo", debug_info=True))
    ran = hlo_audit_here(tmp_path, "diff", tmp_path / "split.hlo", tmp_path / "reused.hlo", env={"COLUMNS": "200"})
    assert ran.returncode == 1
    assert "rng keys: one key drawn from 2 times" in " ".join(ran.stdout.split())


def test_calls_nested_past_recursion_are_incomplete_not_a_crash():
    """A chain of calls deeper than Python recurses: no hazard guessed."""
    depth = 3000
    lines = ["HloModule deep", "c0 {", "  ROOT p = u32[2] parameter(0)", "}"]
    for i in range(1, depth):
        lines += [f"c{i} {{", "  p = u32[2] parameter(0)", f"  ROOT r = u32[2] call(p), to_apply=c{i - 1}", "}"]
    lines += ["ENTRY main {", "  p = u32[2] parameter(0)", f"  ROOT r = u32[2] call(p), to_apply=c{depth - 1}", "}"]
    report = analyze("\n".join(lines)).keys
    assert report.hazards == () and report.complete is False
    assert parse_module("\n".join(lines))  # the module itself is valid


def test_the_new_literal_key_is_the_one_named_when_a_change_elsewhere_renames_the_old_ones():
    """A step that already draws from a literal key (a closed-over one, as MaxEngine's inference steps do) gains a
    second, a ``normal`` draw for router noise, while its output is scaled (every canonical name after it moves):
    the change names the new draw, not the old one."""
    from hlo_audit.comparison import Structural
    from hlo_audit.hlo.changes import ChangeKind

    def before(x):
        return jax.numpy.where(jax.random.bernoulli(jax.random.PRNGKey(0), 0.5, x.shape), x, 0.0).sum()

    def after(x):
        noise = jax.random.normal(jax.random.PRNGKey(5), x.shape)
        return 2.0 * jax.numpy.where(jax.random.bernoulli(jax.random.PRNGKey(0), 0.5, x.shape), x + noise, 0.0).sum()

    old, new = (analyze(jax.jit(f).lower(steps.batch()).as_text(dialect="hlo", debug_info=True)) for f in (before, after))
    changes = Structural.of_inputs(old, new).named(ChangeKind.RNG_KEYS)
    assert [(c.subject, c.before, c.after) for c in changes] == [("literal key", "1", "2")]
    assert "normal" in changes[0].place.op_name


def test_each_hazard_in_words():
    from hlo_audit.hlo.changes import LITERAL_KEY, LOOP_KEY, REUSED_KEY, Action, Change, ChangeKind, Place
    from hlo_audit.report.change_words import change_line

    at = Place("region", "jit(step)/jit(_bernoulli)", "model.py:4", ("state.key",))
    loop = Change(ChangeKind.RNG_KEYS, Action.ADDED, LOOP_KEY, at, per_step=3, before="0", after="1")
    assert change_line(loop) == (
        "rng keys: one key drawn from on every loop iteration, unchanged (3 draws per step) at model.py:4 "
        "(jit(step)/jit(_bernoulli)) in region reading state.key: every iteration draws the same bits (fold_in the "
        "iteration or split per layer); reused keys 0 -> 1")
    twice = Change(ChangeKind.RNG_KEYS, Action.ADDED, REUSED_KEY, at, per_step=2, before="1", after="2",
                   groups=(("model.py:5", 1),))
    assert "one key drawn from 2 times without a split or fold_in between at model.py:4" in change_line(twice)
    assert "again at model.py:5" in change_line(twice) and change_line(twice).endswith("reused keys 1 -> 2")
    fewer = Change(ChangeKind.RNG_KEYS, Action.REMOVED, LITERAL_KEY, count=2, before="3", after="1")
    assert change_line(fewer) == "rng keys: 2 literal keys fewer (3 -> 1)"


def test_a_per_layer_key_a_scan_carries_through_unread_is_dead_whatever_its_name():
    """Stacked per-layer keys under a neutral name, sliced per iteration and stacked back by a scan that never draws
    from them: moved, never computed with, so dead RNG state."""
    import jax.numpy as jnp
    from jax import lax

    def step(state, x):
        def loss(w):
            h, seeds = lax.scan(lambda h, xs: (jnp.tanh(h @ xs[0]), xs[1]), x, (w, state["layer_seed"]))
            return h.sum(), seeds

        (value, seeds), grads = jax.value_and_grad(loss, has_aux=True)(state["w"])
        return {"w": state["w"] - 0.1 * grads, "layer_seed": seeds}, value

    state = {"w": steps.jax_state("split")["w"], "layer_seed": jax.random.split(jax.random.PRNGKey(0), steps.LAYERS)}
    lowered = jax.jit(step, donate_argnums=0).trace(state, steps.batch()).lower()
    analysis = analyze(lowered.as_text(dialect="hlo"), "<step>", arg_keys(lowered), None, arg_leaves(lowered))
    assert {p.path: p.role for p in analysis.params}["state.layer_seed"] == "rng_key"
    assert {s.path: s.verdict for s in analysis.rng.streams} == {"state.layer_seed": "carried"}
