"""The platforms a cell can name, one module each, and the questions every other module asks them.

``of(cell)`` is the cell's platform (``hlo_audit.platforms.base`` says what one owns). Adding a platform is
one module and one line in ``PLATFORMS``; nothing else branches on platform names.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from hlo_audit.platforms.base import Cell, HostPlatform
from hlo_audit.platforms.cuda import CudaPlatform
from hlo_audit.platforms.tpu import TpuPlatform

PLATFORMS: dict[str, HostPlatform] = {p.name: p for p in (
    HostPlatform("cpu"),
    CudaPlatform(),
    HostPlatform("rocm"),
    TpuPlatform(),
)}


def get(name: str) -> HostPlatform:
    return PLATFORMS[name]


def of(cell: Cell) -> HostPlatform:
    return PLATFORMS[cell.platform]


# Every config key that names a platform's devices, and every record key that shows one, each once, in order.
CONFIG_KEYS = tuple(dict.fromkeys(k for p in PLATFORMS.values() for k in p.config_keys))
RECORD_KEYS = tuple(dict.fromkeys(k for p in PLATFORMS.values() for k in p.record_keys))


def by_device_key(key: str) -> HostPlatform | None:
    """The platform a config key names devices of, for messages: the one whose main key it is (``topology``: tpu),
    else the first that reads it (``gpus``: cuda); None if none does."""
    return next((p for p in PLATFORMS.values() if p.device_key == key), None) or next(
        (p for p in PLATFORMS.values() if key in p.config_keys), None)


def devices(cell: Cell) -> list:
    """The devices the cell's step is lowered (and compiled) for: a TPU topology's compile-only ones from libtpu,
    else the host's own (a callable target builds its mesh over these: ``hlo_audit.devices(cell)``)."""
    return of(cell).devices(cell)


@contextlib.contextmanager
def default_device(cell: Cell) -> Iterator[None]:
    """Unsharded jit code inside this block lowers for the cell's first device (one chip of a TPU topology)."""
    if not of(cell).has_own_devices(cell):
        yield
        return
    import jax  # noqa: PLC0415 (jax: imported only by what lowers)

    with jax.default_device(devices(cell)[0]):
        yield
