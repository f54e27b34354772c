"""Content-addressed results cache: an unchanged cell is never lowered twice.

Two levels, because lowering is the expensive part and analysis code changes more often:

* ``<key>.hlo.txt`` + ``<key>.lowering.json``: the HLO text and jax's argument paths (and a compiled cell's
  memory and cost), keyed by the cell, the versions of jax/jaxlib/flax/maxtext and of the cell's own
  compiler (libtpu for a TPU topology), the target's source fingerprint, hlo_audit's own lowering side (every
  module of the layers up to ``targets``: ``hlo_audit.layers``) and the XLA/JAX flags;
* ``<key>.<analysis>.result.json``: the analysed result, keyed additionally by hlo_audit's own source.

JSON and text only, never pickle. Every write goes to a temporary file in the same folder and is renamed
into place, so two runs sharing a cache (or one killed midway) never leave a torn entry.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path

from hlo_audit import host, layers, platforms
from hlo_audit.files import write_atomic
from hlo_audit.matrix import Cell

# v2: cells name one device (hlo_audit.platforms) and results carry their environment.
LAYOUT_VERSION = "v2"
_VERSIONED_PACKAGES = ("jax", "jaxlib", "flax", "maxtext", "transformer-engine-jax")
_FLAG_PREFIXES = ("XLA_FLAGS", "JAX_", "LIBTPU_INIT_ARGS")
_HLO_AUDIT_ROOT = Path(__file__).resolve().parent


def package_versions() -> dict[str, str]:
    return {name: host.installed_version(name) for name in _VERSIONED_PACKAGES}


# Which backends jax starts on this host, not what a lowering for the cell's named platform produces
# (hlo-audit itself sets it where the host has no accelerator: host.setup_own_process).
_NOT_FLAGS = frozenset({"JAX_PLATFORMS"})


def _flags() -> dict[str, str]:
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(_FLAG_PREFIXES) and k not in _NOT_FLAGS}


def lowering_key(cell: Cell, target_fingerprint: str) -> str:
    material = {"cell": cell.key_material(), "versions": package_versions(),
                "target": target_fingerprint, "flags": _flags(), "lowering": lowering_fingerprint()}
    toolchain = platforms.of(cell).toolchain(cell)
    if toolchain:  # only where the cell depends on it: a libtpu upgrade re-lowers TPU cells, not CPU ones
        material["toolchain"] = toolchain
    material = json.dumps(material, sort_keys=True)
    return hashlib.sha256(material.encode()).hexdigest()


def _module_name(path: Path) -> str:
    """``platforms/tpu.py`` -> ``platforms.tpu``; a package's ``__init__.py`` is the package."""
    parts = path.relative_to(_HLO_AUDIT_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def lowering_fingerprint() -> str:
    """The source of hlo_audit's lowering side: a change to what a cell lowers for must not serve stale text."""
    digest = hashlib.sha256()
    for path in sorted(_HLO_AUDIT_ROOT.rglob("*.py")):
        if layers.is_lowering_side(_module_name(path)):
            digest.update(str(path.relative_to(_HLO_AUDIT_ROOT)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def analysis_fingerprint() -> str:
    """hlo_audit's own source: a change to the analysis must not serve stale summaries."""
    digest = hashlib.sha256()
    for path in sorted(_HLO_AUDIT_ROOT.rglob("*.py")):
        digest.update(str(path.relative_to(_HLO_AUDIT_ROOT)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


class Cache:
    def __init__(self, root: Path, enabled: bool = True):
        self.root = Path(root) / LAYOUT_VERSION
        self.enabled = enabled
        self._analysis = analysis_fingerprint()

    def _base(self, key: str) -> Path:
        return self.root / key[:2] / key

    def get_lowering(self, key: str) -> tuple[str, dict] | None:
        if not self.enabled:
            return None
        base = self._base(key)
        try:
            meta = json.loads(base.with_suffix(".lowering.json").read_text())
            text = base.with_suffix(".hlo.txt").read_text()
        except (OSError, ValueError):
            return None
        if hashlib.sha256(text.encode()).hexdigest() != meta.get("hlo_sha256"):
            return None  # a damaged entry is a miss, never a wrong answer
        return text, meta

    def put_lowering(self, key: str, text: str, meta: dict) -> None:
        if not self.enabled:
            return
        base = self._base(key)
        # Text first: a lowering.json always points at a complete text.
        write_atomic(base.with_suffix(".hlo.txt"), text)
        write_atomic(base.with_suffix(".lowering.json"),
                     json.dumps({**meta, "hlo_sha256": hashlib.sha256(text.encode()).hexdigest()}, sort_keys=True))

    def get_result(self, key: str) -> dict | None:
        if not self.enabled:
            return None
        try:
            return json.loads(self._base(key).with_suffix(f".{self._analysis}.result.json").read_text())
        except (OSError, ValueError):
            return None

    def put_result(self, key: str, record: dict, normalized: str | None = None) -> None:
        """The analysed result and, when given, the module's canonical text (written first, like the HLO)."""
        if not self.enabled:
            return
        if normalized is not None:
            write_atomic(self._base(key).with_suffix(f".{self._analysis}.normalized.txt"), normalized)
        write_atomic(self._base(key).with_suffix(f".{self._analysis}.result.json"), json.dumps(record, sort_keys=True))

    def normalized_text(self, key: str) -> str | None:
        if not self.enabled:
            return None
        try:
            return self._base(key).with_suffix(f".{self._analysis}.normalized.txt").read_text()
        except OSError:
            return None

    def hlo_text(self, key: str) -> str | None:
        hit = self.get_lowering(key)
        return hit[0] if hit else None
