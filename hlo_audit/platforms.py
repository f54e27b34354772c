"""What a cell's platform means on this host: which devices it lowers and compiles for, what it needs, what it costs.

A platform is a property of the cell (``cpu``; ``cuda`` with an architecture; ``tpu`` with a topology), so
every target asks this module instead of branching on platform names itself:

* ``devices(cell)``: the devices a cell's mesh is built over. A TPU cell with a topology gets that topology's
  compile-only devices from libtpu (``jax.experimental.topologies.get_topology_desc``, as MaxText's
  ``train_compile`` does): nothing runs, but the step lowers and AOT-compiles for v6e-4 on a CPU host. Every
  other cell gets the host's own devices (and is cross-lowered with ``lowering_platforms``).
* ``check_available(cell)``: a cheap test, before any lowering, that raises ``Unavailable`` with the reason.
* ``toolchain(cell)``: the compiler versions the cell's HLO depends on beyond jax/jaxlib (libtpu for a TPU
  topology), for the cache key and the golden's environment fingerprint.
* ``memory_per_worker(cell)``: what one worker process lowering the cell holds at its peak, so ``--jobs``
  never starts more workers than the machine's memory can hold.
* ``setup_own_process()``: with libtpu installed, jax starts the TPU runtime at its first backend use on
  every host, and on one without a TPU chip that costs ~200 MB per process and prints libtpu's complaints
  about the cloud VM it is not on. The processes hlo-audit owns (the CLI, its workers, its tests) call this
  first; compiling for a topology does not need that runtime.

TPU topology names are MaxText's (``v6e-4``, ``v5p-8``, ``v4-16``): its ``accelerator_to_spec_map`` says what
chips, host bounds and wraparound each name means, so a name means the same here as in ``train_compile``.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import importlib.util
import os
import pathlib
import sys
import tempfile
from collections.abc import Iterator
from importlib import metadata

from hlo_audit.matrix import Cell
from hlo_audit.targets.base import Unavailable

# Peak RSS of one worker process, measured on the 2-core CPU machine (`make bench` prints the real numbers):
# MaxText imported and one TPU train step compiled holds ~1.4 GB for llama3-8b at 4 layers, up to 2.6 GB for
# the default matrix's largest (deepseek3-test unrolled); a lowering alone ~0.7 GB. A stage optimized TPU cell
# holds its lowering (~0.9 GB) while its XLA child runs (~1.0 GB), ~1.9 GB together. Rounded up, since running
# out of memory kills a worker and loses every cell it held.
_COMPILED_TPU_WORKER_BYTES = 3 << 30
_LOWERING_WORKER_BYTES = 1 << 30


def uses_topology(cell: Cell) -> bool:
    """The cell names a TPU topology: its mesh is that topology's devices, from libtpu."""
    return cell.platform == "tpu" and bool(cell.topology)


def check_available(cell: Cell) -> None:
    """Raise Unavailable if this host cannot lower (or, for stage compiled, compile) the cell."""
    if uses_topology(cell):
        if importlib.util.find_spec("libtpu") is None:
            raise Unavailable(f"TPU topology {cell.topology} needs libtpu (pip install '.[tpu]'; `make setup` does)")
        return
    if cell.stage == "optimized":
        raise Unavailable("stage 'optimized' runs XLA's TPU compiler up to codegen: it needs platform 'tpu' and a "
                          "topology (for other platforms use 'compiled')")
    if cell.stage != "compiled":
        return  # cross-lowering needs no device of the platform
    if cell.platform == "tpu":
        raise Unavailable("stage 'compiled' for tpu needs a topology to compile for, e.g. topology = 'v6e-4'")
    if not host_has(cell.platform):
        raise Unavailable(f"stage 'compiled' needs a {cell.platform} device on this machine")


def devices(cell: Cell) -> list:
    """The devices the cell's step is lowered (and compiled) for."""
    import jax  # noqa: PLC0415 (jax: imported only by what lowers)

    if uses_topology(cell):
        return tpu_topology_devices(cell.topology)
    return jax.devices()


@contextlib.contextmanager
def default_device(cell: Cell) -> Iterator[None]:
    """Unsharded jit code inside this block lowers for the cell's first device (one chip of a TPU topology)."""
    import jax  # noqa: PLC0415

    if not uses_topology(cell):
        yield
        return
    with jax.default_device(devices(cell)[0]):
        yield


@functools.cache
def tpu_topology_devices(topology: str, num_slices: int = 1) -> list:
    """Compile-only devices of a TPU topology (MaxText's name, e.g. v6e-4), from libtpu on any host."""
    spec = _tpu_system(topology)
    from jax.experimental.topologies import get_topology_desc  # noqa: PLC0415

    compile_only_libtpu()
    with _fd2_captured("loading libtpu"):
        return list(get_topology_desc(
            platform="tpu", topology_name=spec.topology_name, chip_config_name=spec.chip_config_name,
            chips_per_host_bounds=spec.chips_per_host_bounds, num_slices=num_slices, wrap=spec.wrap,
        ).devices)


def compile_only_libtpu() -> None:
    """Settings for libtpu loaded only to compile (call before it loads; MaxText's train_compile needs them too)."""
    # libtpu must never ask a cloud metadata server where it runs (there is none, and CI has no network). jax
    # sets this itself when it finds no TPU chip; set it before libtpu loads, whatever the order.
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    # libtpu takes /tmp/libtpu_lockfile so that two processes never drive one chip; compiling drives none, and
    # without this a second worker (or a second run on the machine) fails to load it.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    # libtpu's start-up sends every C++ INFO line of the process to stderr from then on (a PjRt client's device
    # count each time one is created); warnings and errors still show. jaxlib reads the level once, so the
    # processes hlo-audit owns set it at their start (setup_own_process).
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")


