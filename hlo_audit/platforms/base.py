"""What a platform owns, and the behaviour of one that lowers for the host's own devices.

A cell names its platform (``cpu``, ``cuda``, ``rocm``, ``tpu``) and, where the platform has them, a device:
a TPU topology (``v6e-4``), a named GPU (``h100``, ``8xh100``) or a CUDA architecture (``sm_90``). Everything a
device name means lives in its platform's module, and every other module asks the platform
(``hlo_audit.platforms.of(cell)``) instead of branching on platform names:

* naming: the config keys its devices are named by, their validation, how a cell id and a v1 record show them;
* the stages it supports for a device (``stage_problem``), and what this host needs to run them
  (``check_available``);
* the devices a cell lowers and compiles for, and MaxText's name for that topology (``mesh_topology``);
* which files of XLA's dump the stages read (``dump_files``): how stage optimized knows buffer assignment is done,
  what stage compiled keeps besides the module;
* the toolchain the cell's HLO depends on beyond jax and jaxlib (cache key, golden environment);
* what one worker process holds at its peak while it lowers and compiles the cell (``worker_bytes``).

``HostPlatform`` is a platform that names no device: its cells are cross-lowered from the host's CPU devices
(``lowering_platforms``), and compiled only where the host has a device of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from hlo_audit import host
from hlo_audit.lowering import Unavailable


class Cell(Protocol):
    """What a platform reads of a cell (``hlo_audit.matrix.Cell`` is one; the cells sit above the platforms, whose
    names they validate): the platform it names, the device on it, the stage it is taken to."""

    @property
    def platform(self) -> str: ...

    @property
    def device(self) -> str: ...

    @property
    def stage(self) -> str: ...

# Peak RSS of one worker process that lowers a cell, measured on the 2-core CPU machine (`make bench` prints the
# real numbers): ~0.7 GB for a MaxText lowering, rounded up.
LOWERING_WORKER_BYTES = 1 << 30


@dataclass(frozen=True)
class DumpFiles:
    """The files of XLA's ``--xla_dump_to`` folder a platform's compiler writes for a module, by how their names end.

    Stage optimized reads ``module`` and ``buffer_assignment`` and stops XLA once ``buffer_assignment_done``
    exists (a file the compiler writes after both are complete). Stage compiled keeps the texts of ``kept``
    (kind -> name ending) in its ``Lowering.dump``: on a GPU, the thunk sequence and its metadata.
    """

    module: str
    buffer_assignment: str
    buffer_assignment_done: str
    kept: Mapping[str, str] = field(default_factory=dict)


class HostPlatform:
    """A platform whose cells use the host's devices: lowered for it from the CPU, compiled only on its hardware."""

    # The config key that names this platform's devices (None: it names none) and what one is, for messages.
    device_key: str | None = None
    device_word = "device"
    # Every config key a series of this platform may name its devices by (``device_key`` first), and the keys a
    # cell's v1 record shows the device under (the first non-empty one is the device: ``Cell.from_record``).
    config_keys: tuple[str, ...] = ()
    record_keys: tuple[str, ...] = ()
    # What a config key names, for messages, where it is not ``device_word``.
    key_words: Mapping[str, str] = {}

    def __init__(self, name: str):
        self.name = name

    # -- naming ----------------------------------------------------------------------------------------------

    def device_problem(self, device: str) -> str | None:
        """Why ``device`` is not a device name of this platform (config time); None when it is one."""
        return f"platform {self.name!r} names no devices (got {device!r})"

    def config_devices(self, given: dict, bad, base: Path) -> tuple[str, ...]:
        """A series' devices from the values of this platform's ``config_keys`` that it sets (``given``, each a
        string, a number or a list of them); ``bad(key, message)`` reports a bad value; ``base`` is the config's
        folder (for file paths)."""
        for key, values in given.items():
            values = values if isinstance(values, list) else [values]
            for i, name in enumerate(values):
                problem = self.device_problem(name) if isinstance(name, str) and name else (
                    f"expected a non-empty string, got {name!r}")
                if problem:
                    bad(f"{key}[{i}]", problem)
            if len(set(values)) != len(values):
                bad(key, "has duplicates")
        return tuple(name for values in given.values() for name in (values if isinstance(values, list) else [values]))

    def record_fields(self, device: str) -> dict[str, str]:
        """The device as the v1 JSON records and ``--only`` name it (``topology``, ``cuda_arch``)."""
        return {self.device_key: device} if self.device_key and device else {}

    def label(self, device: str) -> str:
        """``cpu``, ``cuda-sm_90``, ``tpu-v6e-4``: the platform with its device, as cell ids show it."""
        return f"{self.name}-{device}" if device else self.name

    # -- stages and availability -------------------------------------------------------------------------------

    def stage_problem(self, device: str, stage: str) -> str | None:
        """Why a cell of ``device`` cannot have ``stage`` on any host (config time); None when it can."""
        if stage == "optimized":
            return ("stage 'optimized' runs XLA's TPU compiler up to codegen: it needs platform = 'tpu' and a "
                    "topology, or XLA's GPU compiler: platform = 'cuda' and a gpu (for other platforms use 'compiled')")
        return None

    def check_available(self, cell: Cell) -> None:
        """Raise Unavailable if this host cannot lower (or, for stage compiled, compile) the cell. Cheap."""
        problem = self.stage_problem(cell.device, cell.stage)
        if problem:
            raise Unavailable(problem)
        if cell.stage == "compiled" and not host.has_device(self.name):
            raise Unavailable(f"stage 'compiled' needs a {self.name} device on this machine")

    # -- devices ----------------------------------------------------------------------------------------------

    def has_own_devices(self, cell: Cell) -> bool:
        """The cell lowers for devices of its own (compile-only ones from a toolchain), not the host's."""
        return False

    def devices(self, cell: Cell) -> list:
        """The devices the cell's step is lowered (and compiled) for."""
        import jax  # noqa: PLC0415 (jax: imported only by what lowers)

        return jax.devices()

    def compile_devices(self, device: str) -> list:
        """The compile-only devices of ``device``, in a process that knows nothing but the device's name."""
        raise Unavailable(f"platform {self.name!r} has no compile-only devices")

    def mesh_topology(self, cell: Cell) -> tuple[str, int] | None:
        """MaxText's ``compile_topology`` name and slice count for the cell's devices; None for the host's own."""
        return None

    def architecture(self, device: str) -> str:
        """The GPU architecture a CUDA device means (``sm_90``), which Transformer Engine is told; "" for others."""
        return ""

    def dump_files(self, cell: Cell) -> DumpFiles | None:
        """What the stages read of XLA's dump for the cell (None: stage optimized is not supported for it, and
        stage compiled keeps no dump)."""
        return None

    # -- what the HLO depends on, what a worker costs ---------------------------------------------------------

    def toolchain(self, cell: Cell) -> dict[str, str]:
        """Compiler packages the cell's HLO depends on besides jax and jaxlib (which every cell depends on)."""
        return {}

    def worker_bytes(self, cell: Cell) -> int:
        """Bytes one worker process holds at its peak while it lowers (and compiles) the cell."""
        return LOWERING_WORKER_BYTES
