"""A change is placed at the user's call site, past a wrapper both sides share (``hlo.call_sites``; issue 38, item 3).

One small model, lowered as a user's train step is (``jax.jit(jax.grad(loss)).lower``, jax's text with debug info),
whose blocks and head constrain their values through a project's own ``shard()`` wrapper of
``with_sharding_constraint`` (MaxText's ``maybe_shard_with_logical``) and project through a ``proj()`` helper both
call. Each test makes one pull request's change and reads where the structural diff places it.
"""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from hlo_audit.comparison import Structural
from hlo_audit.hlo.analysis import analyze

MESH = Mesh(np.array(jax.devices("cpu")[:1]), ("x",))
HERE = "test_call_sites.py"


def shard(h):
    return jax.lax.with_sharding_constraint(h, NamedSharding(MESH, P("x", None)))  # WRAPPER


def proj(x, w, dtype=jnp.float32, inside=jnp.float32):
    """``dtype``: what the caller asks for; ``inside``: what the helper itself computes in, whatever it is asked."""
    dtype = inside if inside != jnp.float32 else dtype
    return (x.astype(dtype) @ w.astype(dtype)).astype(jnp.float32)  # HELPER


def block(w, h, change: str):
    h = shard(proj(h, w, dtype=jnp.bfloat16 if change == "caller_dtype" else jnp.float32,  # BLOCK_PROJ
                   inside=jnp.bfloat16 if change == "helper_dtype" else jnp.float32))
    if change == "new_constraint":
        h = shard(jnp.tanh(h))  # NEW_CALL
    return jnp.tanh(h) * h


def head(w, h, change: str):
    return shard(proj(h, w, inside=jnp.bfloat16 if change == "helper_dtype" else jnp.float32) * 2.0)


def text(change: str = "", remat: bool = False) -> str:
    def loss(ws, h):
        for w in ws[:-1]:
            step = (lambda w, h: block(w, h, change))  # noqa: E731
            h = (jax.checkpoint(step) if remat else step)(w, h)
        return jnp.sum(head(ws[-1], h, change))
    ws, h = [jnp.ones((8, 8))] * 3, jnp.ones((4, 8))
    return jax.jit(jax.grad(loss)).lower(ws, h).as_text(dialect="hlo", debug_info=True)


def line(marker: str) -> str:
    """``test_call_sites.py:N``: this file's line that ends with ``# marker``."""
    source, _ = inspect.getsourcelines(inspect.getmodule(line))
    (number,) = [n for n, code in enumerate(source, 1) if code.rstrip().endswith(f"# {marker}")]
    return f"{HERE}:{number}"


def named(change: str, remat: bool = False) -> dict[str, set[str]]:
    """kind -> the sources its changes are placed at."""
    diff = Structural.of_inputs(analyze(text(), "before"), analyze(text(change, remat), "after")).diff
    found: dict[str, set[str]] = {}
    for c in diff.named:
        found.setdefault(c.kind.value, set()).add(c.place.source)
    return found


@pytest.fixture(scope="module")
def wrapper_line() -> str:
    return line("WRAPPER")


def test_a_new_call_of_a_wrapper_is_placed_at_the_call_not_the_wrapper(wrapper_line):
    """The block calls ``shard()`` once more: the constraint's innermost frame outside jax is the wrapper's line, which
    every constraint of both programs passes through (from the block and the head): the place is the new call."""
    found = named("new_constraint")
    assert found["sharding"] == {line("NEW_CALL")}, found
    assert wrapper_line not in set().union(*found.values())


def test_a_change_inside_a_helper_every_caller_shares_stays_at_the_helper():
    """The helper itself computes in bf16 now, for both its callers: no dot passes through it unchanged, so its line is
    the place of the precision change."""
    found = named("helper_dtype")
    assert found["precision"] == {line("HELPER")}, found


def test_a_change_one_caller_makes_through_a_shared_helper_is_placed_at_that_caller():
    """Only the block asks the helper for bf16: the head's dots still pass through the helper unchanged, so the
    helper's line says nothing of where the change is; the block's call does."""
    found = named("caller_dtype")
    assert found["precision"] == {line("BLOCK_PROJ")}, found


def test_remat_s_copies_of_a_wrapped_constraint_stay_remat(wrapper_line):
    """jax.checkpoint around the blocks: the recomputed forward's stacks are cut short above the block (jax traces
    it again after the step's trace returned), and its copies of the block's constraints are remat's: one remat
    change, no sharding change, and nothing placed at the wrapper or above the block."""
    found = named("", remat=True)
    assert set(found) - {"header", "instructions"} == {"remat"}, found
    assert wrapper_line not in found["remat"]