def _tpu_system(topology: str):
    """MaxText's description of a topology name (chips, host bounds, wraparound)."""
    table = _maxtext_topologies()
    if table is None:
        raise Unavailable(f"TPU topology {topology}: its names are MaxText's (pip install '.[maxtext]')")
    problem = unknown_topology(topology)
    if problem:
        raise Unavailable(problem)
    return table[topology]


def _maxtext_topologies() -> dict | None:
    try:
        from maxtext.utils import accelerator_to_spec_map  # noqa: PLC0415 (a data table: 15 ms)
    except ImportError:
        return None
    return accelerator_to_spec_map.UserFacingNameToSystemCharacteristics


def unknown_topology(topology: str) -> str | None:
    """Why MaxText does not know this TPU topology name, or None (also when MaxText is absent: the run says so)."""
    table = _maxtext_topologies()
    if table is None or (topology in table and table[topology].platform == "tpu"):
        return None
    known = [n for n in ("v4-8", "v5e-8", "v5p-8", "v6e-4", "v6e-8", "tpu7x-8") if n in table]
    return f"unknown TPU topology {topology!r} (MaxText's names, e.g. {', '.join(known)})"


@contextlib.contextmanager
def _fd2_captured(what: str) -> Iterator[None]:
    """Hold back what C++ code writes to stderr (libtpu's start-up warnings about the cloud VM it is not on).

    Shown again, as an exception note, only if the block fails: then it is the likely reason.
    """
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        except BaseException as error:
            os.dup2(saved, 2)
            sink.seek(0)
            output = sink.read().decode(errors="replace").strip()
            if output:
                error.add_note(f"stderr while {what}:\n{output}")
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def toolchain(cell: Cell) -> dict[str, str]:
    """Compiler packages the cell's HLO depends on besides jax and jaxlib (which every cell depends on)."""
    if uses_topology(cell):
        return {"libtpu": _version("libtpu")}
    return {}


@functools.cache
def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "absent"


def memory_per_worker(cell: Cell) -> int:
    """Bytes one worker process holds at its peak while it lowers (and compiles) the cell."""
    if cell.stage in ("compiled", "optimized") and uses_topology(cell):
        return _COMPILED_TPU_WORKER_BYTES
    return _LOWERING_WORKER_BYTES


def available_memory() -> int:
    """Memory the machine can still give (MemAvailable; physical pages where /proc is absent)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def workers_for(cells: list[Cell], jobs: int, memory: int | None = None) -> int:
    """How many worker processes to run: at most ``jobs`` and the cells, and no more than memory holds.

    Sized by the most demanding cell, since any worker may draw it; always at least one (one cell at a time
    is what running in-process would cost anyway).
    """
    if not cells:
        return 0
    memory = available_memory() if memory is None else memory
    per_worker = max(memory_per_worker(c) for c in cells)
    return max(1, min(jobs, len(cells), memory // per_worker))


# PCI vendors of the accelerators jax has backends for: Google (TPU), NVIDIA, AMD.
_ACCELERATOR_PCI_VENDORS = frozenset({"0x1ae0", "0x10de", "0x1002"})


def setup_own_process() -> None:
    """What the processes hlo-audit owns (the CLI, its workers, its tests) set before jax starts.

    The libtpu settings of ``compile_only_libtpu``, from the start: a C++ log level read before libtpu loads
    holds after it, and worker processes inherit them. Then ``cpu_backend_only_without_accelerators``. Before
    jax is imported this only sets the environment, so a command that never touches jax pays nothing.
    """
    compile_only_libtpu()
    cpu_backend_only_without_accelerators()


def cpu_backend_only_without_accelerators() -> None:
    """On a host with no accelerator at all, jax starts only its CPU backend: every platform is lowered from it
    (``lowering_platforms``), and the backends jax would otherwise try cost memory and warnings (libtpu's idle
    runtime, see the module doc; the CUDA plugin installed for Transformer Engine, which prints a traceback when
    it finds no GPU). A no-op when the user chose platforms (``JAX_PLATFORMS`` or jax's config), when jax's
    backends already started, or when the host has a PCI device of an accelerator vendor (jax's choice stands).
    """
    if "JAX_PLATFORMS" in os.environ or _has_accelerator_device():
        return
    if "jax" not in sys.modules:
        os.environ["JAX_PLATFORMS"] = "cpu"
        return
    import jax  # noqa: PLC0415
    from jax._src import xla_bridge  # noqa: PLC0415

    if not jax.config.jax_platforms and not xla_bridge.backends_are_initialized():
        jax.config.update("jax_platforms", "cpu")


def _has_accelerator_device() -> bool:
    """Any PCI device of an accelerator vendor (the probe jax itself uses for TPU chips)."""
    for vendor in glob.glob("/sys/bus/pci/devices/*/vendor"):
        with contextlib.suppress(OSError):
            if pathlib.Path(vendor).read_text().strip() in _ACCELERATOR_PCI_VENDORS:
                return True
    return False


def host_has(platform: str) -> bool:
    """Whether this machine has a device of the platform (jax says so)."""
    import jax  # noqa: PLC0415

    try:
        return bool(jax.devices(platform))
    except RuntimeError:
        return False
