"""A linen module renamed in a model with dropout is a rename (issue 32 item 4), and dropout turned off is random-bit
generation gone, not loops: both found on flax's own lm1b example.

Two things a rename does that the match must see through, both seen on flax's ``examples/lm1b`` trainer (its
``encoderdecoderblock_{i}`` renamed ``block_{i}``: before, "changed (attributes)" and an ``ops`` regression of 8
literals):

* it reorders the state's leaves, so by position same-shaped weights of a block pair with each other's neighbours
  (``LayerNorm_0`` with ``LayerNorm_1``, ``query`` with ``key``): the parameters must pair by the rename;
* linen's ``make_rng`` folds a hash of the module's path into the key each ``Dropout`` draws from
  (``fold_in(key, <literal>)``), so the literals change with the name: they are salts, not the program.

The model here is that shape in small: blocks of two LayerNorms, two Dense of one shape and Dropout at 0.1, a norm
whose name sorts between the blocks' old name and their new one, adam state beside the weights, a dropout key
argument the step folds the step count into.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
import pytest
from flax import linen as nn
from flax.training import train_state

from hlo_audit.hlo.analysis import analyze
from hlo_audit.hlo.changes import RANDOM_BITS, ChangeKind
from hlo_audit.hlo.diff import diff_modules
from hlo_audit.hlo.match import match_params
from hlo_audit.stages.lowered import hlo_text
from in_process import cli

WIDTH, LAYERS = 16, 2


class Block(nn.Module):
    rate: float

    @nn.compact
    def __call__(self, x):
        h = nn.Dropout(self.rate, deterministic=False)(nn.Dense(WIDTH, name="query")(nn.LayerNorm()(x)))
        h = h + nn.Dense(WIDTH, name="key")(x)
        return x + nn.Dropout(self.rate, deterministic=False)(nn.LayerNorm()(h))


class Model(nn.Module):
    block_name: str = "encoderdecoderblock"
    rate: float = 0.1

    @nn.compact
    def __call__(self, x):
        for i in range(LAYERS):
            x = Block(self.rate, name=f"{self.block_name}_{i}")(x)
        # Sorted after the blocks' old name and before their new one (lm1b's encoderdecoder_norm): the rename moves
        # the blocks' leaves past this norm's, of their LayerNorms' shape.
        x = nn.LayerNorm(name="decoder_norm")(x)
        return nn.Dense(1, name="head")(x).sum()


def lowered_text(block_name: str = "encoderdecoderblock", rate: float = 0.1) -> str:
    model = Model(block_name, rate)
    x = jax.ShapeDtypeStruct((4, WIDTH), jnp.float32)

    def create():
        params = model.init(jax.random.key(0), jnp.zeros((4, WIDTH)))["params"]
        return train_state.TrainState.create(apply_fn=model.apply, params=params, tx=optax.adam(1e-3))

    def train_step(state, x, dropout_rng):
        rng = jax.random.fold_in(dropout_rng, state.step)
        loss, grads = jax.value_and_grad(lambda p: state.apply_fn({"params": p}, x, rngs={"dropout": rng}))(
            state.params)
        return state.apply_gradients(grads=grads), loss

    lowered = jax.jit(train_step, donate_argnums=0).lower(jax.eval_shape(create), x, jax.random.PRNGKey(1))
    return hlo_text(lowered)


@pytest.fixture(scope="module")
def base() -> str:
    return lowered_text()


def test_a_block_renamed_is_renamed_only(base, tmp_path):
    renamed = lowered_text(block_name="block")
    assert renamed.count("fold_in") and base != renamed
    d = diff_modules(analyze(base, "base"), analyze(renamed, "renamed"))
    assert d.verdict == "renamed-only", (d.verdict, d.changes)
    # Every weight paired with its own renamed self: none of a block's same-shaped neighbours.
    pairs = [p for p in match_params(analyze(base, "base").params, analyze(renamed, "renamed").params) if p.renamed]
    assert pairs and all(p.old.path.replace("encoderdecoderblock_", "block_") == p.new.path for p in pairs)
    # `diff` says so and exits 0, as the README promises a rename.
    (tmp_path / "a.hlo").write_text(base)
    (tmp_path / "b.hlo").write_text(renamed)
    ran = cli("diff", tmp_path / "a.hlo", tmp_path / "b.hlo")
    assert ran.exit_code == 0 and ran.stdout.startswith("verdict: renamed-only"), ran.stdout
    assert "rename: encoderdecoderblock_* -> block_*" in ran.stdout


def test_a_rename_with_another_dropout_rate_is_a_change(base):
    """The salts are seen through only as salts: a rate changed with the rename is a change of the program."""
    d = diff_modules(analyze(base, "base"), analyze(lowered_text(block_name="block", rate=0.2), "renamed"))
    assert d.verdict == "changed"


def test_salts_changed_without_a_rename_are_a_change(base):
    """Without parameters renamed the literals folded into the keys are the program's (another seed's stream)."""
    # The same names and rate, but the key folded with another literal: a model whose dropout draws another stream.
    d = diff_modules(analyze(base, "base"), analyze(_with_other_salt(base), "salted"))
    assert d.verdict == "changed"


def _with_other_salt(text: str) -> str:
    """``text`` with the literal of the first fold_in call whose data is one changed."""
    for line in text.splitlines():
        if "fold_in" in line and "call(" in line:
            salt = line.split("call(", 1)[1].split(")", 1)[0].split(", ")[-1]
            if salt.startswith("constant"):
                break
    else:
        raise AssertionError("no fold_in call")
    for line in text.splitlines():
        if line.strip().startswith(f"{salt} = u32[] constant("):
            value = int(line.split("constant(", 1)[1].split(")", 1)[0])
            return text.replace(line, line.replace(f"constant({value})", f"constant({value + 1})"))
    raise AssertionError(f"no literal {salt}")


def test_dropout_turned_off_is_random_bit_generation_not_loops(base):
    """Dropout at 0 draws nothing: the key goes, and with it jax.random's own computations, threefry's rounds loop
    among them. That loop is the RNG's implementation: the change is the program size's, said as random-bit
    generation, and no loop of the model was removed (before, on lm1b: five 'loops: a loop removed ... in
    threefry2x32' regressions)."""
    d = diff_modules(analyze(base, "base"), analyze(lowered_text(rate=0.0), "dropout off"))
    assert d.verdict == "changed"
    kinds = {c.kind for c in d.named}
    assert ChangeKind.LOOPS not in kinds, [c for c in d.named if c.kind is ChangeKind.LOOPS]
    (size,) = [c for c in d.named if c.kind is ChangeKind.PROGRAM_SIZE]
    assert size.subject == RANDOM_BITS and size.instructions < 0, size


def test_random_computations_are_jax_randoms_by_whole_name():
    """jax.random's computations by their whole name, as the raw text (``_bernoulli.11``) and the canonical one
    (``bernoulli.6dbad01b``) write them, and what they call; a model's ``_normalize`` or ``uniform_init`` is no such
    computation, nor what it calls."""
    from hlo_audit.hlo.rng_flow import random_computations
    from hlo_audit.hlo.text import parse_module

    def called(name: str, callee: str) -> str:
        return (f"{name} {{\n  p = f32[] parameter(0)\n"
                f"  ROOT c = f32[] call(p), to_apply={callee}\n}}\n\n")

    leaf = "leaf.{n} {{\n  ROOT p = f32[] parameter(0)\n}}\n\n"
    names = ["_bernoulli.11.1", "bernoulli.6dbad01b", "_threefry2x32.3", "_normalize.4", "uniform_init.5"]
    text = "HloModule m\n\n" + "".join(leaf.format(n=n) for n in range(len(names)))
    text += "".join(called(name, f"leaf.{n}") for n, name in enumerate(names))
    text += "ENTRY main {\n  ROOT p = f32[] parameter(0)\n}\n"
    found = random_computations(parse_module(text))
    assert found == {"_bernoulli.11.1", "bernoulli.6dbad01b", "_threefry2x32.3", "leaf.0", "leaf.1", "leaf.2"}
