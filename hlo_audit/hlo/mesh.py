"""The mesh a module's shardings name, with each axis's size on the target, and how a sharding splits an array on it.

Shardy writes the mesh into the module's header (``frontend_attributes={xla.sdy.meshes={mesh =
#sdy.mesh<["data"=2, "fsdp"=4]>}}``) and each value's sharding as per-dimension axis lists (``<@mesh, [{"data",
"context"}, {}]>``). Whether a sharding change splits anything differently is arithmetic on the axes' sizes: a
dimension is split into the product of its axes' sizes, so an axis of size 1 added to a dimension, renamed or
reordered splits nothing differently.

The sizes are the TARGET's (``TargetMesh``, the one owner of them). A module lowered for several devices (a
multi-device host, a TPU topology's compile-only devices) says them itself. A module lowered on the host's single
device says 1 for every axis, which is the host's, not the target's: there the sizes the cell's config gives its
target mesh are used where the target said them (``declared``: MaxText's ``ici_*`` / ``dcn_*`` parallelism, 1 for an
axis it does not split, None for ``-1``, the rest of the devices), and an axis no one gave a size is of unknown size,
compared by its name (never taken for 1).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from math import prod

# Each side's sizes, by axis, that its cell's config gives its target mesh (None: the target gave none; a size None:
# the rest of the devices, not known here).
DeclaredSizes = tuple[Mapping[str, int | None] | None, Mapping[str, int | None] | None]

# One mesh of the header's ``xla.sdy.meshes`` (its name, its axes), and an axis in it (``"data"=2``).
_MESH = re.compile(r'(@?[\w.$-]+)\s*=\s*#sdy\.mesh<\[([^\]]*)\]')
_AXIS = re.compile(r'"([^"]+)"\s*=\s*(\d+)')
# A value's sharding: the mesh it names (``@mesh``; an inline ``mesh<[...]>`` is named by its text) and its dims.
_SHARDING = re.compile(r'^<\s*(@[\w.$-]+|mesh<\[[^\]]*\]>)\s*,\s*\[(.*)\]')
# A dimension's axis: ``"data"``, or a sub-axis ``"data":(1)2`` (its own size).
_DIM_AXIS = re.compile(r'"([^"]+)"(?::\(\d+\)(\d+))?')


@dataclass(frozen=True, slots=True)
class MeshAxis:
    """One mesh axis and its size on the target (None: not known, the module lowered on one device and no one
    gave the target's)."""

    name: str
    size: int | None

    def text(self) -> str:
        return f'"{self.name}"={self.size if self.size is not None else "?"}'


@dataclass(frozen=True, slots=True)
class TargetMesh:
    """The mesh a module's shardings name (its first, where the header declares several), sized for the target."""

    axes: tuple[MeshAxis, ...]
    # Where the sizes come from: "module" (it was lowered for as many devices), "config" (the cell's config gave
    # its target mesh's: the module lowered on the host's one device), "unknown" (neither).
    sizes_from: str

    @classmethod
    def of_module(cls, header_attrs: Mapping[str, str],
                  declared: Mapping[str, int | None] | None = None) -> TargetMesh | None:
        """The module's mesh (None where its header declares none); ``declared``: the sizes the cell's config
        gives its target mesh, by axis, where the target said them."""
        axes = module_mesh(header_attrs)
        if axes is None:
            return None
        if prod(size for _, size in axes) > 1:
            return cls(tuple(MeshAxis(n, s) for n, s in axes), "module")
        if declared:
            return cls(tuple(MeshAxis(n, declared.get(n)) for n, _ in axes), "config")
        return cls(tuple(MeshAxis(n, None) for n, _ in axes), "unknown")

    def size(self, axis: str) -> int | None:
        return next((a.size for a in self.axes if a.name == axis), None)

    def split(self, sharding: str) -> Split | None:
        """How Shardy's ``sharding`` (``<@mesh, [{"data"}, {}]>``, its wrapper gone) splits its array; None where it
        is no per-dimension sharding (a maximal one, a tuple's)."""
        m = _SHARDING.match(sharding.strip())
        if not m:
            return None
        dims = []
        for dim in _dims(m.group(2)):
            dims.append(tuple(MeshAxis(name, int(sub) if sub else self.size(name))
                              for name, sub in _DIM_AXIS.findall(dim)))
        return Split(tuple(dims))


@dataclass(frozen=True, slots=True)
class Split:
    """Each dimension's mesh axes (major first) on the target mesh: the dimension is cut into their sizes' product."""

    dims: tuple[tuple[MeshAxis, ...], ...]

    def effective(self) -> tuple[tuple[tuple[str, int | None], ...], ...]:
        """What the split does: each dimension's axes that cut it (size 1 cuts nothing; an axis of unknown size is
        kept, by its name): equal for two shardings that split their array alike."""
        return tuple(tuple((a.name, a.size) for a in dim if a.size != 1) for dim in self.dims)

    def pieces(self, dim: int) -> int | None:
        """How many pieces dimension ``dim`` is cut into (None where an axis's size is unknown)."""
        sizes = [a.size for a in self.dims[dim]]
        return None if None in sizes else prod(sizes)  # type: ignore[arg-type]

    def dim_text(self, dim: int) -> str:
        """``4 (fsdp)``, ``1``, ``? (fsdp)``: the pieces and the axes that cut them."""
        cutting = [a.name for a in self.dims[dim] if a.size != 1 and a.name]  # XLA's tiles name no axis
        pieces = self.pieces(dim)
        number = "?" if pieces is None else str(pieces)
        return f"{number} ({', '.join(cutting)})" if cutting else number


def split_changes(before: Split, after: Split) -> tuple[str, ...]:
    """Each dimension whose split changed: ``dim 0 split 2 (fsdp) -> 4 (fsdp, data)``; empty where none did."""
    # XLA's ``{replicated}`` says no rank: every dimension in one piece, as many as the other side has.
    if not before.dims:
        before = Split(tuple(() for _ in after.dims))
    if not after.dims:
        after = Split(tuple(() for _ in before.dims))
    if len(before.dims) != len(after.dims):
        return (f"rank {len(before.dims)} -> {len(after.dims)}",)
    old, new = before.effective(), after.effective()
    return tuple(f"dim {d} split {before.dim_text(d)} -> {after.dim_text(d)}"
                 for d in range(len(old)) if old[d] != new[d])


def module_mesh(header_attrs: Mapping[str, str]) -> tuple[tuple[str, int], ...] | None:
    """The axes and sizes of the mesh the module's header declares (Shardy's ``xla.sdy.meshes``: the first of them
    with axes), as the module was lowered; None where it declares none."""
    attrs = header_attrs.get("frontend_attributes", "").replace('\\"', '"')
    for _, axes in _MESH.findall(attrs):
        found = tuple((name, int(size)) for name, size in _AXIS.findall(axes))
        if found:
            return found
    return None


def without_meshes(frontend_attributes: str) -> str:
    """A header's ``frontend_attributes`` without Shardy's ``xla.sdy.meshes`` entry: what else it says, where the
    mesh's change is the sharding kind's to word."""
    start = frontend_attributes.find("xla.sdy.meshes=")
    if start < 0:
        return frontend_attributes
    depth, end = 0, len(frontend_attributes)
    for i in range(start, len(frontend_attributes)):
        ch = frontend_attributes[i]
        if ch in "{<":
            depth += 1
        elif ch in "}>":
            depth -= 1
            if depth == 0:
                end = i + 1
                break
        elif ch == "," and depth == 0:
            end = i
            break
    rest = (frontend_attributes[:start] + frontend_attributes[end:]).replace("{,", "{").replace(",}", "}")
    return rest.replace(",,", ",")


def mesh_text(axes: tuple[MeshAxis, ...]) -> str:
    return "[" + ", ".join(a.text() for a in axes) + "]"


def _dims(text: str) -> list[str]:
    """The top-level ``{...}`` groups of a dims list (``{"a", "b"}, {}, {?}``)."""
    dims, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "{":
            if depth == 0:
                start = i + 1
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                dims.append(text[start:i])
    return dims
