"""The HloModule header's per-position attributes: those that say something per entry parameter or per output.

A compiled module's header enumerates the entry computation's parameters and outputs in several places:
``entry_computation_layout`` (each one's layout), ``input_output_alias`` and ``buffer_donor`` (by number),
``allow_spmd_sharding_propagation_to_parameters`` / ``_to_output`` (one flag each) and the ``arg_*`` /
``out_*`` lists PJRT keeps in ``frontend_attributes`` (one ``;``-separated entry each). Removing parameters
or outputs from the entry computation must take their entries out of all of them and renumber the rest,
else the header still tells what was removed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hlo_audit.hlo.numbers import bounded
from hlo_audit.hlo.shapes import Shape, split_top_level

# `{1}: (3, {}, may-alias)`: output index -> (parameter number, index within it, kind)
_ALIAS = re.compile(r"\{([\d,\s]*)\}\s*:\s*\(\s*(\d+)\s*,\s*\{([\d,\s]*)\}\s*(?:,\s*([\w-]+)\s*)?\)")
_DONOR = re.compile(r"\(\s*(\d+)\s*,\s*\{([\d,\s]*)\}\s*\)")

# PJRT's compile options, kept as frontend attributes: one `;`-separated entry per parameter / per output.
PER_PARAMETER_FRONTEND_ATTRS = frozenset({"arg_layout_modes", "arg_memory_spaces"})
PER_OUTPUT_FRONTEND_ATTRS = frozenset({"out_layout_modes", "out_memory_spaces"})


@dataclass(frozen=True)
class KeptPositions:
    """Which entry parameters and root tuple elements remain, by their numbers before the removal, in order.

    ``outputs`` is None when the outputs stay as they are (the root is no tuple, or lost no element).
    ``output_shape`` is the root's shape before the removal: flags are per leaf of it.
    """

    params: tuple[int, ...]
    n_params: int
    outputs: tuple[int, ...] | None
    output_shape: Shape

    @property
    def changes_anything(self) -> bool:
        return len(self.params) != self.n_params or self.outputs is not None


def output_aliases(header_attrs: Mapping[str, str]) -> list[tuple[tuple[int, ...], int]]:
    """``input_output_alias``'s pairs: (output shape index, entry parameter number) of each output that reuses a
    parameter's buffer (a whole parameter: jax aliases donated arguments, never a part of one)."""
    aliases = []
    for m in _ALIAS.finditer(header_attrs.get("input_output_alias", "")):
        if m.group(3).strip():
            continue
        output = tuple(bounded(i, "input_output_alias: output index") for i in m.group(1).replace(" ", "").split(",")
                       if i)
        aliases.append((output, bounded(m.group(2), "input_output_alias: parameter number")))
    return aliases


def donated_parameters(header_attrs: Mapping[str, str]) -> dict[int, str]:
    """Entry parameter number -> the header attribute that donates its buffer: ``input_output_alias`` (an output
    reuses it) or ``buffer_donor`` (XLA may reuse it). What jax's ``donate_argnums`` becomes."""
    donated = {bounded(m.group(1), "buffer_donor: parameter number"): "buffer_donor"
               for m in _DONOR.finditer(header_attrs.get("buffer_donor", ""))}
    donated.update((param, "input_output_alias") for _, param in output_aliases(header_attrs))
    return donated


def position_entries(key: str, value: str) -> int | None:
    """How many entries a per-position header attribute holds (aliases, donors, the layout's parameters, frontend
    attributes); None for one that enumerates nothing."""
    if key == "input_output_alias":
        return len(_ALIAS.findall(value))
    if key == "buffer_donor":
        return len(_DONOR.findall(value))
    if key == "entry_computation_layout":
        params_text = value.strip()[1:-1].partition("->")[0].strip()
        return len([p for p in split_top_level(params_text[1:-1]) if p.strip()])
    if key == "frontend_attributes" or key.startswith("allow_spmd_sharding_propagation"):
        items = _list_items(value)
        return None if items is None else len([i for i in split_top_level(value.strip()[1:-1]) if i.strip()])
    return None


def drop_positions(header_attrs: Mapping[str, str], kept: KeptPositions) -> dict[str, str]:
    """The header's attributes without the removed parameters' and outputs' entries, the rest renumbered;
    attributes that enumerate no positions as they are."""
    if not kept.changes_anything:
        return dict(header_attrs)
    rewrite = {
        "entry_computation_layout": _entry_computation_layout,
        "input_output_alias": _input_output_alias,
        "buffer_donor": _buffer_donor,
        "allow_spmd_sharding_propagation_to_parameters": _per_parameter_flags,
        "allow_spmd_sharding_propagation_to_output": _per_output_flags,
        "frontend_attributes": _frontend_attributes,
    }
    return {k: rewrite[k](v, kept) if k in rewrite else v for k, v in header_attrs.items()}


