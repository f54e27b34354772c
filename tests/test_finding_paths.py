"""Every finding names the state paths it is about (issue 26 item 2), on real lowerings of a small NNX model whose
code changes between the golden and the check: a dtype that moved (``entry parameters golden 7 -> now 7: bf16 +4, f32 -4``
says which), a role that moved, a pattern that grew, RNG state that scales with depth, never-drawn streams and a
changed text, each naming its path pattern (layer indices folded to ``*``) in its message and its JSON details.

Counter increments, launches and their scaling name what they read where they are tested (test_findings.py,
test_gpu_cells.py); memory is not attributable to a path (a compiled program's bytes by kind).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from projects import config

# MODE: plain (the golden), bf16 (the linear layer's parameters in bf16), stat (the scale a BatchStat, not a Param),
# leak (a never-drawn Dropout(0.0) per layer: seed 000's RNG state).
TARGET = '''
import jax
import jax.numpy as jnp
from flax import nnx

from hlo_audit.examples.nnx_mlp import make_step

MODE = "{mode}"


class Block(nnx.Module):
    def __init__(self, rngs):
        dtype = jnp.bfloat16 if MODE == "bf16" else jnp.float32
        self.linear = nnx.Linear(8, 8, param_dtype=dtype, rngs=rngs)
        self.scale = (nnx.BatchStat if MODE == "stat" else nnx.Param)(jnp.ones((8,)))
        if MODE == "leak":
            self.dropout = nnx.Dropout(0.0, rngs=rngs)

    def __call__(self, x):
        x = nnx.relu(self.linear(x)) * self.scale[...]
        return self.dropout(x) if MODE == "leak" else x


class Model(nnx.Module):
    def __init__(self, layers, rngs):
        self.layers = nnx.List([Block(rngs) for _ in range(layers)])

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def lower(cell):
    model = nnx.eval_shape(lambda: Model(cell.layers, nnx.Rngs(0, dropout=1)))
    graphdef, state = nnx.split(model)
    return jax.jit(make_step(graphdef)).trace(state, jax.ShapeDtypeStruct((1, 8), jnp.float32))
'''

CONFIG = config(target="path_target:lower", models=["m"], scan=["off"], layers=[2, 3])
L2 = "m/scan-off/none/L2"


@pytest.fixture(scope="module")
def golden(tmp_path_factory) -> Path:
    """The project with goldens of the plain model."""
    project = tmp_path_factory.mktemp("paths")
    (project / "hlo-audit.toml").write_text(CONFIG)
    assert run(project, "plain", "golden", "update").returncode == 0
    return project


def run(project: Path, mode: str, *args: str) -> subprocess.CompletedProcess:
    """``hlo-audit ARGS`` with the target at ``mode``, in a process of its own: the project's target module is the
    subject, imported fresh as a user's next run imports it."""
    (project / "path_target.py").write_text(TARGET.format(mode=mode))
    return subprocess.run([sys.executable, "-m", "hlo_audit", *args], cwd=project, capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "200"}, timeout=600)


def findings(project: Path, mode: str) -> dict[tuple[str, str], dict]:
    result = run(project, mode, "check", "--format", "json")
    assert result.returncode == 1, result.stderr[-2000:]
    return {(f["cell"], f["rule"]): f for f in json.loads(result.stdout)["findings"]}


def test_a_dtype_change_names_the_patterns_it_retyped(golden):
    found = findings(golden, "bf16")
    count = found[L2, "count"]
    # The counts alone say bf16 +4, f32 -4; the finding says which parameters.
    assert "entry parameters golden 7 -> now 7: bf16 +4, f32 -4" in count["message"], count["message"]
    assert ("retyped: state.layers.*.linear.bias (bf16 +2, f32 -2), state.layers.*.linear.kernel (bf16 +2, f32 -2)"
            in count["message"]), count["message"]
    assert count["details"]["patterns"]["retyped"] == [
        {"pattern": f"state.layers.*.linear.{name}", "dtypes": {"bf16": 2, "f32": -2}, "roles": {}}
        for name in ("bias", "kernel")]
    text = found[L2, "hlo_text"]
    assert "+2 state.layers.*.linear.kernel (bf16 weight)" in text["message"], text["message"]
    assert {"pattern": "state.layers.*.linear.kernel", "dtype": "f32", "role": "weight", "delta": -2} in \
        text["details"]["params"]


def test_a_role_change_names_the_pattern(golden):
    count = findings(golden, "stat")[L2, "count"]
    assert "(batch_stat +2, weight -2)" in count["message"], count["message"]
    assert "retyped: state.layers.*.scale (batch_stat +2, weight -2)" in count["message"], count["message"]
    assert count["details"]["patterns"]["retyped"] == [
        {"pattern": "state.layers.*.scale", "dtypes": {}, "roles": {"batch_stat": 2, "weight": -2}}]


def test_rng_state_names_its_pattern_in_every_finding(golden):
    found = findings(golden, "leak")
    pattern = "state.layers.*.dropout.rngs.*"
    count = found[L2, "count"]
    assert f"grown: +4 {pattern} (rng_count +2, rng_key +2)" in count["message"], count["message"]
    scaling = found[L2, "rng_scaling"]
    assert scaling["message"].endswith(f"depths 2, 3): per layer {pattern} +2"), scaling["message"]
    assert scaling["details"]["patterns"] == {pattern: 2}
    assert "(largest: layers.*.dropout.rngs x2)" in found[L2, "dead_rng"]["message"]  # the streams' own pattern
    text = found[L2, "hlo_text"]
    assert f"{pattern} (u32 rng_key)" in text["message"], text["message"]