def test_a_checkpointed_block_s_ops_stay_in_the_block_though_jax_cuts_their_stack_short():
    """``nnx.remat`` around a block: jax records the block's forward ops with a stack cut short (the block's line,
    then the caller of ``lower``: the layer loop and the step are missing), the recomputed ones with the whole stack.
    The frames above the traced step are no caller to compare (``CallSites.outer``): the block's recomputed ops are
    placed at its own line, not climbed to the layer loop because the forward's copies seemed to come from elsewhere."""
    from collections import Counter

    from flax import nnx

    from hlo_audit.hlo.change_places import Sides
    from hlo_audit.hlo.match import match_modules

    class Block(nnx.Module):
        def __init__(self, rngs):
            self.lin = nnx.Linear(8, 8, rngs=rngs)

        def __call__(self, x):
            return jnp.tanh(self.lin(x)) * x  # REMAT_BLOCK

    class Model(nnx.Module):
        def __init__(self, rngs, remat):
            self.blocks = nnx.List([Block(rngs) for _ in range(3)])
            self.remat = remat

        def __call__(self, x):
            for b in self.blocks:
                x = (nnx.remat(b) if self.remat else b)(x)  # REMAT_LOOP
            return x

    def analysed(remat: bool):
        graphdef, state = nnx.split(Model(nnx.Rngs(0), remat))

        def loss(state, x):
            return jnp.sum(nnx.merge(graphdef, state)(x))
        lowered = jax.jit(jax.grad(loss)).lower(state, jnp.ones((4, 8)))
        return analyze(lowered.as_text(dialect="hlo", debug_info=True), str(remat))

    before, after = analysed(False), analysed(True)
    match = match_modules(before.module, after.module, before.params, after.params)
    sides = Sides(match, before.params, after.params)
    # Every changed op the block's own line computes (its recomputation's dot, add, tanh, multiply) is placed there.
    in_block = Counter(sides.origin(e)[1] for e in match.edits
                       if e.new is not None and sides.new.chain(e.new, e.new_computation)[:1] == (line("REMAT_BLOCK"),))
    assert sum(in_block.values()) >= 8 and set(in_block) == {line("REMAT_BLOCK")}, (in_block, sides.new.call_sites.outer)
    named = Structural.of_inputs(before, after).diff.named
    assert [(c.kind.value, c.place.source) for c in named if c.kind.value == "remat"] == [("remat", line("REMAT_LOOP"))]


def scaled_layer(x, w, scale: bool):
    kernel = jnp.tanh(w)  # KERNEL
    if scale:
        kernel = jnp.cos(kernel) * 0.5  # REMOVED
    return jnp.tanh(x @ kernel)  # USE


def scaled_text(scale: bool) -> str:
    def loss(ws, x):
        for w in ws:
            x = scaled_layer(x, w, scale)
        return jnp.sum(x)
    return jax.jit(jax.grad(loss)).lower([jnp.ones((8, 8))] * 2, jnp.ones((4, 8))).as_text(dialect="hlo",
                                                                                           debug_info=True)


def test_removed_code_is_placed_near_the_kept_code_next_to_it_where_the_golden_keeps_no_lines():
    """A golden's text keeps no metadata: what a pull request removed has no line of its own in either program. It
    is placed near the kept code it was made of or fed, by that code's line in the cell's program, and says "near";
    where the old text keeps its own lines (two dumps diffed), it is placed there, "at"."""
    from hlo_audit.hlo.normalize import normalize_with_names
    from hlo_audit.hlo.text import parse_module
    from hlo_audit.rules.wording import place_text

    before, after = scaled_text(True), scaled_text(False)
    golden = normalize_with_names(parse_module(before))[0]
    assert "stack_frame_id" not in golden and "source_line" not in golden
    (removed,) = Structural.of_inputs(analyze(golden, "golden"), analyze(after, "now")).diff.named
    assert removed.action.value == "removed" and removed.place.near, removed
    assert removed.place.source in {line("KERNEL"), line("USE")}, removed.place
    assert place_text(removed.place).startswith(f"near {removed.place.source}")
    (own,) = Structural.of_inputs(analyze(before, "before"), analyze(after, "now")).diff.named
    assert (own.place.source, own.place.near) == (line("REMOVED"), False), own.place


def test_a_text_of_deep_stacks_resolves_each_frame_once(monkeypatch):
    """A text's stack frame tables can be tens of thousands of frames deep (a hostile one, or a deep recursion): each
    frame is resolved once, from its caller's, and keeps ``CHAIN_FRAMES`` user frames at most (walked afresh per frame,
    20,000 frames took 48 s for 541 of them, each stack its whole depth)."""
    from hlo_audit.hlo import locations

    depth = 20_000
    files = {1: "/work/project/model.py", 2: "/site-packages/jax/_src/core.py"}
    # Every third frame is jax's; a frame's parent is its caller's number plus one (frame n is called by n - 1).
    table = {n: {"file_name_id": 2 if n % 3 == 0 else 1, "line": n} for n in range(1, depth + 1)}
    frames = {n: {"file_location_id": n, "parent_frame_id": n if n > 1 else 0} for n in range(1, depth + 1)}
    looked = []
    in_framework = locations._in_framework
    monkeypatch.setattr(locations, "_in_framework", lambda path: looked.append(path) or in_framework(path))
    where = locations.Locations.of_tables(files, table, frames)
    chains = [where.chain(n) for n in range(depth, 0, -7)]
    assert len(looked) == depth  # each frame once
    assert chains[0][:3] == tuple(f"model.py:{n}" for n in (depth, depth - 1, depth - 3))  # jax's frames left out
    assert max(map(len, chains)) == locations.CHAIN_FRAMES
    assert where.chain(3) == ("model.py:2", "model.py:1") and where.chain(1) == ("model.py:1",)