def _entry_computation_layout(value: str, kept: KeptPositions) -> str:
    params_text, _, result = value.strip()[1:-1].partition("->")
    params = split_top_level(params_text.strip()[1:-1])
    params = [params[i].strip() for i in kept.params] if len(params) == kept.n_params else params
    result = result.strip()
    if kept.outputs is not None and result.startswith("("):
        elements = split_top_level(result[1:-1])
        result = "(" + ", ".join(elements[i].strip() for i in kept.outputs) + ")"
    return "{(" + ", ".join(p for p in params if p) + ")->" + result + "}"


def _input_output_alias(value: str, kept: KeptPositions) -> str:
    rank = {n: i for i, n in enumerate(kept.params)}
    entries = []
    for m in _ALIAS.finditer(value):
        output = [bounded(i, "input_output_alias: output index") for i in m.group(1).replace(" ", "").split(",") if i]
        param = bounded(m.group(2), "input_output_alias: parameter number")
        # An alias of a removed parameter or into a removed output goes with it.
        if param not in rank or (kept.outputs is not None and output and output[0] not in kept.outputs):
            continue
        if kept.outputs is not None and output:
            output[0] = kept.outputs.index(output[0])
        kind = f", {m.group(4)}" if m.group(4) else ""
        entries.append(f"{{{','.join(map(str, output))}}}: ({rank[param]}, {{{m.group(3)}}}{kind})")
    return "{ " + ", ".join(entries) + " }"


def _buffer_donor(value: str, kept: KeptPositions) -> str:
    rank = {n: i for i, n in enumerate(kept.params)}
    numbers = [(bounded(m.group(1), "buffer_donor: parameter number"), m) for m in _DONOR.finditer(value)]
    entries = [f"({rank[n]}, {{{m.group(2)}}})" for n, m in numbers if n in rank]
    return "{ " + ", ".join(entries) + " }"


def _per_parameter_flags(value: str, kept: KeptPositions) -> str:
    """``{false,true,...}``: one flag per entry parameter, or a single one that applies to all (kept as is)."""
    flags = _list_items(value)
    if flags is None or len(flags) != kept.n_params or len(flags) == 1:
        return value
    return "{" + ",".join(flags[i] for i in kept.params) + "}"


def _per_output_flags(value: str, kept: KeptPositions) -> str:
    """``{false,true,...}``: one flag per leaf of the output shape, or a single one that applies to all."""
    flags = _list_items(value)
    if flags is None or len(flags) == 1 or kept.outputs is None:
        return value
    picked = _pick_outputs(flags, kept)
    return value if picked is None else "{" + ",".join(picked) + "}"


def _frontend_attributes(value: str, kept: KeptPositions) -> str:
    """``{key="a;b;c",...}``: the per-parameter and per-output lists lose the removed entries."""
    text = value.strip()
    if not (text.startswith("{") and text.endswith("}")):
        return value
    entries, changed = [], False
    for entry in split_top_level(text[1:-1]):
        before = entry
        key, eq, quoted = entry.strip().partition("=")
        items = quoted[1:-1].split(";") if eq and len(quoted) >= 2 and quoted[0] == quoted[-1] == '"' else None
        if items is not None and key in PER_PARAMETER_FRONTEND_ATTRS and len(items) == kept.n_params:
            entry = f'{key}="' + ";".join(items[i] for i in kept.params) + '"'
        elif items is not None and key in PER_OUTPUT_FRONTEND_ATTRS and kept.outputs is not None:
            picked = _pick_outputs(items, kept)
            entry = entry if picked is None else f'{key}="' + ";".join(picked) + '"'
        changed |= entry.strip() != before.strip()
        entries.append(entry.strip())
    return "{" + ",".join(entries) + "}" if changed else value


def _pick_outputs(items: Sequence[str], kept: KeptPositions) -> list[str] | None:
    """The kept outputs' entries of a list with one entry per leaf of the output shape, or one per root tuple
    element (the same list where every output is an array); None when the list has neither length."""
    elements = kept.output_shape.elements
    leaves = [len(e.leaves()) for e in elements]
    if len(items) == sum(leaves):
        starts = [sum(leaves[:i]) for i in range(len(leaves))]
        return [items[starts[i] + j] for i in kept.outputs for j in range(leaves[i])]
    if len(items) == len(elements):
        return [items[i] for i in kept.outputs]
    return None


def _list_items(value: str) -> list[str] | None:
    text = value.strip()
    if not (text.startswith("{") and text.endswith("}")):
        return None
    return [item.strip() for item in text[1:-1].split(",")]
