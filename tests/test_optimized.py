"""Stage optimized: XLA's TPU compiler run up to buffer assignment, in a child process stopped before codegen.

The oracle is XLA itself: the same ``Lowered`` compiled in full with XLA's dump on. The optimized stage must give
the ``*.after_optimizations.txt`` file that compile writes, byte for byte, and the compiled executable's memory
(argument, output, alias) and flops. Small sharded steps for the v6e-4 topology compile in seconds. MaxText's
cells are checked in tests/test_tpu_maxtext.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hlo_audit import platforms
from hlo_audit.attribution import arg_keys
from hlo_audit.hlo.analysis import analyze
from hlo_audit.lowering import Unavailable
from hlo_audit.matrix import Cell
from hlo_audit.platforms.tpu import topology_devices
from hlo_audit.stages import compiled, optimized, program
from hlo_audit.stages.program import checked_arg_keys
from in_process import hlo_audit_here

pytestmark = pytest.mark.tpu  # compiles for a TPU topology: needs libtpu (skipped without it)

V6E_CELL = Cell("m", True, "none", 2, platform="tpu", device="v6e-4", stage="optimized")


def _mesh():
    return jax.sharding.Mesh(np.array(topology_devices("v6e-4")), ("d",))


def _train_step_on_topology():
    """An MLP step (params sharded 4 ways, a PRNG key, an output aliased to its input) lowered for v6e-4."""
    mesh = _mesh()
    sharded = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(None, "d"))
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    state = {"w1": jax.ShapeDtypeStruct((256, 1024), jnp.float32), "w2": jax.ShapeDtypeStruct((1024, 256), jnp.bfloat16),
             "key": jax.eval_shape(lambda: jax.random.key(0))}
    shardings = {"w1": sharded, "w2": jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("d", None)),
                 "key": replicated}

    def step(state, x):
        def loss(params):
            noise = jax.random.uniform(state["key"], x.shape)
            return jnp.sum(jnp.tanh((x + noise) @ params["w1"]) @ params["w2"].astype(jnp.float32))

        grads = jax.grad(loss)({"w1": state["w1"], "w2": state["w2"]})
        return {"w1": state["w1"] - 0.1 * grads["w1"], "w2": state["w2"] - grads["w2"].astype(jnp.bfloat16),
                "key": jax.random.split(state["key"])[0]}

    jitted = jax.jit(step, in_shardings=(shardings, replicated), out_shardings=shardings, donate_argnums=0)
    return jitted.trace(state, jax.ShapeDtypeStruct((64, 256), jnp.float32)).lower(lowering_platforms=("tpu",))


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    """The step through the optimized stage, then compiled in full with XLA's dump."""
    lowered = _train_step_on_topology()
    result = optimized.run(lowered, V6E_CELL)
    dump = tmp_path_factory.mktemp("dump")
    executable = lowered.compile(compiler_options={"xla_dump_to": str(dump), "xla_dump_hlo_as_text": True,
                                                   "xla_dump_hlo_module_re": ".*"})
    [after] = dump.glob("*.after_optimizations.txt")
    return lowered, result, executable, after.read_text()


def test_text_is_the_after_optimizations_module_a_full_compile_dumps(both):
    _, result, executable, dumped = both
    assert result.text == dumped
    assert "num_partitions=4" in result.text.split("\n", 1)[0]
    # What codegen adds to the module (the compiled stage's text) is not there: its estimates and window configs.
    assert "window_config" in executable.as_text() and "window_config" not in result.text


def test_memory_is_the_executables_less_codegen_and_flops_are_xlas(both):
    _, result, executable, _ = both
    stats = executable.memory_analysis()
    assert result.memory["argument_bytes"] == stats.argument_size_in_bytes > 0
    assert result.memory["output_bytes"] == stats.output_size_in_bytes
    assert result.memory["alias_bytes"] == stats.alias_size_in_bytes > 0  # the donated state
    assert 0 <= stats.temp_size_in_bytes - result.memory["temp_bytes"] <= 64 << 10  # codegen's scratch
    assert "generated_code_bytes" not in result.memory  # no code was generated
    cost = executable.cost_analysis()
    assert result.cost["flops"] == cost["flops"] > 0 and result.cost["transcendentals"] == cost["transcendentals"]
    assert result.cost["bytes_accessed"] > 0


def test_argument_paths_are_checked_against_the_optimized_parameters(both, monkeypatch):
    lowered, result, executable, _ = both
    declared = compiled.compiled_parameter_signatures(executable)
    assert result.arg_keys == (("key",), ("w1",), ("w2",), ())
    assert checked_arg_keys(arg_keys(lowered), compiled.kept_argument_signatures(executable), declared) == result.arg_keys
    params = analyze(result.text, arg_keys=result.arg_keys).params
    assert [(p.path, p.dtype, p.shape.dims) for p in params] == [
        ("state.key", "u32", (2,)), ("state.w1", "f32", (256, 256)), ("state.w2", "bf16", (256, 256)),
        ("x", "f32", (64, 256))]
    # Parameters that do not match jax's kept arguments in order are attributed from the text, never by position.
    signatures = program.lowered_argument_signatures(lowered)
    parameters = [(*signature[:2], None) for signature in declared]
    assert checked_arg_keys(arg_keys(lowered), signatures, parameters) == result.arg_keys
    assert checked_arg_keys(arg_keys(lowered), signatures[::-1], parameters) is None


