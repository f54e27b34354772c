"""Transformer Engine cells: TE's recipes cross-lowered for CUDA on any host, for a declared GPU architecture.

A TE cell (``quant = "te_*"``, ``platform = "cuda"``, ``cuda_arch = "sm_90"`` or a named GPU, ``gpu = "h100"``,
whose compute capability is the architecture) is lowered the way a cross-compiler builds for a target it does
not run on. Everything that takes is kept in this module, so the
MaxText target and the runner only ask it for a context (``cross_lowering``) and a cheap availability check.

Why each piece is needed (measured on a GPU-less 2-core host, README "Transformer Engine on CPU hosts"):

* **The driver library.** ``import transformer_engine.jax`` loads cuDNN's libraries from the
  ``nvidia-cudnn-cu12`` wheel; one of them (``libcudnn_engines_runtime_compiled.so.9``) has ``DT_NEEDED
  libcuda.so.1``. A GPU host has it; elsewhere ``make setup`` extracts NVIDIA's user-space driver library from
  Debian's ``libcuda1`` package into the virtual environment (``DRIVER_DIR``). ``LD_LIBRARY_PATH`` is read
  only when a process starts, so instead the library is loaded here by absolute path with ``RTLD_GLOBAL``:
  the dynamic loader then satisfies every later ``DT_NEEDED libcuda.so.1`` with the library already loaded.
  Nothing in it is called: there is no device to talk to.
* **The CUDA libraries.** TE's core library (``libtransformer_engine.so`` from ``transformer-engine-cu12``) has
  ``DT_NEEDED`` cudart, cuBLAS/cuBLASLt, NCCL and the cuDNN libraries, and no run path to the ``nvidia-*-cu12``
  wheels that hold them. They are loaded the same way first (the wheels' own run paths, ``$ORIGIN``, resolve
  their dependencies among themselves).
* **TE's library lookups.** TE's loader (``transformer_engine/common/__init__.py``) looks for nvrtc, curand and
  cuDNN first under ``NVRTC_HOME`` / ``CURAND_HOME`` / ``CUDNN_HOME``, then ``CUDA_HOME`` and
  ``/usr/local/cuda`` (a CUDA 13 toolkit on these hosts, the wrong major version), then in the Python wheels,
  where its fallback for cudart knows only the CUDA 13 wheel layout and fails for ``nvidia/cuda_runtime``.
  Pointing the three variables at the pinned wheels makes the lookup find exactly what was installed.
* **The architecture.** TE asks the device for its compute capability while tracing (recipe checks, the cuBLAS
  workspace size of every gemm, the quantize layout of FP8 tensor scaling, a dbias workaround below SM 100).
  Without a GPU that raises "no CUDA-capable device is detected". Inside ``cross_lowering`` TE's query
  answers the cell's ``cuda_arch``; the HLO depends on it (te_fp8_currentscaling differs between SM 90 and
  SM 100), which is why the architecture is part of the cell's id, cache key and golden environment.
* **The mesh resource, on more than one GPU.** TE partitions its ops through ``custom_partitioning`` callbacks,
  run inside XLA's SPMD partitioning, that look up which mesh axes are data, FSDP, tensor... in TE's global
  ``MeshResource``. MaxText sets it around its step (``max_utils.transformer_engine_context``) with its own axis
  names; that wrapper catches every exception and yields again, which turns the compile's own errors into
  "generator didn't stop after throw()", so the same resource is set here through TE itself, around the lowering
  and the stage (``MAXTEXT_MESH_RESOURCE``). One device has nothing to partition: the cells keep their HLO.

What this does not do: run or compile anything. A recipe the declared architecture cannot run (NVFP4 and
MXFP8 below SM 100) still lowers; TE's own support check says so in the cell's note.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from hlo_audit import platforms
from hlo_audit.lowering import Unavailable
from hlo_audit.platforms.cuda import compute_capability
from hlo_audit.targets.vocab import is_transformer_engine

if TYPE_CHECKING:
    from hlo_audit.matrix import Cell

# Where `make setup` (scripts/fetch_libcuda.sh) puts libcuda.so.1 from Debian's libcuda1: inside the venv.
DRIVER_DIR = Path(sys.prefix) / "lib" / "nvidia-driver"
DRIVER_SONAME = "libcuda.so.1"
# TE's loader variable -> the nvidia wheel folder (under site-packages/nvidia) that holds that library.
_TE_LIBRARY_HOMES = {"NVRTC_HOME": "cuda_nvrtc", "CURAND_HOME": "curand", "CUDNN_HOME": "cudnn"}
# The wheel folders of the libraries libtransformer_engine.so names in DT_NEEDED (readelf -d).
_CORE_LIBRARY_WHEELS = ("cuda_runtime", "cublas", "nccl", "cudnn")
# MaxText 0.2.5's max_utils.transformer_engine_context: its mesh axes for each of TE's parallelism kinds.
MAXTEXT_MESH_RESOURCE = {"dp_resource": "data", "tp_resource": "tensor", "tpsp_resource": "tensor_sequence",
                         "fsdp_resource": "fsdp", "pp_resource": None, "cp_resource": "context",
                         "ep_resource": "expert"}
NOT_INSTALLED = ("Transformer Engine is not installed (`make setup` installs it; `make setup TE=0` leaves it out; "
                 "or pip install '.[te]' plus libcuda.so.1, see README)")


def check_available(cell: Cell) -> None:
    """Cheap (no import): raise Unavailable when a TE cell cannot be lowered on this machine."""
    if not is_transformer_engine(cell.quant):
        return
    if importlib.util.find_spec("transformer_engine") is None or importlib.util.find_spec("nvidia") is None:
        raise Unavailable(NOT_INSTALLED)
    if _driver_library() is None:
        raise Unavailable(f"{DRIVER_SONAME} not found on the loader path nor in {DRIVER_DIR} "
                          "(`make setup` fetches it: scripts/fetch_libcuda.sh)")


def _driver_library() -> str | None:
    """The host's own driver library if it has one (a GPU host), else the one `make setup` extracted."""
    try:
        ctypes.CDLL(DRIVER_SONAME, mode=ctypes.RTLD_GLOBAL)
        return DRIVER_SONAME
    except OSError:
        pass
    extracted = DRIVER_DIR / DRIVER_SONAME
    return str(extracted) if extracted.is_file() else None


