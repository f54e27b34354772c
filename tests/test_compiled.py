"""The compiled stage on the example callable target: a TPU v6e-4 topology through libtpu, and the CPU.

Real AOT compiles of a small NNX MLP train step (seconds each): memory and cost from XLA's analyses, jax's
argument paths checked against the compiled module, the cache, goldens and the memory rule, the report's
compiled view, and what the platform layer decides (libtpu's version in keys, workers sized by memory).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hlo_audit import host, platforms
from hlo_audit.attribution import arg_keys
from hlo_audit.cache import Cache, lowering_key
from hlo_audit.hlo.analysis import analyze
from hlo_audit.lowering import Unavailable
from hlo_audit.matrix import Cell
from hlo_audit.platforms.tpu import TpuPlatform, topology_devices
from hlo_audit.stages import compiled
from hlo_audit.stages.program import checked_arg_keys
from in_process import in_project
from projects import config

# Compiles for a TPU topology: needs libtpu (skipped without it). One xdist group: the project's run (~20 s of
# compiles) is made once, not once per worker.
pytestmark = [pytest.mark.tpu, pytest.mark.xdist_group("compiled")]

TARGET = "hlo_audit.examples.nnx_mlp:lower"
MATRIX = {"target": TARGET, "scan": ["on", "off"], "quant": ["dropout0"], "stage": "compiled",
          "matrix": [{"platform": "tpu", "topology": "v6e-4"}]}
CONFIG = config(**MATRIX)
TPU_CELL = "mlp/scan-off/dropout0/L2/tpu-v6e-4/compiled"
CPU_CELL = "mlp/scan-off/dropout0/L2/compiled"
MEMORY_KEYS = {"argument_bytes", "output_bytes", "alias_bytes", "temp_bytes", "generated_code_bytes"}


def hlo_audit(project: Path, *args) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}  # as a user's shell has it
    return subprocess.run([sys.executable, "-m", "hlo_audit", *args], cwd=project, capture_output=True, text=True,
                          env=env, timeout=600)


# 200 columns: no cell id wraps inside its table column.
cli = functools.partial(in_project, columns=200)


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    project = tmp_path_factory.mktemp("compiled")
    (project / "hlo-audit.toml").write_text(CONFIG)
    run = hlo_audit(project, "run", "--format", "json", "--jobs", "2")  # in worker processes, as `make audit`
    assert run.returncode == 0, run.stderr
    return project, run


def cells(run) -> dict[str, dict]:
    return {c["id"]: c for c in json.loads(run.stdout)["cells"]}


def test_tpu_cell_compiles_for_the_topology_and_records_memory_and_cost(project):
    _, run = project
    tpu, cpu = cells(run)[TPU_CELL], cells(run)[CPU_CELL]
    for cell in (tpu, cpu):
        assert (cell["status"], cell["stage"]) == ("ok", "compiled"), cell["message"]
        # The dropout0 leak in miniature survives compilation: 2 layers x (key, count) of a never-drawn stream.
        assert (cell["entry_params"], cell["by_dtype"], cell["rng_streams"]["carried"]) == (9, {"f32": 5, "u32": 4}, 2)
        assert set(cell["memory"]) == MEMORY_KEYS and cell["memory"]["argument_bytes"] > 0
        assert cell["cost"]["flops"] > 0 and cell["cost"]["bytes_accessed"] > 0
    assert (tpu["platform"], tpu["topology"]) == ("tpu", "v6e-4")
    # XLA's TPU backend reserves code space and pads to its tiles; the CPU's executable holds no generated code.
    assert tpu["memory"]["generated_code_bytes"] > 0 and tpu["memory"]["argument_bytes"] > cpu["memory"]["argument_bytes"]
    # libtpu's start-up complaints about the cloud VM it is not on never reach the user: stderr holds only the
    # log's line per finished cell (piped stderr: docs/ci.md).
    assert [line for line in run.stderr.splitlines() if not line.startswith("hlo-audit: cell ")] == []


def test_compiled_text_is_tpu_code_attributed_through_args_info(project):
    project_dir, _ = project
    cell = Cell("mlp", False, "dropout0", 2, target=TARGET, platform="tpu", device="v6e-4", stage="compiled")
    text, meta = Cache(project_dir / ".hlo-audit-cache", project=project_dir).get_lowering(lowering_key(cell))
    # The module after XLA's TPU passes: scheduled, with the TPU's tiled layouts (one chip: the example's step
    # is unsharded, so jax's default device, the topology's first chip, is what it compiles for).
    header = text.split("\n", 1)[0]
    assert "is_scheduled=true" in header and "{0:T(" in header
    assert meta["memory"]["argument_bytes"] > 0  # kept with the text: a re-analysis needs no compile
    # The executable passed the order check, so jax's paths were used; they agree with XLA's op_name metadata.
    assert meta["arg_keys"] is not None
    from_text = [p.path for p in analyze(text).params]
    assert [p.path for p in analyze(text, arg_keys=meta["arg_keys"]).params] == from_text
    assert "state.layers.0.dropout.rngs.key" in from_text


def test_second_run_is_served_from_the_cache_with_memory_and_cost(project):
    project_dir, first = project
    again = hlo_audit(project_dir, "run", "--format", "json")
    assert again.returncode == 0
    for cid, cell in cells(again).items():
        assert cell["cached"]
        assert (cell["memory"], cell["cost"]) == (cells(first)[cid]["memory"], cells(first)[cid]["cost"])


def test_golden_memory_ratchet_and_report(project, tmp_path):
    project_dir, _ = project
    # The same cells (their compiles cached), goldens of their own.
    folders = {"cache_dir": str(project_dir / ".hlo-audit-cache"), "golden_dir": str(tmp_path / "golden")}
    (tmp_path / "hlo-audit.toml").write_text(config(**MATRIX, **folders))
    assert cli(tmp_path, "golden", "update").exit_code == 0
    path = tmp_path / "golden" / f"{TPU_CELL}.json"
    record = json.loads(path.read_text())
    assert record["environment"]["libtpu"] == "0.0.52" and record["environment"]["platform"] == "tpu-v6e-4"
    assert set(record["memory"]) == MEMORY_KEYS and record["cost"]["flops"] > 0
    assert "libtpu" not in json.loads((tmp_path / "golden" / f"{CPU_CELL}.json").read_text())["environment"]
    assert cli(tmp_path, "check").exit_code == 0

    # The golden remembers a smaller temp buffer: the step now needs more than the 2% the rule allows.
    temp = record["memory"]["temp_bytes"]
    record["memory"]["temp_bytes"] = int(temp / 1.1)
    path.write_text(json.dumps(record))
    warned = cli(tmp_path, "check", "--format", "json")
    assert warned.exit_code == 0  # memory: warn by default
    finding = next(f for f in json.loads(warned.stdout)["findings"] if f["rule"] == "memory")
    assert (finding["cell"], finding["severity"]) == (TPU_CELL, "advisory")
    assert "temp_bytes" in finding["message"] and "+10.0%" in finding["message"]
    (tmp_path / "hlo-audit.toml").write_text(config(**MATRIX, **folders, policy={"memory": "fail"}))
    failed = cli(tmp_path, "check")
    assert failed.exit_code == 1 and "compiled memory grew beyond 2% of the golden" in " ".join(failed.stdout.split())
    (tmp_path / "hlo-audit.toml").write_text(config(**MATRIX, **folders, policy={"memory": "fail"},
                                                    memory_tolerance=0.2))
    assert cli(tmp_path, "check").exit_code == 0  # within a 20% tolerance

    # The report shows the compiled view with the change against the golden, in every format.
    report = cli(tmp_path, "report", "--html", str(tmp_path / "report.html"))
    assert report.exit_code == 0
    table = report.stdout[report.stdout.index("compiled: memory per device"):]
    assert TPU_CELL in " ".join(table.split()) and "+" in table
    html = (tmp_path / "report.html").read_text()
    assert f'<tr data-cell="{TPU_CELL}"' in html and f'data-temp-bytes="{temp}"' in html
    doc = json.loads(cli(tmp_path, "report", "--format", "json").stdout)
    view = next(c for c in doc["cells"] if c["id"] == TPU_CELL)
    assert view["memory_delta"]["temp_bytes"] == temp - int(temp / 1.1) and view["memory_delta"]["argument_bytes"] == 0
    assert "### Compiled: memory per device" in cli(tmp_path, "report", "--format", "markdown").stdout


def _compiled_on_topology():
    """A two-argument step compiled for v6e-4, sharded so each parameter has its own shape and sharding."""
    devices = topology_devices("v6e-4")
    mesh = jax.sharding.Mesh(np.array(devices), ("d",))
    sharded = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("d"))
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    state = {"w": jax.ShapeDtypeStruct((1024,), jnp.float32), "key": jax.eval_shape(lambda: jax.random.key(0))}
    step = jax.jit(lambda s: (s["w"] * jax.random.uniform(s["key"], (1024,))).sum(),
                   in_shardings=({"w": sharded, "key": replicated},))
    lowered = step.trace(state).lower(lowering_platforms=("tpu",))
    return lowered, lowered.compile()


def test_parameter_order_is_checked_against_the_executable(monkeypatch):
    lowered, executable = _compiled_on_topology()
    # jax's view and XLA's agree: (dtype, per-device dims, sharding) of each parameter, the key as its uint32 data.
    assert compiled.kept_argument_signatures(executable) == compiled.compiled_parameter_signatures(executable) == [
        ("uint32", (2,), "{replicated}"), ("float32", (256,), "{devices=[4]<=[4]}")]
    expected = compiled.kept_argument_signatures(executable)
    declared = compiled.compiled_parameter_signatures(executable)
    assert checked_arg_keys(arg_keys(lowered), expected, declared) == (("key",), ("w",))
    assert compiled.run(lowered).arg_keys == (("key",), ("w",))
    # An executable whose parameters came out in another order is attributed from its text, never by position.
    assert checked_arg_keys(arg_keys(lowered), expected, declared[::-1]) is None
    monkeypatch.setattr(compiled, "compiled_parameter_signatures", lambda _: declared[::-1])
    assert compiled.run(lowered).arg_keys is None


def test_platform_requirements_and_worker_sizing(monkeypatch, tmp_path):
    tpu = Cell("m", True, "none", 2, platform="tpu", device="v6e-4", stage="compiled")
    lowered = Cell("m", True, "none", 2, platform="tpu", stage="lowered")
    no_topology = Cell("m", True, "none", 2, platform="tpu", stage="compiled")
    platform = platforms.of(tpu)
    platform.check_available(tpu)
    platform.check_available(lowered)  # cross-lowering for tpu needs nothing
    with pytest.raises(Unavailable, match="needs a topology to compile for"):
        platform.check_available(no_topology)
    assert platform.toolchain(tpu) == {"libtpu": "0.0.52"} and platform.toolchain(lowered) == {}
    # A libtpu upgrade re-lowers TPU topology cells only.
    before = (lowering_key(tpu), lowering_key(lowered))
    monkeypatch.setattr(TpuPlatform, "toolchain", lambda self, cell: {"libtpu": "9.9"} if cell.device else {})
    assert lowering_key(tpu) != before[0] and lowering_key(lowered) == before[1]
    # --jobs is an upper bound; memory is the other: a compiled TPU worker needs 3 GiB, a lowering 1 GiB.
    gib = 1 << 30

    def workers(cells, memory):
        return host.workers_for([platforms.of(c).worker_bytes(c) for c in cells], jobs=4, memory=memory)

    assert workers([tpu] * 8, 7 * gib) == 2
    assert workers([lowered] * 8, 7 * gib) == 4
    assert workers([tpu, lowered], 64 * gib) == 2  # no more workers than cells
    assert workers([tpu], gib // 2) == 1  # always one
    # An unknown topology is the config's error: one line naming the file and the key.
    (tmp_path / "hlo-audit.toml").write_text(textwrap.dedent("""
        models = ["llama3-8b"]
        platform = "tpu"
        topology = ["v6e-4", "v6e-5"]
        stage = "compiled"
        """))
    result = hlo_audit(tmp_path, "list")
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert "hlo-audit.toml: topology[1]: unknown TPU topology 'v6e-5'" in result.stderr


def test_no_tpu_runtime_starts_on_a_host_without_accelerators():
    """libtpu is installed for compiling; on a CPU host jax must not start it (its library mapped in, a page of
    warnings)."""
    # Whether libtpu is mapped into the process, not its peak memory: what else jax loads at start-up (the CUDA
    # plugin, with Transformer Engine installed) moves the memory by more than libtpu's runtime does.
    code = ("import os, jax; jax.devices(); import jax.numpy as jnp; jnp.ones(3).block_until_ready();"
            "print(os.environ.get('JAX_PLATFORMS'), 'libtpu' in open('/proc/self/maps').read())")
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    quiet = subprocess.run([sys.executable, "-c", "from hlo_audit import host; host.setup_own_process();"
                            + code], capture_output=True, text=True, env=env, timeout=120)
    noisy = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert quiet.returncode == noisy.returncode == 0
    assert quiet.stdout.split() == ["cpu", "False"] and "TPU" not in quiet.stderr
    assert noisy.stdout.split()[1] == "True" and "TPU" in noisy.stderr  # what it saves: libtpu started, complained
