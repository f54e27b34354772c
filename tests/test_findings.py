"""What `check`'s findings say, on real lowerings of a small NNX model whose code changes between the golden and
the check: a fix is an RNG-only improvement to accept and its waiver goes stale; a rename is named as one; dead
RNG counter increments with no new parameter fail the count ratchet."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from projects import config

# One model, four versions of its code (MODE): a per-layer Dropout(0.0) (dead RNG state, 2 u32 a layer), the same
# under another attribute name, none, and a shared stream whose counter each layer advances without drawing
# (seed 000's dead counter kernels, with no parameter added).
TARGET = '''
import jax
import jax.numpy as jnp
from flax import nnx

from hlo_audit.examples.nnx_mlp import make_step

MODE = "{mode}"


class Block(nnx.Module):
    def __init__(self, rngs, shared):
        self.linear = nnx.Linear(8, 8, rngs=rngs)
        if MODE == "leak":
            self.dropout = nnx.Dropout(0.0, rngs=rngs)
        if MODE == "renamed":
            self.drop = nnx.Dropout(0.0, rngs=rngs)
        self.rngs = shared

    def __call__(self, x):
        if MODE == "leak":
            x = self.dropout(x)
        if MODE == "renamed":
            x = self.drop(x)
        if MODE == "counters":
            self.rngs.noise()  # advances the shared counter; the key it makes is never used
        if MODE == "draws":
            x = x + 0.01 * jax.random.uniform(self.rngs.noise(), x.shape)  # the shared stream, drawn
        return nnx.relu(self.linear(x))


class Model(nnx.Module):
    def __init__(self, layers, rngs):
        self.rngs = nnx.Rngs(noise=1)
        self.layers = nnx.List([Block(rngs, self.rngs) for _ in range(layers)])

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def lower(cell):
    model = nnx.eval_shape(lambda: Model(cell.layers, nnx.Rngs(0, dropout=1)))
    graphdef, state = nnx.split(model)
    return jax.jit(make_step(graphdef), donate_argnums=0).trace(state, jax.ShapeDtypeStruct((1, 8), jnp.float32))
'''

CONFIG = config(target="target:lower", models=["m"], scan=["off"], layers=[2, 3], waive=[
    {"rule": "rng_scaling", "model": "m", "reason": "the per-layer dropout leak, until it is fixed"}])


def hlo_audit(project: Path, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hlo_audit", *args], cwd=project, capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "200"}, timeout=600)


def at(project: Path, mode: str) -> None:
    (project / "target.py").write_text(TARGET.format(mode=mode))


def golden_then_check(project: Path, before: str, after: str) -> tuple[int, list[dict]]:
    (project / "hlo-audit.toml").write_text(CONFIG)
    at(project, before)
    update = hlo_audit(project, "golden", "update")
    assert update.returncode == 0, update.stderr
    at(project, after)
    result = hlo_audit(project, "check", "--format", "json")
    assert result.returncode in (0, 1), result.stderr
    return result.returncode, json.loads(result.stdout)["findings"]


def only(findings: list[dict], cell: str, rule: str) -> dict:
    [finding] = [f for f in findings if f["cell"] == cell and f["rule"] == rule]
    return finding


L2 = "m/scan-off/none/L2"


def test_a_fix_is_an_rng_only_improvement_to_accept_and_its_waiver_goes_stale(tmp_path):
    exit_code, findings = golden_then_check(tmp_path, "leak", "plain")
    assert exit_code == 0
    text = only(findings, L2, "hlo_text")
    assert text["severity"] == "improvement"
    assert text["details"]["verdict"] == "rng-state-only" and text["details"]["rng_params"] == -4
    assert "by RNG state only (4 fewer RNG parameters; rng-state-only); entry parameters -2 " \
           "state.layers.*.dropout.rngs.* (u32 rng_count), -2 state.layers.*.dropout.rngs.* (u32 rng_key); accept it: " \
           f"hlo-audit golden update --only id={L2},id=m/scan-off/none/L3" in text["message"], text["message"]
    count = only(findings, L2, "count")
    assert count["severity"] == "improvement"
    assert count["details"]["patterns"]["shrunk"] == [
        {"pattern": "state.layers.*.dropout.rngs.*", "delta": -4, "roles": {"rng_count": -2, "rng_key": -2}}]
    assert count["details"]["slopes"] == {"params_per_layer": [4, 2], "rng_per_layer": [2, 0]}
    assert "RNG parameters per layer golden +2 -> now +0" in count["message"]
    stale = only(findings, "hlo-audit.toml: waive[0]", "stale_waiver")
    assert stale["severity"] == "advisory" and "covers 2 cells" in stale["message"]


def test_the_waiver_is_used_while_the_leak_is_there(tmp_path):
    exit_code, findings = golden_then_check(tmp_path, "leak", "leak")
    assert exit_code == 0
    assert only(findings, L2, "rng_scaling")["severity"] == "waived"
    assert not [f for f in findings if f["rule"] == "stale_waiver"]


def test_a_renamed_pattern_is_named_as_a_rename(tmp_path):
    exit_code, findings = golden_then_check(tmp_path, "leak", "renamed")
    count = only(findings, L2, "count")
    assert count["severity"] == "advisory"  # nothing grew or shrank: the golden should record the new name
    assert count["details"]["patterns"]["renamed"] == [
        {"from": "state.layers.*.dropout.rngs.*", "to": "state.layers.*.drop.rngs.*", "params": 4,
         "roles": {"rng_count": 2, "rng_key": 2}}]
    assert "renamed: state.layers.*.dropout.rngs.* -> state.layers.*.drop.rngs.* (4 params)" in count["message"]
    assert only(findings, L2, "hlo_text")["severity"] == "regression" and exit_code == 1


def test_dead_counter_increments_alone_fail_the_count_ratchet(tmp_path):
    exit_code, findings = golden_then_check(tmp_path, "plain", "counters")
    assert exit_code == 1
    count = only(findings, L2, "count")
    assert count["severity"] == "regression"
    assert count["details"]["entry_params"] == {"golden": 7, "now": 7}  # no parameter was added
    increments = count["details"]["rng_increments"]
    assert (increments["golden"], increments["now"], increments["by_verdict"]) == (0, 2, {"carried": 2})
    # Streams by their pattern (`hlo-audit rng`'s), each with the paths of its streams.
    assert increments["paths"] == {"layers.*.rngs.noise": ["state.layers.0.rngs.noise"]}
    assert "RNG counter increments per step golden 0 -> now 2 (carried +2) in layers.*.rngs.noise +2 " \
           "(state.layers.0.rngs.noise)" in count["message"]
    assert only(findings, "m/scan-off/none/L3", "count")["details"]["rng_increments"]["now"] == 3


def test_a_drawn_streams_increments_are_reported_and_the_text_rule_judges_the_change(tmp_path):
    """Increments of a stream the step draws from move with its draws (seed 001: one shared stream, advanced per
    draw): the count finding names them without failing on them; the new draws are a program change, and
    the text rule fails it."""
    exit_code, findings = golden_then_check(tmp_path, "plain", "draws")
    assert exit_code == 1
    count = only(findings, L2, "count")
    increments = count["details"]["rng_increments"]
    assert (increments["golden"], increments["now"], increments["by_verdict"]) == (0, 2, {"drawn": 2})
    assert count["severity"] == "advisory" and "(drawn +2)" in count["message"]
    text = only(findings, L2, "hlo_text")
    assert text["severity"] == "regression" and text["details"]["verdict"] == "changed"


def test_a_built_in_waiver_is_stale_only_on_cells_it_covers():
    """A default waiver (MaxText's known leaks, not in the user's config) that covers judged cells and waived
    nothing is stale like any other; one whose cells this config's matrix leaves out is not reported at all,
    while a waiver the user wrote that matches no cell is."""
    from hlo_audit.hlo.params import ParamSummary
    from hlo_audit.judging.gate import stale_waivers
    from hlo_audit.matrix import Cell
    from hlo_audit.policy import Policy, Waiver
    from hlo_audit.report.words import message
    from hlo_audit.results import LoweredCell

    matrix = [Cell("m", False, "none", 2), Cell("m", False, "none", 4)]
    judged = [LoweredCell(cell=c, summary=ParamSummary(entry_params=0, by_dtype={}, by_role={}, groups={}, bytes_by_role={})) for c in matrix]
    covering = Waiver("rng_scaling", "known leak", {"model": "m"}, index=0, source="built-in default waive[0]",
                      built_in=True)
    elsewhere = Waiver("rng_scaling", "known leak", {"model": "other"}, index=1, source="built-in default waive[1]",
                       built_in=True)
    written = Waiver("rng_scaling", "typo", {"model": "other"}, index=2, source="hlo-audit.toml: waive[2]")
    policy = Policy({}, (covering, elsewhere, written))
    by_source = {f.cell: f for f in stale_waivers(policy, set(), judged, matrix)}
    assert set(by_source) == {"built-in default waive[0]", "hlo-audit.toml: waive[2]"}
    assert "covers 2 cells, none of which has a rng_scaling finding" in message(by_source["built-in default waive[0]"])
    assert "matches no cell of the matrix" in message(by_source["hlo-audit.toml: waive[2]"])
    # once it waived something, it is in use
    assert {f.cell for f in stale_waivers(policy, {0}, judged, matrix)} == {"hlo-audit.toml: waive[2]"}
    # Not every covered cell judged (a shard, an unavailable cell): nobody can tell yet.
    assert {f.cell for f in stale_waivers(policy, set(), judged[:1], matrix)} == {"hlo-audit.toml: waive[2]"}
