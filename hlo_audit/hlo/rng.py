"""RNG state in the entry computation: which instructions only keep the books on it.

An NNX Rngs stream is a (key u32[2], count u32[]) pair of entry parameters. A step that never draws from
it still pays for it: the key flows through sharding custom calls to the outputs and the count is
incremented and returned. ``strip_rng_state`` removes exactly that: the RNG parameters, every instruction
computed from RNG state (and constants) alone, and the RNG elements of tuples. Two modules whose stripped
forms normalize to the same text differ by RNG state only — the seed-000 review statement ("the only
difference is the dropped u32 RNG arrays and the renumbering that follows") as a check.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace

from hlo_audit.hlo.header import KeptPositions, drop_positions
from hlo_audit.hlo.params import EntryParam
from hlo_audit.hlo.shapes import tuple_shape
from hlo_audit.hlo.text import Computation, HloModule, Instruction, split_top_level

# Stands in for an operand computed from RNG state alone (a drawn key, say) once that is stripped.
RNG_VALUE = "rng_value"

_MESH_DECLARATION = re.compile(r"(\w+) = #sdy\.mesh<")

# Kept even when nothing reads them: removing them would change what the program does.
SIDE_EFFECTING = frozenset({
    "outfeed", "send", "send-done", "recv", "recv-done", "infeed", "after-all", "all-reduce-start",
    "rng-get-and-update-state",
})


def rng_derived(entry: Computation, rng_params: set[str]) -> set[str]:
    """Names of entry instructions whose value depends on RNG parameters and constants only."""
    derived = set(rng_params)
    constant_only: set[str] = set()
    for instr in entry.instructions:
        if instr.opcode == "parameter":
            continue
        bases = instr.operands
        if instr.opcode == "constant" or (bases and all(b in constant_only for b in bases)):
            constant_only.add(instr.name)
        elif bases and all(b in derived or b in constant_only for b in bases) and any(
                b in derived for b in bases):
            if instr.opcode == "get-tuple-element" and not _element_is_derived(instr, entry, derived):
                continue
            derived.add(instr.name)
    return derived


def _element_is_derived(instr: Instruction, entry: Computation, derived: set[str]) -> bool:
    """A tuple element access is RNG-derived only if the element itself is."""
    tup = entry.by_name[instr.operands[0]]
    if tup.opcode != "tuple":
        return True
    return tup.operands[int(instr.attrs["index"])] in derived


def strip_rng_state(module: HloModule, params: Sequence[EntryParam]) -> tuple[HloModule, list[EntryParam]]:
    """The module without its RNG state, and the entry parameters that remain."""
    rng_names = {p.name for p in params if p.is_rng}
    entry = module.entry
    derived = rng_derived(entry, rng_names)
    kept: list[Instruction] = []
    tuple_keep: dict[str, list[int]] = {}  # tuple name -> kept element positions
    for instr in entry.instructions:
        if instr.name in derived and not instr.is_root:
            continue
        if instr.opcode == "tuple":
            positions = [i for i, op in enumerate(instr.operands) if op not in derived]
            if len(positions) != len(instr.operands):
                tuple_keep[instr.name] = positions
                instr = replace(
                    instr, operands=tuple(instr.operands[i] for i in positions),
                    shape=tuple_shape([instr.shape.elements[i] for i in positions]),
                    attrs=_strip_tuple_sharding(instr, positions))
        elif instr.opcode == "get-tuple-element" and instr.operands[0] in tuple_keep:
            new_index = tuple_keep[instr.operands[0]].index(int(instr.attrs["index"]))
            instr = replace(instr, attrs={**instr.attrs, "index": str(new_index)})
        elif any(op in derived for op in instr.operands):
            # A value computed from RNG state alone reads as RNG_VALUE.
            instr = replace(instr, operands=tuple(RNG_VALUE if op in derived else op for op in instr.operands))
        kept.append(instr)
    kept = _live(kept)
    stripped_entry = Computation(name=entry.name, is_entry=True, line=entry.line, instructions=kept,
                                 by_name={i.name: i for i in kept}, attrs=entry.attrs)
    computations = {n: (stripped_entry if c is entry else c) for n, c in module.computations.items()}
    # The header enumerates parameter and output positions, RNG ones included: those go, the rest renumber.
    outputs = tuple_keep.get(entry.root.name)
    kept_positions = KeptPositions(
        params=tuple(sorted(p.index for p in params if not p.is_rng)), n_params=len(params),
        outputs=None if outputs is None else tuple(outputs), output_shape=entry.root.shape)
    header = drop_positions(module.header_attrs, kept_positions)
    if _declares_only_unused_meshes(header.get("frontend_attributes", ""), computations.values()):
        # jax declares the (empty) mesh only because some value, here an RNG key, was sharded.
        del header["frontend_attributes"]
    stripped = replace(module, computations=computations, entry=stripped_entry, header_attrs=header)
    return stripped, [p for p in params if not p.is_rng]


def _strip_tuple_sharding(tup: Instruction, positions: list[int]) -> dict[str, str]:
    """A tuple's per-leaf sharding list (``{{replicated}, {devices=...}, ...}``) without the removed elements'."""
    sharding = tup.attrs.get("sharding", "")
    entries = split_top_level(sharding.strip()[1:-1]) if sharding.strip().startswith("{{") else []
    leaves = [len(e.leaves()) for e in tup.shape.elements]
    if len(entries) != sum(leaves):  # one sharding for the whole tuple: it still applies
        return tup.attrs
    starts = [sum(leaves[:i]) for i in range(len(leaves))]
    kept = [entries[starts[i] + j].strip() for i in positions for j in range(leaves[i])]
    return {**tup.attrs, "sharding": "{" + ", ".join(kept) + "}"}


def _declares_only_unused_meshes(frontend_attributes: str, computations) -> bool:
    meshes = _MESH_DECLARATION.findall(frontend_attributes)
    if not meshes or frontend_attributes.count("=") != len(meshes) + 1:
        return False
    for comp in computations:
        for instr in comp.instructions:
            values = " ".join(instr.attrs.values())
            if any(f"@{mesh}" in values for mesh in meshes):
                return False
    return True


def _live(instructions: list[Instruction]) -> list[Instruction]:
    """Drop what nothing live reads any more (constants that only fed a removed count increment)."""
    by_name = {i.name: i for i in instructions}
    live: set[str] = set()
    stack = [i.name for i in instructions if i.is_root or i.opcode in SIDE_EFFECTING or i.opcode == "parameter"]
    while stack:
        name = stack.pop()
        if name in live or name not in by_name:
            continue
        live.add(name)
        stack.extend(by_name[name].operands)
    return [i for i in instructions if i.name in live]
