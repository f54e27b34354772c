"""This machine and the processes hlo-audit owns: what they set before jax starts, what memory they may take,
what is installed.

* ``setup_own_process()``: with libtpu installed, jax starts the TPU runtime at its first backend use on every
  host, and on one without a TPU chip that costs ~200 MB per process and prints libtpu's complaints about the
  cloud VM it is not on. The processes hlo-audit owns (the CLI, its workers, its tests) call this first;
  compiling for a topology does not need that runtime.
* ``workers_for(...)``: how many worker processes the machine's memory holds, so ``--jobs`` never starts more
  than it can (running out of memory kills a worker and loses every cell it held).
* ``installed_version(...)``: the one reader of installed distributions' versions (cache keys, golden
  environments, toolchains).
"""

from __future__ import annotations

import contextlib
import functools
import glob
import os
import pathlib
import sys
import tempfile
from collections.abc import Iterator
from importlib import metadata

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


@contextlib.contextmanager
def prints_to_stderr() -> Iterator[None]:
    """What the block prints goes to stderr, from Python (``sys.stdout``) and from C (file descriptor 1, pointed
    at stderr's file for the block). Used around building and lowering a target: stdout is the command's report
    (a JSON document a pipeline parses), and a library's print (MaxText's "[DECOUPLED NO-OP] gcs_storage: using
    stubs." from an import, XLA's printf) must never come before it."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no file descriptor 1 (closed by whoever started us): nothing of C's to move
        saved = None
    if saved is not None:
        os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        if saved is not None:
            sys.stderr.flush()
            os.dup2(saved, 1)
            os.close(saved)


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
    import jax  # noqa: PLC0415 (jax: imported only by what lowers)
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


def has_device(platform: str) -> bool:
    """Whether this machine has a device of the jax platform (jax says so)."""
    import jax  # noqa: PLC0415 (jax: imported only by what lowers)

    try:
        return bool(jax.devices(platform))
    except RuntimeError:
        return False


@functools.cache
def installed_version(distribution: str) -> str:
    """The installed version of a distribution, ``absent`` when it is not installed."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "absent"


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


def workers_for(bytes_per_cell: list[int], jobs: int, memory: int | None = None) -> int:
    """How many worker processes to run for cells whose workers hold ``bytes_per_cell`` at their peak: at most
    ``jobs`` and the cells, and no more than memory holds.

    Sized by the most demanding cell, since any worker may draw it; always at least one (one cell at a time
    is what running in-process would cost anyway).
    """
    if not bytes_per_cell:
        return 0
    memory = available_memory() if memory is None else memory
    return max(1, min(jobs, len(bytes_per_cell), memory // max(bytes_per_cell)))


@contextlib.contextmanager
def stderr_held(what: str) -> Iterator[None]:
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
