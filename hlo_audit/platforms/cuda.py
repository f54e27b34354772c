"""Platform ``cuda``: cross-lowered from the host for a declared GPU architecture (``cuda_arch = "sm_90"``).

The architecture is what Transformer Engine asks the device for while it traces (``hlo_audit.targets.te``
answers its compute-capability query with it), so it decides the HLO of a TE cell: it is part of the cell's
id, cache key and golden environment.
"""

from __future__ import annotations

import re

from hlo_audit.platforms.base import HostPlatform

_ARCH = re.compile(r"^sm_(\d{2,3})[a-z]?$")  # sm_90, sm_90a, sm_100


class CudaPlatform(HostPlatform):
    device_key = "cuda_arch"
    device_word = "CUDA architecture"

    def __init__(self):
        super().__init__("cuda")

    def device_problem(self, device: str) -> str | None:
        if not _ARCH.match(device):
            return f"expected a GPU architecture such as 'sm_90' or 'sm_100', got {device!r}"
        return None

    def architecture(self, device: str) -> str:
        """The GPU architecture a device declares (``sm_90``); "" when the cell declares none."""
        return device


def compute_capability(architecture: str) -> int:
    """``sm_90`` -> 90, ``sm_100a`` -> 100: the number TE compares against (major * 10 + minor)."""
    match = _ARCH.match(architecture)
    if not match:
        raise ValueError(f"not a CUDA architecture: {architecture!r} (expected e.g. 'sm_90')")
    return int(match.group(1))
