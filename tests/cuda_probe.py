"""Whether this host has XLA's GPU compiler for a named GPU (compile-only devices of an H100's target config):
the tests that compile for one are skipped, with the reason, where it does not."""

from __future__ import annotations

import functools

import pytest

from hlo_audit.lowering import Unavailable
from hlo_audit.platforms.cuda import cuda_devices, target_config


@functools.cache
def cuda_missing() -> str | None:
    """Why there are no compile-only CUDA devices here, or None when there are."""
    try:
        cuda_devices(target_config("h100"))
    except Unavailable as error:
        return str(error)
    return None


needs_cuda = pytest.mark.skipif(cuda_missing() is not None, reason=f"no compile-only CUDA devices: {cuda_missing()}")
