"""Platform ``cuda``: named GPUs that XLA's GPU compiler compiles for on any host, and declared architectures.

A cell's CUDA device is one of two kinds:

* **A named GPU** (``gpu = "h100"``, ``"h200"``, ``"b200"``, ``"gb200"``, ``"gb300"``, ``"a100"``; or a user's own
  ``gpu_target = "path.txtpb"``), with a count (``gpus = 8``) or a topology (``topology = "1x8x1"``). The name is a
  ``GpuTargetConfig`` text proto (``platforms/gpus/<name>.txtpb``, each figure's source in ``gpus/SOURCES.md``):
  the device facts XLA's GPU compiler reads (compute capability, SMs, memory, bandwidth, caches, clocks, cuDNN and
  runtime versions). jax's CUDA plugin gives compile-only devices for it and a topology
  (``jax.experimental.topologies.get_topology_desc``), so the cell's step is lowered for those devices and stages
  optimized and compiled run XLA's whole GPU pipeline on a CPU host, as a TPU topology's do: nothing runs. The
  configuration's compute capability is the architecture Transformer Engine is told (``architecture``): an H100
  is sm_90, a B200 sm_100. The config's content is part of the cell's cache key and golden environment
  (``toolchain``): a changed user file re-lowers, and a golden says which device facts made it.
* **A declared architecture** (``cuda_arch = "sm_90"``): no device, only the compute capability TE is told while
  it traces; the step is cross-lowered from the host's CPU devices (stage lowered only). The default matrix's TE
  cells and their goldens are these.

Device names (``Cell.device``) and how a cell id shows them (``cuda-<label>``):

======================  ======================  =================================================================
device                  label                   meaning
======================  ======================  =================================================================
``sm_90``               ``sm_90``               architecture only
``h100``                ``h100``                one H100 (topology 1x1x1)
``8xh100``              ``8xh100``              eight H100s on one host (topology 1x1x8, as in a DGX H100)
``h100@1x8x1``          ``h100@1x8x1``          any other topology: <partitions>x<hosts>x<GPUs per host>
``/abs/dir/mine.txtpb`` ``mine``                a user's own target config (``8x/abs/dir/mine.txtpb``: ``8xmine``)
======================  ======================  =================================================================

The plugin registers compile-only devices only if jax starts it without a GPU check: on a host without a GPU,
``JAX_PLATFORMS=cpu`` before jax starts (otherwise its version check calls ``cuInit``, which fails with error 303,
and the platform is missing: "topology not implemented for cuda"). hlo-audit's own processes set it on hosts
without accelerators (``host.setup_own_process``).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

from hlo_audit import host
from hlo_audit.lowering import CellConfigError, Unavailable, one_line
from hlo_audit.platforms.base import LOWERING_WORKER_BYTES, Cell, DumpFiles, HostPlatform

GPU_CONFIG_DIR = Path(__file__).resolve().parent / "gpus"
CONFIG_SUFFIX = ".txtpb"
_ARCH = re.compile(r"^sm_(\d{2,3})[a-z]?$")  # sm_90, sm_90a, sm_100
_TOPOLOGY = re.compile(r"^(\d+)x(\d+)x(\d+)$")  # <partitions>x<hosts per partition>x<devices per host>
# `8xh100`, `h100@1x8x1`, `8x/abs/dir/mine.txtpb`: the count (one host) or the topology around the GPU's name.
_GPU_DEVICE = re.compile(r"^(?:(?P<count>\d+)x)?(?P<gpu>[^@]+?)(?:@(?P<topology>[^@]+))?$")
_NAME = re.compile(r"^[a-z][a-z0-9_-]*$")  # a shipped GPU's name, and what a user file's stem may be in a cell id
_CAPABILITY = re.compile(r"cuda_compute_capability\s*\{(?P<body>[^}]*)\}")
# MaxText's only GPU system (maxtext.utils.accelerator_to_spec_map): a3, eight GPUs a host; its compile_topology
# sizes the global batch by it, which a mesh over compile-only GPUs needs (the host's own jax.devices() is a CPU).
_MAXTEXT_GPU_SYSTEM, _MAXTEXT_GPUS_PER_HOST = "a3", 8

# Peak RSS of one worker, measured on the 2-core CPU machine for MaxText llama3-8b at 2 layers (scripts/bench_gpu.py
# prints them): a full deviceless GPU compile holds 1.3-1.4 GiB unquantized, 1.5 GiB te_fp8_currentscaling, 1.9 GiB
# te_nvfp4_no_rht on a B200; stage optimized holds its lowering (1.0 GiB) while its XLA child (another 1.0-1.5 GiB)
# runs. Deeper cells hold more. Rounded up, with room for them.
_COMPILED_WORKER_BYTES = 3 << 30
_OPTIMIZED_WORKER_BYTES = 4 << 30

# What XLA's GPU compiler writes of a module, by the names its dump files end with (``module_0001.jit_step.`` then
# ``sm_9.0a_gpu_after_optimizations.txt``...): once buffer assignment is done, the module after optimizations, its
# buffer assignment, the live ranges and the memory-usage report, concurrently (the report can exist before the
# module is written: stage optimized waits for it, then for both files to be complete); the thunk sequence and its
# metadata only after LLVM and ptxas (stage compiled keeps them: what one step launches, ``hlo/launches.py``).
GPU_DUMP = DumpFiles(module="gpu_after_optimizations.txt",
                     buffer_assignment="gpu_after_optimizations-buffer-assignment.txt",
                     buffer_assignment_done="gpu_after_optimizations-memory-usage-report.txt",
                     kept={"thunk_sequence": ".thunk_sequence.txt", "thunk_metadata": ".thunk_metadata.txt"})


class GpuTargetError(CellConfigError):
    """XLA rejected a GPU target config or topology (an unknown field, a bad value); its message, on one line."""


class CudaPlatform(HostPlatform):
    device_key = "cuda_arch"
    device_word = "CUDA device"
    config_keys = ("cuda_arch", "gpu", "gpu_target", "gpus", "topology")
    record_keys = ("gpu", "cuda_arch")
    key_words = {"cuda_arch": "CUDA architecture", "gpu": "named GPU", "gpus": "GPU count",
                 "gpu_target": "GPU target config", "topology": "GPU topology"}

    def __init__(self):
        super().__init__("cuda")

    # -- naming ----------------------------------------------------------------------------------------------

    def device_problem(self, device: str) -> str | None:
        if _ARCH.match(device):
            return None
        try:
            gpu_device(device)
        except ValueError as error:
            return str(error)
        return None

    def config_devices(self, given: dict, bad, base: Path) -> tuple[str, ...]:
        """``cuda_arch``, or GPUs (``gpu`` names, ``gpu_target`` files relative to the config) times a count
        (``gpus``) or topologies (``topology``): one device per combination."""
        if "cuda_arch" in given:
            for key in ("gpu", "gpu_target", "gpus", "topology"):
                if key in given:
                    bad(key, "a named GPU implies its architecture: set gpu (or gpu_target) or cuda_arch, not both")
            return self._listed(given, "cuda_arch", str, bad, self._arch_problem)
        written = self._listed(given, "gpu_target", str, bad, lambda path: None)
        files = [str((base / path).resolve()) for path in written]
        for i, (path, shown) in enumerate(zip(files, written)):
            problem = _file_problem(path, shown)
            if not problem and Path(path).stem in shipped_gpus():
                problem = (f"{shown!r} would show as the shipped GPU {Path(path).stem!r} in cell ids (a file's name is "
                           f"its GPU's): name it otherwise, e.g. my_{Path(path).stem}{CONFIG_SUFFIX}")
            if problem:
                bad(f"gpu_target[{i}]", problem)
        gpus = [*self._listed(given, "gpu", str, bad, _shipped_problem), *files]
        if not gpus:
            key = next(iter(given))
            bad(key, f"{key} needs a GPU to go with it: gpu = 'h100' (shipped: {', '.join(shipped_gpus())}) "
                     "or gpu_target = 'path.txtpb'")
        if "gpus" in given and "topology" in given:
            bad("topology", "set gpus (that many GPUs on one host) or topology, not both")
        topologies = [f"1x1x{n}" for n in self._listed(given, "gpus", int, bad, _count_problem)] or \
            self._listed(given, "topology", str, bad, _topology_problem) or ["1x1x1"]
        devices = tuple(device_name(gpu, topology) for gpu in gpus for topology in topologies)
        labels = {}
        for device in devices:
            if labels.setdefault(self.label(device), device) != device:
                bad("gpu_target", f"two GPU target files show as {self.label(device)!r} in cell ids (their file "
                                  "names): rename one")
        return devices

    @staticmethod
    def _listed(given: dict, key: str, kind: type, bad, problem) -> list:
        if key not in given:
            return []
        values = given[key] if isinstance(given[key], list) else [given[key]]
        for i, value in enumerate(values):
            if not isinstance(value, kind) or isinstance(value, bool):
                bad(f"{key}[{i}]", f"expected {kind.__name__}, got {type(value).__name__} {value!r}")
            message = problem(value)
            if message:
                bad(f"{key}[{i}]", message)
        if len(set(values)) != len(values):
            bad(key, "has duplicates")
        return values

    @staticmethod
    def _arch_problem(arch: str) -> str | None:
        return None if _ARCH.match(arch) else f"expected a GPU architecture such as 'sm_90' or 'sm_100', got {arch!r}"

    def record_fields(self, device: str) -> dict[str, str]:
        """A named GPU under ``gpu`` (the device name: ``8xh100``) with its architecture under ``cuda_arch``, so
        ``--only cuda_arch=sm_90`` and a rule on it cover the H100 cells too; an architecture under ``cuda_arch``."""
        if not device or _ARCH.match(device):
            return super().record_fields(device)
        try:
            arch = self.architecture(device)
        except (OSError, ValueError):  # a user's file gone since (a merged shard's record): the name still stands
            arch = ""
        return {"gpu": device, "cuda_arch": arch}

    def label(self, device: str) -> str:
        if not device or _ARCH.match(device):
            return super().label(device)
        return f"{self.name}-{gpu_device(device).label}"

    def architecture(self, device: str) -> str:
        """The GPU architecture the device declares (``sm_90``), or its target config's compute capability (an H100's
        9.0 is ``sm_90``, a B200's 10.0 ``sm_100``, a GB300's 10.3 ``sm_103``); "" when the cell declares none."""
        if not device or _ARCH.match(device):
            return device
        major, minor = compute_capability_of(target_config(gpu_device(device).gpu))
        return f"sm_{major}{minor}"

    # -- stages and availability -------------------------------------------------------------------------------

    def stage_problem(self, device: str, stage: str) -> str | None:
        if stage == "lowered" or (device and not _ARCH.match(device)):
            return None
        return (f"stage {stage!r} for cuda compiles for a named GPU's compile-only devices: set gpu = 'h100' (or "
                f"gpu_target = 'path.txtpb'); cuda_arch only declares an architecture to cross-lower for")

    def check_available(self, cell: Cell) -> None:
        problem = self.stage_problem(cell.device, cell.stage)
        if problem:
            raise Unavailable(problem)
        if not self.has_own_devices(cell):
            return
        if importlib.util.find_spec("jax_cuda12_plugin") is None:
            raise Unavailable("a named GPU's compile-only devices need jax's CUDA plugin (pip install '.[te]'; "
                              "`make setup` does)")
        if cell.stage == "compiled" and importlib.util.find_spec("nvidia.cuda_nvcc") is None:
            raise Unavailable("stage 'compiled' for a GPU needs ptxas from nvidia-cuda-nvcc-cu12 (pip install '.[te]')")

    # -- devices ----------------------------------------------------------------------------------------------

    def has_own_devices(self, cell: Cell) -> bool:
        return bool(cell.device) and not _ARCH.match(cell.device)

    def devices(self, cell: Cell) -> list:
        if self.has_own_devices(cell):
            return self.compile_devices(cell.device)
        return super().devices(cell)

    def compile_devices(self, device: str) -> list:
        gpu = gpu_device(device)
        return list(cuda_devices(target_config(gpu.gpu), gpu.topology))

    def mesh_topology(self, cell: Cell) -> tuple[str, int] | None:
        if not self.has_own_devices(cell):
            return None
        count = gpu_device(cell.device).count
        if count == 1:
            return None  # one device: MaxText sizes the batch by the mesh's own
        if count % _MAXTEXT_GPUS_PER_HOST:
            raise Unavailable(f"MaxText sizes a multi-GPU batch by its compile_topology, and knows GPUs only as "
                              f"{_MAXTEXT_GPU_SYSTEM!r}, {_MAXTEXT_GPUS_PER_HOST} a host: {count} GPUs is not a "
                              f"multiple of {_MAXTEXT_GPUS_PER_HOST}")
        return _MAXTEXT_GPU_SYSTEM, count // _MAXTEXT_GPUS_PER_HOST

    def dump_files(self, cell: Cell) -> DumpFiles | None:
        return GPU_DUMP if self.has_own_devices(cell) else None

    # -- what the HLO depends on, what a worker costs ---------------------------------------------------------

    def toolchain(self, cell: Cell) -> dict[str, str]:
        """The CUDA plugin (XLA's GPU compiler), ptxas for a compiled cell, and the target config's content: a
        named GPU's device facts decide its module (fusions, tiling, scheduling, what fits in memory)."""
        if not self.has_own_devices(cell):
            return {}
        config = target_config(gpu_device(cell.device).gpu)
        toolchain = {"jax-cuda12-plugin": host.installed_version("jax-cuda12-plugin"),
                     "gpu_target_sha256": hashlib.sha256(config.encode()).hexdigest()[:16]}
        if cell.stage == "compiled":
            toolchain["nvidia-cuda-nvcc-cu12"] = host.installed_version("nvidia-cuda-nvcc-cu12")
        return toolchain

    def worker_bytes(self, cell: Cell) -> int:
        if not self.has_own_devices(cell) or cell.stage == "lowered":
            return LOWERING_WORKER_BYTES
        return _OPTIMIZED_WORKER_BYTES if cell.stage == "optimized" else _COMPILED_WORKER_BYTES


# --------------------------------------------------------------------------------------------------------------
# Named GPUs
# --------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class GpuDevice:
    """A named GPU device: the GPU (a shipped name, or an absolute path to a target config) and its topology."""

    gpu: str
    topology: str  # <partitions>x<hosts per partition>x<devices per host>

    @property
    def count(self) -> int:
        partitions, hosts, per_host = map(int, _TOPOLOGY.match(self.topology).groups())
        return partitions * hosts * per_host

    @property
    def name(self) -> str:
        """The GPU as ids show it: its shipped name, or its target file's stem."""
        return Path(self.gpu).stem if self.gpu.endswith(CONFIG_SUFFIX) else self.gpu

    @property
    def label(self) -> str:
        return _form(self.name, self.topology)


def device_name(gpu: str, topology: str = "1x1x1") -> str:
    """The canonical device name of a GPU on a topology: ``h100``, ``8xh100`` (1x1x8), ``h100@1x8x1``."""
    return _form(gpu, topology)


def _form(gpu: str, topology: str) -> str:
    m = _TOPOLOGY.match(topology)
    if m and m.group(1) == m.group(2) == "1":
        count = int(m.group(3))
        return gpu if count == 1 else f"{count}x{gpu}"
    return f"{gpu}@{topology}"


def gpu_device(device: str) -> GpuDevice:
    """The GPU and topology a device name means; ValueError (one line) when it names none."""
    m = _GPU_DEVICE.match(device)
    if m is None:
        raise ValueError(f"expected a GPU such as 'h100', '8xh100' or 'h100@1x8x1', got {device!r}")
    gpu, count, topology = m.group("gpu"), m.group("count"), m.group("topology")
    if count is not None and topology is not None:
        raise ValueError(f"{device!r}: a count ({count}x) or a topology (@{topology}), not both")
    if topology is None:
        topology = f"1x1x{int(count) if count else 1}"
    problem = _topology_problem(topology) or (_file_problem(gpu, gpu) if gpu.endswith(CONFIG_SUFFIX)
                                              else _shipped_problem(gpu))
    if problem:
        raise ValueError(problem)
    return GpuDevice(gpu, topology)


def shipped_gpus() -> list[str]:
    return sorted(p.stem for p in GPU_CONFIG_DIR.glob(f"*{CONFIG_SUFFIX}"))


def _shipped_problem(name: str) -> str | None:
    if name in shipped_gpus():
        return None
    return (f"unknown GPU {name!r} (shipped: {', '.join(shipped_gpus())}; or gpu_target = 'path.txtpb' for a "
            "target config of your own)")


def _count_problem(count: int) -> str | None:
    return None if count >= 1 else f"expected a GPU count >= 1, got {count}"


def _topology_problem(topology: str) -> str | None:
    m = _TOPOLOGY.match(topology)
    if m is None or 0 in map(int, m.groups()):
        return (f"expected a GPU topology <partitions>x<hosts>x<GPUs per host> such as '1x1x8' or '1x8x1', got "
                f"{topology!r}")
    return None


def _file_problem(path: str, shown: str) -> str | None:
    """Why a user's target config cannot name a device (cheap: XLA parses it when the cell lowers)."""
    if not path.endswith(CONFIG_SUFFIX):
        return f"a GPU target config is a {CONFIG_SUFFIX} text proto, got {shown!r}"
    if not _NAME.match(Path(path).stem.lower()) or Path(path).stem != Path(path).stem.lower():
        return (f"{shown!r}: the file's name is the GPU's name in cell ids: lower-case letters, digits, '_' and '-', "
                "starting with a letter")
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as error:
        return f"{shown}: cannot read the GPU target config: {error}"
    try:
        compute_capability_of(text)
    except ValueError as error:
        return f"{shown}: {error}"
    return None


@functools.cache
def target_config(gpu: str) -> str:
    """The text of a shipped GPU's target config (``h100``) or of a ``.txtpb`` file (an absolute path)."""
    path = Path(gpu) if gpu.endswith(CONFIG_SUFFIX) else GPU_CONFIG_DIR / f"{gpu}{CONFIG_SUFFIX}"
    if not path.is_file():
        raise Unavailable(_shipped_problem(gpu) if not gpu.endswith(CONFIG_SUFFIX)
                          else f"GPU target config {gpu} is gone")
    return path.read_text()


def compute_capability_of(config: str) -> tuple[int, int]:
    """(major, minor) of a target config's ``gpu_device_info.cuda_compute_capability`` (a field left out is 0)."""
    m = _CAPABILITY.search(config)
    major = re.search(r"\bmajor:\s*(\d+)", m.group("body")) if m else None
    if major is None:
        raise ValueError("not a GPU target config: no gpu_device_info.cuda_compute_capability { major: ... }")
    minor = re.search(r"\bminor:\s*(\d+)", m.group("body"))
    return int(major.group(1)), int(minor.group(1)) if minor else 0


@functools.cache
def cuda_devices(config: str, topology: str = "1x1x1") -> tuple:
    """Compile-only CUDA devices for a ``GpuTargetConfig`` text proto and a topology (module doc)."""
    problem = _topology_problem(topology)
    if problem:
        raise Unavailable(problem)
    from jax.experimental.topologies import get_topology_desc  # noqa: PLC0415 (jax: imported only by what lowers)

    try:
        return tuple(get_topology_desc(platform="cuda", target_config=config, topology=topology).devices)
    except NotImplementedError as error:
        raise Unavailable(
            "jax's CUDA plugin is not registered (install jax-cuda12-plugin; on a host without a GPU set "
            f"JAX_PLATFORMS=cpu before jax starts, so the plugin skips its device check): {one_line(error)}"
        ) from error
    except Exception as error:
        raise GpuTargetError(f"compile-only CUDA devices for topology {topology}: {one_line(error)}") from error


def compute_capability(architecture: str) -> int:
    """``sm_90`` -> 90, ``sm_100a`` -> 100: the number TE compares against (major * 10 + minor)."""
    match = _ARCH.match(architecture)
    if not match:
        raise ValueError(f"not a CUDA architecture: {architecture!r} (expected e.g. 'sm_90')")
    return int(match.group(1))
