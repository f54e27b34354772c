"""The cache's primary key: what is known about a cell's lowering before it runs (``hlo_audit.cache``'s doc), and the
fingerprints of hlo-audit's own source that key what it lowered and what it analysed."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
from pathlib import Path

from hlo_audit import host, layers, platforms
from hlo_audit.matrix import Cell

# v3: manifests of what each lowering read; every entry carries its key, cell and checksum.
# v4: the project's files named relative to it; each cell's own modules and opened files; every entry marked with
# this user's key (entries of v3 carry no mark: a v4 cache starts empty rather than warn about each).
# v5: a lowering's reads recorded in its own process (issue 45): paths probed, folders listed, modules not found,
# what makes it unservable; the primary key no longer holds a target's fingerprint (the judging process imports none).
LAYOUT_VERSION = "v5"
_VERSIONED_PACKAGES = ("jax", "jaxlib", "flax", "maxtext", "transformer-engine-jax")
FLAG_PREFIXES = ("XLA_", "JAX_", "LIBTPU_")
HLO_AUDIT_ROOT = Path(__file__).resolve().parent.parent
_CACHE_ROOT = Path(__file__).resolve().parent


def package_versions() -> dict[str, str]:
    return {name: host.installed_version(name) for name in _VERSIONED_PACKAGES}


# Which backends jax starts on this host, not what a lowering for the cell's named platform produces
# (hlo-audit itself sets it where the host has no accelerator: host.setup_own_process).
NOT_FLAGS = frozenset({"JAX_PLATFORMS"})


def _flags() -> dict[str, str]:
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(FLAG_PREFIXES) and k not in NOT_FLAGS}


def lowering_key(cell: Cell) -> str:
    """The primary key: what is known about a cell's lowering before it runs (the module doc). The target's own code
    (a user's module, MaxText's files) is in what the lowering read, not here: knowing it here would mean importing
    it in the judging process."""
    material = {"layout": LAYOUT_VERSION, "cell": cell.key_material(), "versions": package_versions(),
                "flags": _flags(), "lowering": lowering_fingerprint(),
                "python": sys.version, "recorder": _recorder_fingerprint()}
    toolchain = platforms.of(cell).toolchain(cell)
    if toolchain:  # only where the cell depends on it: a libtpu upgrade re-lowers TPU cells, not CPU ones
        material["toolchain"] = toolchain
    return material_digest(material)


def material_digest(material: object) -> str:
    return hashlib.sha256(canonical_json(material).encode()).hexdigest()


def canonical_json(material: object) -> str:
    return json.dumps(material, sort_keys=True, separators=(",", ":"))


def _module_name(path: Path, root: Path = HLO_AUDIT_ROOT) -> str:
    """``platforms/tpu.py`` -> ``platforms.tpu``; a package's ``__init__.py`` is the package."""
    return layers.module_name(path.relative_to(root).as_posix())


def lowering_sources(root: Path = HLO_AUDIT_ROOT) -> list[Path]:
    """hlo-audit's lowering side under ``root``: every module the layer table puts at or below ``targets``."""
    return [path for path in sorted(root.rglob("*.py")) if layers.is_lowering_side(_module_name(path, root))]


def source_fingerprint(paths: list[Path], root: Path) -> str:
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


@functools.cache
def lowering_fingerprint() -> str:
    """The source of hlo_audit's lowering side: a change to what a cell lowers for must not serve stale text."""
    return source_fingerprint(lowering_sources(), HLO_AUDIT_ROOT)


@functools.cache
def _recorder_fingerprint() -> str:
    """The cache's own code: it decides what a manifest records and how entries verify, so entries of another
    version of it are not trusted to have recorded enough."""
    digest = hashlib.sha256()
    for path in [*sorted(_CACHE_ROOT.glob("*.py")), HLO_AUDIT_ROOT / "worker.py"]:  # the worker runs the recorder
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def analysis_fingerprint() -> str:
    """hlo_audit's own source: a change to the analysis must not serve stale summaries."""
    return source_fingerprint(sorted(HLO_AUDIT_ROOT.rglob("*.py")), HLO_AUDIT_ROOT)