def test_an_xla_error_is_the_cells_error_with_xlas_message():
    """A program that does not fit a v6e chip's HBM fails in buffer assignment, as the full compile does."""
    replicated = jax.sharding.NamedSharding(_mesh(), jax.sharding.PartitionSpec())
    step = jax.jit(lambda x: (x * 2, x + 1), in_shardings=(replicated,))
    lowered = step.trace(jax.ShapeDtypeStruct((6 << 30,), jnp.float32)).lower(lowering_platforms=("tpu",))
    with pytest.raises(optimized.OptimizeError, match=r"Ran out of memory on HBM.*exceeds available HBM"):
        optimized.run(lowered, V6E_CELL)


def test_nothing_to_capture_when_jax_answers_from_its_own_cache(monkeypatch):
    lowered = _train_step_on_topology()
    monkeypatch.setattr(lowered, "compile", lambda: None)  # as jax's caches do: no backend compile happens
    with pytest.raises(optimized.OptimizeError, match="compiled nothing"):
        optimized.compile_request(lowered)


def test_stage_needs_a_tpu_topology(tmp_path):
    platforms.of(V6E_CELL).check_available(V6E_CELL)
    cpu_cell = Cell("m", True, "none", 2, stage="optimized")
    with pytest.raises(Unavailable, match="needs platform = 'tpu' and a topology"):
        platforms.of(cpu_cell).check_available(cpu_cell)
    gib = 1 << 30
    assert platforms.of(V6E_CELL).worker_bytes(V6E_CELL) >= 2 * gib  # the lowering and the child compiling it
    (tmp_path / "hlo-audit.toml").write_text(textwrap.dedent("""
        models = ["llama3-8b"]
        stage = "optimized"
        """))
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    result = subprocess.run([sys.executable, "-m", "hlo_audit", "list"], cwd=tmp_path, capture_output=True,
                            text=True, env=env, timeout=300)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "hlo-audit.toml: stage: stage 'optimized' runs XLA's TPU compiler up to codegen" in result.stderr


def test_buffer_assignment_is_read_as_xla_counts_memory():
    dump = textwrap.dedent("""\
        BufferAssignment:
        allocation 0: size 2048, page 0, thread-local:
        allocation 1: size 400, page 0, parameter 1, shape |f32[100]| at ShapeIndex {}, maybe-live-out:
        allocation 2: size 64, page 0, parameter 0, shape |s32[16]| at ShapeIndex {}:
        allocation 3: size 512, page 0, maybe-live-out:
        allocation 4: size 100000, page 0, preallocated-temp:
        allocation 5: size 80, color 2, page 0, preallocated-temp:
        allocation 6: size 32, page 0, constant:
        """)
    assert optimized.memory_from_buffer_assignment(dump) == {
        "argument_bytes": 464, "output_bytes": 912, "alias_bytes": 400, "temp_bytes": 100000}


def test_cli_run_of_an_optimized_cell(tmp_path):
    """The example target's TPU cell at stage optimized, through the CLI, in a worker process."""
    (tmp_path / "hlo-audit.toml").write_text(textwrap.dedent("""
        target = "hlo_audit.examples.nnx_mlp:lower"
        models = ["mlp"]
        scan = ["off"]
        quant = ["dropout0"]
        layers = [2]
        platform = "tpu"
        topology = "v6e-4"
        stage = "optimized"
        """))
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    run = subprocess.run([sys.executable, "-m", "hlo_audit", "run", "--format", "json", "--jobs", "2"], cwd=tmp_path,
                         capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr
    [cell] = json.loads(run.stdout)["cells"]
    assert (cell["id"], cell["status"]) == ("mlp/scan-off/dropout0/L2/tpu-v6e-4/optimized", "ok")
    assert cell["memory"]["argument_bytes"] > 0 and "generated_code_bytes" not in cell["memory"]
    assert cell["by_role"].get("weight", 0) > 0  # attributed through args_info
    # The report's memory views leave the code column blank: no code was generated.
    for fmt in ("table", "markdown"):
        report = hlo_audit_here(tmp_path, "report", "--format", fmt, "--html", "r.html", env={"COLUMNS": "200"})
        assert report.returncode == 0, report.stderr
        assert "tpu-v6e-4/optimized" in report.stdout
    html = (tmp_path / "r.html").read_text()
    assert f'data-argument-bytes="{cell["memory"]["argument_bytes"]}"' in html
