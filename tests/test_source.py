"""Reading input: dump folders from every backend, and only regular files, '-' and folders.

Dump folders are real ones, made here: the test model's train step run on the CPU (conftest's ``dump_folder``),
compiled by XLA's GPU compiler for an H100 without a GPU (a deviceless topology from jax's CUDA plugin), and
compiled by libtpu for a v6e-4 topology. ``count/diff/rng DIR --stage before|after`` must pick the step at each
stage and count what XLA's own parser counts in that file.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import nnx_models
from hlo_audit.hlo.source import dump_entries, pick_dump_module, read_input
from hlo_audit.hlo.text import HloParseError, read_text
from nnx_models import ModelSpec
from xla_oracle import xla_counts

ROOT = Path(__file__).resolve().parents[1]
CLI = Path(sys.executable).with_name("hlo-audit")
# XLA's GPU target config for an H100 SXM, the fields a deviceless compile needs, with the figures of XLA's own spec
# (xla/backends/gpu/target_config/specs/h100_sxm.txtpb).
H100_TARGET_CONFIG = """\
gpu_device_info {
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: 233472
  threads_per_core_limit: 2048
  core_count: 132
  fpus_per_core: 128
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: 3352320000000
  l2_cache_size: 52428800
  clock_rate_ghz: 1.98
  device_memory_size: 84929347584
  shared_memory_per_block_optin: 232448
  cuda_compute_capability {
    major: 9
  }
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}
platform_name: "CUDA"
dnn_version_info {
  major: 9
  minor: 7
}
runtime_version {
  major: 12
  minor: 8
  patch: 0
}
device_description_str: "NVIDIA H100 80GB HBM3"
"""
TINY = "HloModule {name}\nENTRY e {{\n  p = f32[4] parameter(0)\n  ROOT n = f32[4] negate(p)\n}}\n"

# Compile the test model's train step for another backend in a fresh process, dumping its modules.
_CHILD = """
import os, sys
backend, dump, tests, target = sys.argv[1:5]
os.environ["XLA_FLAGS"] = f"--xla_dump_to={dump}"
os.environ["JAX_PLATFORMS"] = "cpu"  # the CUDA plugin skips its device check, and still registers
sys.path.insert(0, tests)
from hlo_audit import host
host.compile_only_libtpu()
import jax, numpy as np
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import nnx_models
if backend == "gpu":
    from jax.experimental import topologies
    devices = topologies.get_topology_desc(platform="cuda", target_config=open(target).read(),
                                           topology="1x1x1").devices
else:
    from hlo_audit.platforms.tpu import topology_devices
    devices = topology_devices("v6e-4")
