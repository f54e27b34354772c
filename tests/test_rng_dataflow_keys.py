"""RNG keys by dataflow: a key in a linen ``TrainState``, linen's ``rngs``, a plain pytree is RNG state whatever it
is called, and ``rng`` says whether the step draws from it (issue 32, item 5).

Every step is a real lowering of tests/linen_trainer.py; every verdict is checked against the numerical oracle
(tests/rng_oracle.py: the step run with the key replaced). Before, a raw ``jax.random.PRNGKey`` in a
``TrainState`` field had role ``other`` and ``hlo-audit rng`` found no stream in these steps.
"""

from __future__ import annotations

import functools
import json

import pytest

import linen_trainer
import rng_oracle
from hlo_audit.attribution import arg_keys, arg_leaves
from hlo_audit.hlo.analysis import analyze
from hlo_audit.hlo.params import key_by_name
from hlo_audit.hlo.shapes import parse_shape
from in_process import hlo_audit_here
from linen_trainer import TrainerSpec

pytestmark = pytest.mark.xdist_group("linen_trainer")


@functools.cache
def analysed(spec: TrainerSpec, with_leaves: bool = True):
    """The step's analysis as the tool makes it when it lowers the step (paths and kinds from jax's args_info), or
    from its text alone (``with_leaves=False``: an HLO file, where a raw key's name is mangled)."""
    lowered = linen_trainer.lower(spec)
    text = lowered.as_text(dialect="hlo")
    if not with_leaves:
        return analyze(text, spec.name)
    return analyze(text, spec.name, arg_keys(lowered), None, arg_leaves(lowered))


def verdicts(analysis) -> dict[str, str]:
    return {s.path: s.verdict for s in analysis.rng.streams}


# What each key does, by construction (linen_trainer.expected): each framework and use, each kind of key.
SPECS = [TrainerSpec(framework, use, key, "noise")  # a name no rule knows: the dataflow alone finds the key
         for framework, use in (("linen", "fold_in"), ("linen", "split"), ("linen", "carried"), ("linen", "rngs"),
                                ("jax", "split"), ("jax", "bits"), ("jax", "carried"))
         for key in ("raw", "rbg_raw", "typed")]
SPECS += [TrainerSpec("linen", "split", "rbg"), TrainerSpec("jax", "fold_in", "rbg")]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_a_key_the_step_splits_folds_or_draws_from_is_rng_state_with_its_path(spec):
    analysis = analysed(spec)
    keys = {p.path: (p.role, p.dtype, p.shape.dims[-1]) for p in analysis.params if p.is_rng}
    width = 4 if spec.key.startswith("rbg") else 2
    assert keys == {path: ("rng_key", "u32", width) for path in linen_trainer.expected(spec)}
    assert verdicts(analysis) == linen_trainer.expected(spec)
    assert all(s.count is None and s.increments == 0 for s in analysis.rng.streams)
    # From the text alone (`hlo-audit rng FILE`): the same verdicts, the paths as the mangled names read.
    assert sorted(verdicts(analysed(spec, with_leaves=False)).values()) == sorted(verdicts(analysis).values())


ORACLE_SPECS = [
    TrainerSpec("linen", "fold_in", "raw"),  # dropout_key = fold_in(state.key, state.step)
    TrainerSpec("linen", "split", "raw"),  # key, dropout_key = split(state.key)
    TrainerSpec("linen", "carried", "raw"),  # split every step, fed to rate-0 dropouts only
    TrainerSpec("linen", "rngs", "raw"),  # apply(..., rngs=rngs): `dropout` drawn, `noise` split only
    TrainerSpec("linen", "kept", "typed"),  # a typed key handed back untouched
    TrainerSpec("jax", "split", "raw", "noise"),  # plain JAX, the key under a name no rule knows
    TrainerSpec("jax", "carried", "raw"),
    TrainerSpec("jax", "bits", "rbg_raw"),  # an rbg key's data: rng-bit-generator
    TrainerSpec("jax", "carried", "rbg"),
]


# The three slowest linen cases are `long` (make test's 15 minutes); a linen fold_in, a kept typed key and every
# plain-JAX case stay in make test.
LONG_ORACLE = ("linen_split_raw_key", "linen_carried_raw_key", "linen_rngs_raw_key")


@pytest.mark.parametrize("spec", [pytest.param(s, id=s.name, marks=[pytest.mark.long] if s.name in LONG_ORACLE else [])
                                  for s in ORACLE_SPECS])
def test_verdicts_agree_with_the_numerical_oracle(spec):
    case = rng_oracle.trainer_case(spec)  # also checks that analyze() finds exactly the oracle's keys
    assert case.truth == {path: verdict == "drawn" for path, verdict in linen_trainer.expected(spec).items()}
    assert {path: verdict == "drawn" for path, verdict in verdicts(analysed(spec)).items()} == case.truth


@pytest.mark.parametrize("spec", [TrainerSpec("linen", "split", "raw"), TrainerSpec("linen", "carried", "rbg_raw"),
                                  TrainerSpec("jax", "fold_in", "raw")], ids=lambda s: s.name)
