"""A key handed unsplit to every layer of an equinox encoder is a reused key (issue 47, item 3), found in the step
jax lowers, named by the gate's key rule and never called RNG bookkeeping by `diff`.

The step is tests/eqx_bert.py, equinox's BERT example in small: each layer splits the key it is given for its
attention and feed-forward dropouts, so layers given one key drop the same units. jax's own key-reuse checker
(``jax_debug_key_reuse``) is the oracle: it rejects exactly the step the analysis finds a reused key in. Before, jax's
other specializations of its random functions (``threefry2x32_1``, ``_bernoulli_11``: a batched key's) were not
recognised, so no draw was seen; and with draws seen, every key split from the reused one counted as a mistake of
its own (7 reused keys for one).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import jax
import pytest

pytest.importorskip("equinox")  # an equinox user's model: make compat's environment has none

import eqx_bert
from hlo_audit.attribution import arg_keys, arg_leaves
from hlo_audit.hlo.analysis import analyze
from hlo_audit.hlo.locations import Locations
from hlo_audit.hlo.rng_keys import REUSED
from in_process import hlo_audit_here

pytestmark = pytest.mark.xdist_group("eqx_bert")


def bert_line(code: str) -> str:
    """``eqx_bert.py:N``: the line of the model's source that holds ``code`` (once)."""
    lines = [n for n, line in enumerate(Path(eqx_bert.__file__).read_text().splitlines(), 1) if code in line]
    assert len(lines) == 1, (code, lines)
    return f"eqx_bert.py:{lines[0]}"


# Where each layer consumes the key it is given: the split a layer makes of it.
LAYER_SPLIT = bert_line("attention_key, ff_key = jax.random.split(key)")
# Where jax's metadata places every split of a batched key in this step (module doc of the test below).
SPLIT_PLACE = bert_line("embed_key, l_key = jax.random.split(key)")


@functools.cache
def text(variant: str) -> str:
    return eqx_bert.lower(variant).lowered.as_text(dialect="hlo", debug_info=True)


@functools.cache
def analysed(variant: str):
    lowered = eqx_bert.lower(variant).lowered
    return analyze(text(variant), variant, arg_keys(lowered), None, arg_leaves(lowered))


def reused_by_jax_checker(variant: str) -> bool:
    from jax.errors import KeyReuseError

    model, opt_state, tokens, labels, _ = eqx_bert.inputs(variant)
    with jax.debug_key_reuse(True):  # the checker follows typed keys
        try:
            eqx_bert.make_step.lower(model, opt_state, tokens, labels, jax.random.key(1))
        except KeyReuseError:
            return True
    return False


@pytest.mark.parametrize("variant", eqx_bert.VARIANTS)
def test_one_reused_key_where_jax_checker_finds_reuse_and_none_where_the_layers_split(variant):
    report = analysed(variant).keys
    assert reused_by_jax_checker(variant) == (variant == "unsplit")
    if variant == "split":
        assert report.hazards == () and report.complete
        return
    # One mistake, one hazard: the layers' key consumed once per layer by the layer's split; the keys split from it
    # (drawn again in every layer) are its consequences.
    (hazard,) = report.hazards
    assert (hazard.kind, hazard.draws, hazard.in_loop) == (REUSED, eqx_bert.LAYERS, False)
    module = analysed(variant).module
    calls = [module.computations[c].by_name[name] for c, name in hazard.sites]
    assert all("_threefry_split" in call.op_name for call in calls)
    # Each draw is a layer's split, reached from the encoder's loop (jax's metadata puts the first trace of the
    # batched split, the encoder's own at Encoder.__call__, innermost: SPLIT_PLACE).
    chains = [Locations(module).chain_of(call) for call in calls]
    assert all(LAYER_SPLIT in chain and chain[0] == SPLIT_PLACE for chain in chains), chains


def test_diff_names_the_reused_key_and_never_calls_it_rng_bookkeeping(tmp_path):
    """Stripped of RNG state the two steps are one program (every key, and every draw, goes): that must not make
    the key handed on unsplit "RNG state only"."""
    for variant in eqx_bert.VARIANTS:
        (tmp_path / f"{variant}.hlo").write_text(text(variant))
    ran = hlo_audit_here(tmp_path, "diff", tmp_path / "split.hlo", tmp_path / "unsplit.hlo", "--format", "json")
    assert ran.returncode == 1, ran.stdout + ran.stderr
    doc = json.loads(ran.stdout)
    assert (doc["verdict"], doc["changes"]) == ("changed", ["rng"]), doc["verdict"]
    keys = [c for c in doc["named"] if c["kind"] == "rng_keys"]
    assert [(c["action"], c["subject"], c["before"], c["after"]) for c in keys] == [
        ("added", "reused key", "0", "1")], keys
    assert keys[0]["place"]["source"] == SPLIT_PLACE
    words = " ".join(hlo_audit_here(tmp_path, "diff", tmp_path / "split.hlo", tmp_path / "unsplit.hlo",
                                    env={"COLUMNS": "200"}).stdout.split())
    assert "rng-state-only" not in words and "bookkeeping" not in words, words
    assert f"rng keys: one key drawn from {eqx_bert.LAYERS} times without a split or fold_in between at " \
           f"{SPLIT_PLACE}" in words, words
    # The fix, the other way round: no bookkeeping either, the reused key gone.
    back = json.loads(hlo_audit_here(tmp_path, "diff", tmp_path / "unsplit.hlo", tmp_path / "split.hlo",
                                     "--format", "json").stdout)
    assert back["verdict"] == "changed"
    assert [(c["action"], c["subject"]) for c in back["named"] if c["kind"] == "rng_keys"] == [
        ("removed", "reused key")]


TARGET = """\
import eqx_bert


def target(cell):
    return eqx_bert.target(cell)
"""


@pytest.mark.parametrize("stage", ["lowered", "compiled"])
def test_check_names_the_reused_key_at_the_layer_whatever_the_text_rule_says(tmp_path, stage):
    """The golden is the encoder that splits per layer; the same cell with the key handed on unsplit fails the gate by
    the key rule, with the text rule advisory (a text that strips to the golden's was once "RNG bookkeeping" there).
    Compiled too: XLA's text shows no draw, the keys are those of the module jax handed it."""
    (tmp_path / "steps.py").write_text(TARGET)
    (tmp_path / "hlo-audit.toml").write_text(f'target = "steps:target"\nmodels = ["bert"]\nscan = ["off"]\n'
                                             f'quant = ["none"]\nlayers = [2]\nstage = "{stage}"\n'
                                             '[policy]\nhlo_text = "warn"\n')
    assert hlo_audit_here(tmp_path, "golden", "update", env={"STEP_VARIANT": "split"}).returncode == 0

    def check(variant: str):
        ran = hlo_audit_here(tmp_path, "check", "--no-cache", "--format", "json",
                             env={"STEP_VARIANT": variant, "COLUMNS": "200"})
        return ran, [f for f in json.loads(ran.stdout)["findings"] if f["rule"] == "rng_keys"]

    same, named = check("split")
    assert same.returncode == 0 and named == [], same.stdout
    ran, named = check("unsplit")
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert [f["severity"] for f in named] == ["regression"], named
    message = named[0]["message"]
    assert f"one key drawn from {eqx_bert.LAYERS} times without a split or fold_in between at {SPLIT_PLACE}" \
           in message, message
    text_rule = [f for f in json.loads(ran.stdout)["findings"] if f["rule"] == "hlo_text"]
    assert all("rng-state-only" not in f["message"] for f in text_rule), text_rule