@functools.cache
def load():
    """Import Transformer Engine's JAX side once per process, with the libraries it needs in place.

    Returns the namespace of TE modules the declaration touches. Raises Unavailable when something is missing.
    """
    driver = _driver_library()
    if driver is None:
        raise Unavailable(f"{DRIVER_SONAME} not found (`make setup` fetches it)")
    ctypes.CDLL(driver, mode=ctypes.RTLD_GLOBAL)
    nvidia = importlib.util.find_spec("nvidia")
    if nvidia is None or not nvidia.submodule_search_locations:
        raise Unavailable(NOT_INSTALLED)
    wheels = Path(list(nvidia.submodule_search_locations)[0])
    for folder in _CORE_LIBRARY_WHEELS:
        for library in sorted((wheels / folder / "lib").glob("lib*.so.*")):
            ctypes.CDLL(str(library), mode=ctypes.RTLD_GLOBAL)
    for variable, folder in _TE_LIBRARY_HOMES.items():
        os.environ[variable] = str(wheels / folder)  # this process's lookups only; read at TE's import
    try:
        import transformer_engine.jax  # noqa: PLC0415 (loads transformer_engine_jax and the core library)
        import transformer_engine.jax.cpp_extensions  # noqa: F401, PLC0415
        import transformer_engine_jax  # noqa: PLC0415
        from transformer_engine.jax.quantize import device_utils, helper  # noqa: PLC0415
    except ImportError as exc:
        raise Unavailable(f"Transformer Engine does not import: {' '.join(str(exc).split())}") from exc
    return _TransformerEngine(transformer_engine_jax, device_utils, helper)


