"""Platform ``tpu``: cross-lowered from the host, or, with a ``topology``, lowered and compiled for that topology's
compile-only devices from libtpu on any host.

A TPU cell with a topology gets the topology's devices from ``jax.experimental.topologies.get_topology_desc``,
as MaxText's ``train_compile`` does: nothing runs, but the step lowers and AOT-compiles for v6e-4 on a CPU
host. Topology names are MaxText's (``v6e-4``, ``v5p-8``, ``v4-16``): its ``accelerator_to_spec_map`` says
what chips, host bounds and wraparound each name means, so a name means the same here as in ``train_compile``.
"""

from __future__ import annotations

import functools
import importlib.util
import re

from hlo_audit import host
from hlo_audit.lowering import Unavailable
from hlo_audit.platforms.base import LOWERING_WORKER_BYTES, Cell, DumpFiles, HostPlatform

_TOPOLOGY = re.compile(r"^v\d+[a-z]*-\d+$")  # MaxText's compile_topology names: v6e-4, v5p-8, v4-16
# MaxText imported and one TPU train step compiled holds ~1.4 GB for llama3-8b at 4 layers, up to 2.6 GB for
# the default matrix's largest (deepseek3-test unrolled). A stage optimized cell holds its lowering (~0.9 GB)
# while its XLA child runs (~1.0 GB), ~1.9 GB together. Rounded up.
_COMPILING_WORKER_BYTES = 3 << 30
_COMPILING_STAGES = ("optimized", "compiled")
# libtpu's dump of a module: after optimizations, its buffer assignment, then the module again once buffer
# assignment is done (``*.after_optimizations_after_buffer_assignment.txt``), the last before codegen. Stage
# compiled keeps nothing of it (the compiled executable says what its TPU cell reports).
TPU_DUMP = DumpFiles(module=".after_optimizations.txt", buffer_assignment=".after_optimizations-buffer-assignment.txt",
                     buffer_assignment_done=".after_optimizations_after_buffer_assignment.txt")


class TpuPlatform(HostPlatform):
    device_key = "topology"
    device_word = "TPU topology"
    config_keys = ("topology",)
    record_keys = ("topology",)

    def __init__(self):
        super().__init__("tpu")

    def device_problem(self, device: str) -> str | None:
        if not _TOPOLOGY.match(device):
            return f"expected a TPU topology such as 'v6e-4' or 'v5p-8', got {device!r}"
        return unknown_topology(device)

    def stage_problem(self, device: str, stage: str) -> str | None:
        return None if device else super().stage_problem(device, stage)

    def check_available(self, cell: Cell) -> None:
        problem = self.stage_problem(cell.device, cell.stage)
        if problem:
            raise Unavailable(problem)
        if cell.stage == "compiled" and not cell.device:
            raise Unavailable("stage 'compiled' for tpu needs a topology to compile for, e.g. topology = 'v6e-4'")
        if cell.device and importlib.util.find_spec("libtpu") is None:
            raise Unavailable(f"TPU topology {cell.device} needs libtpu (pip install '.[tpu]'; `make setup` does)")

    def has_own_devices(self, cell: Cell) -> bool:
        return bool(cell.device)

    def devices(self, cell: Cell) -> list:
        if cell.device:
            return self.compile_devices(cell.device)
        return super().devices(cell)

    def compile_devices(self, device: str) -> list:
        return topology_devices(device)

    def mesh_topology(self, cell: Cell) -> tuple[str, int] | None:
        return (cell.device, 1) if cell.device else None

    def dump_files(self, cell: Cell) -> DumpFiles | None:
        return TPU_DUMP if cell.device else None

    def toolchain(self, cell: Cell) -> dict[str, str]:
        return {"libtpu": host.installed_version("libtpu")} if cell.device else {}

    def worker_bytes(self, cell: Cell) -> int:
        if cell.device and cell.stage in _COMPILING_STAGES:
            return _COMPILING_WORKER_BYTES
        return LOWERING_WORKER_BYTES


@functools.cache
def topology_devices(topology: str) -> list:
    """Compile-only devices of a TPU topology (MaxText's name, e.g. v6e-4), from libtpu on any host."""
    spec = _tpu_system(topology)
    from jax.experimental.topologies import get_topology_desc  # noqa: PLC0415 (jax: imported only by what lowers)

    host.compile_only_libtpu()
    with host.stderr_held("loading libtpu"):
        return list(get_topology_desc(
            platform="tpu", topology_name=spec.topology_name, chip_config_name=spec.chip_config_name,
            chips_per_host_bounds=spec.chips_per_host_bounds, num_slices=1, wrap=spec.wrap,
        ).devices)


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