replicated = NamedSharding(Mesh(np.array(devices[:1]), ("x",)), P())
spec = nnx_models.ModelSpec(dropout_rate=0.5)
graphdef, state = nnx.split(nnx.eval_shape(lambda: nnx_models.build(spec)))
state = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=replicated), state)
x = jax.ShapeDtypeStruct((nnx_models.BATCH, spec.width), jnp.float32, sharding=replicated)
jax.jit(nnx_models.make_step(graphdef), donate_argnums=0).lower(state, x).compile()
"""


def hlo_audit(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([str(CLI), *args], capture_output=True, text=True, timeout=timeout, env=env, check=False)


def _backend_dump(backend: str, folder: Path) -> Path:
    target = folder.parent / f"{folder.name}-target.txtpb"
    target.write_text(H100_TARGET_CONFIG)
    proc = subprocess.run([sys.executable, "-c", _CHILD, backend, str(folder), str(Path(__file__).parent),
                           str(target)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{backend} compile failed:\n{proc.stderr[-3000:]}")
    return folder


@pytest.fixture(scope="module")
def gpu_dump(tmp_path_factory):
    # find_spec of a submodule raises when its package is missing: ask for the package first.
    if importlib.util.find_spec("jax_plugins") is None or importlib.util.find_spec("jax_plugins.xla_cuda12") is None:
        pytest.skip("jax's CUDA plugin (jax-cuda12-plugin) is not installed: no deviceless GPU compile")
    return _backend_dump("gpu", tmp_path_factory.mktemp("gpu-dump"))


@pytest.fixture(scope="module")
def tpu_dump(tmp_path_factory):
    if importlib.util.find_spec("libtpu") is None:
        pytest.skip("libtpu is not installed (the tpu extra): no TPU compile")
    return _backend_dump("tpu", tmp_path_factory.mktemp("tpu-dump"))


@pytest.fixture(params=["cpu", "gpu", "tpu"])
def backend_dump(request):
    return request.param, request.getfixturevalue({"cpu": "dump_folder", "gpu": "gpu_dump",
                                                   "tpu": "tpu_dump"}[request.param])


# -- dump folders ----------------------------------------------------------------------------------------------


def test_file_names_of_every_backend_and_stage(tmp_path):
    """XLA's FilenameFor: [<timestamp>.]module_<id>[.<name>].<suffix>.txt, the backend's word before the stage."""
    named = {
        "module_0003.jit_step.before_optimizations.txt": ("jit_step", "before"),
        "module_0003.jit_step.cpu_after_optimizations.txt": ("jit_step", "after"),
        "module_0001.jit_f.sm_9.0a_gpu_after_optimizations.txt": ("jit_f", "after"),
        "module_0002.jit_g.sm_8.0_gpu_after_optimizations.txt": ("jit_g", "after"),
        "module_0004.jit_h.sm_10.0a_gpu_after_optimizations.txt": ("jit_h", "after"),
        "module_0000.jit_t.cl_1014260217.before_optimizations.txt": ("jit_t", "before"),
        "module_0000.jit_t.cl_1014260217.after_optimizations.txt": ("jit_t", "after"),
        "1700000000123456.module_0005.jit_ts.before_optimizations.txt": ("jit_ts", "before"),
        "module_0006.before_optimizations.txt": ("unnamed_in_file_name", "before"),  # a name too long to print
    }
    others = [  # the same stems, other files
        "module_0001.jit_f.sm_9.0a_gpu_after_optimizations-buffer-assignment.txt",
        "module_0001.jit_f.sm_9.0a_gpu_after_optimizations-memory-usage-report.txt",
        "module_0000.jit_t.cl_1014260217.after_optimizations_after_buffer_assignment.txt",
        "module_0000.jit_t.cl_1014260217.after_optimizations_before_buffer_assignment.txt",
        "module_0001.jit_f.after_spmd_partitioner.txt", "module_0001.jit_f.before_config_assignment.txt",
        "module_0001.jit_f.0001.pipeline.after_pass-a.before_pass-b.txt", "module_0001.jit_f.thunk_sequence.txt",
        "module_0001.jit_f.before_optimizations.txt.gz", "notes.before_optimizations.txt",
    ]
    for file_name, (name, _) in named.items():
        (tmp_path / file_name).write_text(TINY.format(name=name))
    for file_name in others:
        (tmp_path / file_name).write_text(TINY.format(name="other"))
    (tmp_path / "module_0009.jit_dir.before_optimizations.txt").mkdir()  # not a file
    found = {e.path.name: (e.module_name, e.stage) for e in dump_entries(tmp_path)}
    assert found == named
    assert pick_dump_module(tmp_path, "jit_f", "after").name == "module_0001.jit_f.sm_9.0a_gpu_after_optimizations.txt"
    assert pick_dump_module(tmp_path, "^jit_t$", "before").name.endswith("cl_1014260217.before_optimizations.txt")


def test_module_name_from_the_file_name_when_the_text_has_no_header(tmp_path):
    for file_name in ("module_0001.jit_f.sm_9.0a_gpu_after_optimizations.txt",
                      "module_0002.jit_t.cl_77.after_optimizations.txt", "module_0003.jit_c.cpu_after_optimizations.txt"):
        (tmp_path / file_name).write_text("ENTRY e {\n  ROOT p = f32[] parameter(0)\n}\n")
    assert sorted(e.module_name for e in dump_entries(tmp_path)) == ["jit_c", "jit_f", "jit_t"]


@pytest.mark.parametrize("stage", ["before", "after"])
@pytest.mark.xdist_group("source_dumps")  # each backend's dump is compiled once, not once per worker
def test_dump_folder_of_each_backend_counts_as_xla_does(backend_dump, stage):
    _, folder = backend_dump
    chosen = pick_dump_module(folder, stage=stage)
    assert chosen.name.startswith("module_") and ".jit_train_step." in chosen.name
    expected = xla_counts(chosen.read_text())
    proc = hlo_audit("count", str(folder), "--stage", stage, "--format", "json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    module = json.loads(proc.stdout)["modules"][0]
    assert module["source"] == str(chosen)
    assert (module["entry_params"], module["by_dtype"]) == (expected["entry_params"], expected["by_dtype"])
    assert module["entry_params"] == nnx_models.expected_counts(ModelSpec(dropout_rate=0.5))["total"]
    assert module["by_dtype"]["u32"] > 0  # the RNG streams are there at every stage, on every backend
    same = hlo_audit("diff", str(folder), str(folder), "--stage", stage)
    assert same.returncode == 0 and "Traceback" not in same.stderr, (same.stdout, same.stderr[-2000:])
    # The model holds Rngs it never draws from (rngs.params, rngs.dropout): carried streams, so `rng` exits 1.
    streams = hlo_audit("rng", str(folder), "--stage", stage)
    assert streams.returncode == 1 and streams.stderr == "", (streams.stdout, streams.stderr[-2000:])
    assert "RNG streams" in streams.stdout and "carried" in streams.stdout, streams.stdout


# -- only regular files, '-' and dump folders ------------------------------------------------------------------


@pytest.fixture
def special_files(tmp_path):
    fifo = tmp_path / "pipe.hlo"
    os.mkfifo(fifo)
    sock_path = tmp_path / "sock.hlo"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(sock_path))
    (tmp_path / "to_fifo.hlo").symlink_to(fifo)
    (tmp_path / "to_zero.hlo").symlink_to("/dev/zero")
    yield {"a FIFO (named pipe)": fifo, "a socket": sock_path, "a character device": Path("/dev/zero"),
           "a FIFO (named pipe) ": tmp_path / "to_fifo.hlo", "a character device ": tmp_path / "to_zero.hlo"}
    sock.close()


def test_special_files_are_refused_before_reading(special_files):
    """A FIFO with no writer would block a read forever, /dev/zero would fill memory: refused on their type."""
    for kind, path in special_files.items():
        result: list = []
        reader = threading.Thread(target=lambda p=path, out=result: out.append(_error_of(read_input, str(p))),
                                  daemon=True)
        reader.start()
        reader.join(timeout=30)
        assert not reader.is_alive(), f"reading {path} blocked"
        assert result == [(f"{path}: is {kind.strip()}, not an HLO file: hlo-audit reads regular files, '-' "
                           "(standard input) and dump folders")]


def test_count_refuses_a_fifo_and_dev_zero_in_one_line(special_files):
    for path in (special_files["a FIFO (named pipe)"], special_files["a character device"]):
        proc = hlo_audit("count", str(path), timeout=60)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        assert proc.stderr.strip().count("\n") == 0 and f"{path}: is a" in proc.stderr


def test_binary_check_reads_only_the_head(tmp_path):
    """A 64 GiB sparse file that starts with a NUL byte: refused as binary under a 1 GiB address-space limit, so
    the check never reads the file whole (the old read_bytes() raised MemoryError)."""
    big = tmp_path / "big.hlo"
    with open(big, "wb") as f:
        f.write(b"\x00HloModule")
        f.truncate(64 << 30)
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30));"
            "from hlo_audit.hlo.text import read_text, HloParseError\n"
            "try:\n    read_text(sys.argv[1])\nexcept HloParseError as e:\n    print(e)")
    proc = subprocess.run([sys.executable, "-c", code, str(big)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False)
    assert proc.stdout.strip() == f"{big}: binary data, not HLO text", proc.stderr[-2000:]


def test_a_file_too_large_for_memory_is_one_line(tmp_path):
    big = tmp_path / "big.hlo"
    with open(big, "wb") as f:
        f.write(b"HloModule m\n" + b" " * 8192)  # text as far as the binary check looks, then 8 GiB of holes
        f.truncate(8 << 30)
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30));"
            "from hlo_audit.hlo.text import read_text, HloParseError\n"
            "try:\n    read_text(sys.argv[1])\nexcept HloParseError as e:\n    print(e)")
    proc = subprocess.run([sys.executable, "-c", code, str(big)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False)
    assert proc.stdout.strip() == f"{big}: too large to read into memory (8,589,934,592 bytes)", proc.stderr[-2000:]


@pytest.mark.parametrize("make,message", [
    (lambda p: p.mkdir(), "is a directory, not an HLO file"),
    (lambda p: None, "no such file"),
    (lambda p: p.write_bytes(b"HloModule m\n\xff\xfe"), "not UTF-8 text (byte 12)"),
    (lambda p: p.write_bytes(b"\x7fELF\x02\x01\x01\x00"), "binary data, not HLO text"),
])
def test_unreadable_paths_are_one_line(tmp_path, make, message):
    path = tmp_path / "input.hlo"
    make(path)
    assert _error_of(read_text, str(path)) == f"{path}: {message}"


def test_standard_input_is_read(tmp_path):
    proc = subprocess.run([str(CLI), "count", "-", "--format", "json"], input=TINY.format(name="stdin_module"),
                          capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          check=False)
    assert proc.returncode == 0 and json.loads(proc.stdout)["modules"][0]["entry_params"] == 1


def test_standard_input_of_zeros_is_refused_at_once():
    """``count - < /dev/zero``: the first 4 KiB say binary; nothing more is read (it would never end)."""
    with open("/dev/zero", "rb") as zeros:
        proc = subprocess.run([str(CLI), "count", "-"], stdin=zeros, capture_output=True, text=True, timeout=60,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False)
    assert proc.returncode == 2 and proc.stderr.strip() == "hlo-audit: error: <stdin>: binary data, not HLO text"


def _error_of(read, spec: str) -> str | None:
    try:
        read(spec)
    except HloParseError as exc:
        return str(exc)
    return None