class _TransformerEngine:
    """The TE modules whose compute-capability query is answered with the declared architecture."""

    def __init__(self, extension, device_utils, helper):
        self.extension = extension
        self.device_utils = device_utils
        self.helper = helper
        self.query = extension.get_device_compute_capability  # the real one: cudaGetDeviceProperties
        # Modules that bound the query by name (`from transformer_engine_jax import ...`, as cpp_extensions.gemm
        # does) hold their own reference; each is redirected too.
        self.aliases = [m for name, m in sorted(sys.modules.items())
                        if name.startswith("transformer_engine") and m is not None
                        and getattr(m, "get_device_compute_capability", None) is self.query]
        self.declared: int | None = None

    def _set(self, query) -> None:
        for module in self.aliases:
            module.get_device_compute_capability = query
        # Answers TE cached from an earlier query (per process, per gpu id).
        self.device_utils.get_device_compute_capability.cache_clear()
        self.device_utils.is_fp8_gemm_with_all_layouts_supported.cache_clear()
        self.helper._is_scaling_mode_supported = None  # noqa: SLF001 (TE's per-process support cache)

    @contextlib.contextmanager
    def declared_architecture(self, sm: int) -> Iterator[None]:
        import jax  # noqa: PLC0415

        if self.declared is not None and self.declared != sm:
            # jax caches traces by function and shapes, not by what TE asked the device while tracing.
            jax.clear_caches()
        self._set(lambda gpu_id=0: sm)
        self.declared = sm
        try:
            yield
        finally:
            self._set(self.query)

    def unsupported_reason(self, recipe) -> str:
        """TE's own verdict for running ``recipe`` on the declared architecture: "" when it runs."""
        if recipe is None:
            return ""
        config = self.helper.get_quantize_config_with_recipe(recipe)
        for source in self.helper.TensorSource:
            supported, reason = self.helper.is_scaling_mode_supported(config.get_scaling_mode(source), gpu_id=0)
            if not supported:
                return reason
        return ""


@contextlib.contextmanager
def cross_lowering(cell: Cell, recipe_of=None) -> Iterator[list[str]]:
    """Around the lowering of ``cell``: TE loaded and answering the cell's GPU architecture; a no-op for other cells.

    Yields a list that receives the cell's note: where TE says the recipe (``recipe_of(cell.quant)``, a TE
    ``Recipe`` or None) cannot run on the declared architecture, the cell still lowers and the note says so.
    """
    notes: list[str] = []
    if not is_transformer_engine(cell.quant):
        yield notes
        return
    architecture = platforms.of(cell).architecture(cell.device)
    if not architecture:
        raise Unavailable(f"{cell.quant} is a Transformer Engine recipe: it lowers only for platform 'cuda' with "
                          f"a cuda_arch or a gpu (got {cell.platform_label!r})")
    te = load()
    with te.declared_architecture(compute_capability(architecture)), _mesh_resource(cell):
        reason = te.unsupported_reason(recipe_of(cell.quant)) if recipe_of else ""
        if reason:
            notes.append(f"cross-lowered for {architecture}, where this recipe does not run: {reason}")
        yield notes


@contextlib.contextmanager
def _mesh_resource(cell: Cell) -> Iterator[None]:
    """TE's global mesh resource with MaxText's axis names, where the cell has more than one device (module doc)."""
    if len(platforms.devices(cell)) <= 1:
        yield
        return
    from transformer_engine.jax.sharding import MeshResource, global_shard_guard  # noqa: PLC0415

    with global_shard_guard(MeshResource(**MAXTEXT_MESH_RESOURCE)):
        yield