def test_renaming_the_key_keeps_roles_and_verdicts(spec):
    """A harmless edit: the field or dict key renamed (``key`` -> ``rng`` -> ``noise``)."""
    import dataclasses

    def seen(field: str):
        analysis = analysed(dataclasses.replace(spec, field=field))
        return (analysis.summary.by_role,
                {path.replace(f"state.{field}", "state.KEY"): v for path, v in verdicts(analysis).items()})

    assert seen("key") == seen("rng") == seen("noise")
    assert seen("key")[0]["rng_key"] == 1


def test_a_key_only_handed_back_is_dead_rng_state_whatever_its_name():
    """A key-shaped leaf the step carries through unread is the state a never-drawn key is (issue 39, item 3): a
    carried stream by its name, its type, or, under a name no rule knows and raw, by the dataflow alone; from the
    text alone too (the mangled name says nothing)."""
    for field in ("key", "rng"):
        assert verdicts(analysed(TrainerSpec("linen", "kept", "raw", field))) == {f"state.{field}": "carried"}
    assert verdicts(analysed(TrainerSpec("linen", "kept", "typed", "noise"))) == {"state.noise": "carried"}  # type
    unnamed = analysed(TrainerSpec("linen", "kept", "raw", "noise"))
    assert analysis_roles(unnamed)["state.noise"] == "rng_key" and verdicts(unnamed) == {"state.noise": "carried"}
    assert list(verdicts(analysed(TrainerSpec("linen", "kept", "raw", "noise"), with_leaves=False)).values()) == [
        "carried"]


def analysis_roles(analysis) -> dict[str, str]:
    return {p.path: p.role for p in analysis.params}


@pytest.mark.parametrize("path,shape,key", [
    ("state.key", "u32[2]", True), ("state.dropout_rng", "u32[4]", True), ("rngs.dropout", "u32[2]", True),
    ("state.layers.key", "u32[3,2]", True),
    ("state.key", "u32[3]", False), ("state.key", "s32[2]", False), ("state.monkey", "u32[2]", False),
    ("state.noise", "u32[2]", False), ("rngs", "u32[2]", False),
])
def test_names_say_key_only_of_a_key_shaped_leaf(path, shape, key):
    assert key_by_name(path, parse_shape(shape)) is key


# ---------------------------------------------------------------------------------------------------------------
# Through a callable target: count / rng / check
# ---------------------------------------------------------------------------------------------------------------

TRAINER = """\
import linen_trainer


def target(cell):  # the model names what the step does with its key
    return linen_trainer.traced(linen_trainer.TrainerSpec("linen", cell.model, "raw", "key"))
"""


def test_a_callable_targets_key_is_rng_state_in_count_rng_and_check(tmp_path):
    (tmp_path / "trainer.py").write_text(TRAINER)
    (tmp_path / "hlo-audit.toml").write_text('target = "trainer:target"\nmodels = ["split", "carried"]\n'
                                             'scan = ["off"]\nquant = ["none"]\nlayers = [1]\n')
    assert hlo_audit_here(tmp_path, "golden", "update").returncode == 0
    lowered = tmp_path / "step.hlo.txt"
    assert hlo_audit_here(tmp_path, "lower", "split/scan-off/none/L1", "-o", lowered).returncode == 0
    counted = hlo_audit_here(tmp_path, "count", lowered, "--format", "json")
    assert counted.returncode == 0
    assert json.loads(counted.stdout)["modules"][0]["by_role"]["rng_key"] == 1
    wide = {"COLUMNS": "200"}
    drawn = hlo_audit_here(tmp_path, "rng", "split/scan-off/none/L1", "--streams", env=wide)
    assert drawn.returncode == 0 and "1 RNG stream: 1 drawn, 0 carried" in drawn.stdout
    # Split every step, fed to rate-0 dropouts only: dead state, named, and the gate's dead_rng says so.
    carried = hlo_audit_here(tmp_path, "rng", "carried/scan-off/none/L1", "--streams", env=wide)
    assert carried.returncode == 1 and "1 RNG stream: 0 drawn, 1 carried (dead state)" in carried.stdout
    assert "carried  state.key" in carried.stdout
    checked = hlo_audit_here(tmp_path, "check", env=wide)
    assert checked.returncode == 0, checked.stdout
    assert "1 cell carries never-drawn RNG streams (dead_rng: warn, 1 dead param)" in checked.stdout


def test_a_key_shaped_leaf_used_as_data_is_not_a_key():
    """The dataflow names a key by what reaches random-bit generation: a u32[2] read as data stays what it was."""
    import jax
    import jax.numpy as jnp

    def step(state, ids):
        noise = jax.random.normal(jax.random.fold_in(state["seed"], ids[0]), (2,))  # ids: data folded into a key
        return dict(state, w=state["w"] * ids.astype(jnp.float32) + noise, tokens=state["tokens"] + 1), ids

    state = {"w": jnp.ones((2,)), "seed": jax.random.PRNGKey(0), "tokens": jnp.zeros((2,), jnp.uint32)}
    lowered = jax.jit(step).trace(state, jnp.arange(2, dtype=jnp.uint32)).lower()
    analysis = analyze(lowered.as_text(dialect="hlo"), "<step>", arg_keys(lowered), None, arg_leaves(lowered))
    assert analysis_roles(analysis) == {"state.seed": "rng_key", "state.tokens": "other", "state.w": "weight",
                                        "ids": "input"}
    assert verdicts(analysis) == {"state.seed": "drawn"}
