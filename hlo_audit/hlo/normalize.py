"""Canonical HLO text for goldens and diffs.

XLA names instructions from a module-wide counter (``add.123``), so one inserted instruction renumbers
everything printed after it and a golden diff drowns in renames. Here, as in LLVM's IRNormalizer, a
value is named from what it computes: opcode + a digest of its shape, its operands' canonical names and
its semantic attributes. Entry parameters are named by their state path, nested parameters by position,
computations by a digest of their canonical body. Inserting or removing one instruction then changes
only its own line and the lines that really use it.

Dropped as volatile: metadata (op_name, source file/line, stack_frame_id), the dump's FileNames /
StackFrames tables, ``/*index=N*/`` comments, module-id suffixes, and serialized kernel bodies in
``backend_config`` of Mosaic / Triton custom calls. Kept: opcodes, shapes, layouts, shardings and every
other attribute.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

from hlo_audit.hlo.params import EntryParam, entry_params
from hlo_audit.hlo.text import (
    COMPUTATION_ATTRS, Computation, HloModule, Instruction, operand_base, split_name_list, strip_index_comments,
    strip_number_suffix,
)

VOLATILE_ATTRS = frozenset({"metadata", "statistics_viz", "origin"})
# Custom calls whose backend_config is a serialized kernel (megabytes, with embedded source locations).
KERNEL_CUSTOM_CALLS = ("tpu_custom_call", "__gpu$xla.gpu.triton", "mosaic_gpu", "__gpu$xla.gpu.ext.mosaic")
COMMUTATIVE = frozenset({"add", "multiply", "maximum", "minimum", "and", "or", "xor"})
_INSTR_REF_ATTRS = frozenset({"control-predecessors"})


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=4).hexdigest()


def call_graph_postorder(module: HloModule) -> list[Computation]:
    """Callees before callers, starting from ENTRY; computations nobody calls come last."""
    order: list[Computation] = []
    seen: set[str] = set()

    def visit(comp: Computation) -> None:
        stack = [(comp, iter(_callees(comp)))]
        seen.add(comp.name)
        while stack:
            current, callees = stack[-1]
            for callee in callees:
                if callee not in seen:
                    seen.add(callee)
                    child = module.computations[callee]
                    stack.append((child, iter(_callees(child))))
                    break
            else:
                stack.pop()
                order.append(current)

    visit(module.entry)
    for comp in module.computations.values():
        if comp.name not in seen:
            visit(comp)
    # The entry must print last even when an unreachable computation follows it in the source.
    order.remove(module.entry)
    order.append(module.entry)
    return order


def _callees(comp: Computation) -> list[str]:
    return [c for instr in comp.instructions for c in instr.called_computations()]


def _print_order(comp: Computation) -> list[Instruction]:
    """Entry parameters first, by number (jax interleaves them with their first uses); the rest as printed."""
    if not comp.is_entry:
        return comp.instructions
    params = comp.parameters
    return params + [i for i in comp.instructions if i.opcode != "parameter"]


def _kernel_call(instr: Instruction) -> bool:
    target = instr.attrs.get("custom_call_target", "")
    return any(k in target for k in KERNEL_CUSTOM_CALLS)


class _Namer:
    """Canonical names for one module."""

    def __init__(self, module: HloModule, params: Sequence[EntryParam]):
        self.module = module
        self.entry_param_names = _entry_param_names(params)
        self.computation_names: dict[str, str] = {}
        self.taken_computation_names: set[str] = set()

    def computation(self, comp: Computation) -> list[str]:
        """Canonical lines of one computation; records its canonical name."""
        names: dict[str, str] = {}
        taken: set[str] = set()
        body: list[str] = []
        for instr in _print_order(comp):
            operands = [self._operand(names, op) for op in instr.operands]
            if instr.opcode in COMMUTATIVE:
                operands.sort()
            attrs = self._attrs(instr, names)
            if instr.opcode == "parameter":
                n = instr.parameter_number
                name = self.entry_param_names.get(n, f"arg{n}") if comp.is_entry else f"p{n}"
            else:
                key = "|".join((instr.opcode, instr.shape.text, ",".join(operands), attrs, instr.literal))
                name = f"{instr.opcode}.{_digest(key)}"
            if name in taken:  # identical instruction repeated: number the copies in order
                k = 2
                while f"{name}.{k}" in taken:
                    k += 1
                name = f"{name}.{k}"
            taken.add(name)
            names[instr.name] = name
            if instr.opcode == "parameter" and comp.is_entry:
                args = ""  # position is the line order; a number would shift on every insertion
            elif instr.opcode in ("parameter", "constant"):
                args = instr.literal
            else:
                args = ", ".join(f"%{o}" for o in operands)
            root = "ROOT " if instr.is_root else ""
            body.append(f"  {root}%{name} = {instr.shape.text} {instr.opcode}({args}){attrs}")
        if comp.is_entry:
            canonical = strip_number_suffix(comp.name)
        else:
            prefix = strip_number_suffix(comp.name).rstrip("0123456789_") or "computation"
            canonical = f"{prefix}.{_digest(chr(10).join(body))}"
            k = 2
            base = canonical
            while canonical in self.taken_computation_names:
                canonical = f"{base}.{k}"
                k += 1
        self.computation_names[comp.name] = canonical
        self.taken_computation_names.add(canonical)
        head = f"ENTRY %{canonical} {{" if comp.is_entry else f"%{canonical} {{"
        return [head, *body, "}"]

    @staticmethod
    def _operand(names: dict[str, str], ref: str) -> str:
        base = operand_base(ref)
        # A name defined nowhere in the computation is a placeholder left by a transformation
        # (strip_rng_state's rng_value); parsed modules have none (the parser checks every reference).
        return names.get(base, base) + ref[len(base):]

    def _attrs(self, instr: Instruction, names: dict[str, str]) -> str:
        parts = []
        for key in sorted(instr.attrs):
            if key in VOLATILE_ATTRS:
                continue
            value = instr.attrs[key]
            if key in COMPUTATION_ATTRS:
                value = _name_list(value, (self.computation_names[c] for c in split_name_list(value)))
            elif key in _INSTR_REF_ATTRS:
                value = _name_list(value, (names.get(c, c) for c in split_name_list(value)))
            elif key == "backend_config" and _kernel_call(instr):
                value = '"<kernel body dropped>"'
            else:
                value = strip_index_comments(value)
            parts.append(f"{key}={value}")
        return "".join(f", {p}" for p in parts)


def _name_list(original: str, names: Iterable[str]) -> str:
    rendered = ", ".join(f"%{n}" for n in names)
    return f"{{{rendered}}}" if original.strip().startswith("{") else rendered


def _entry_param_names(params: Sequence[EntryParam]) -> dict[int, str]:
    names: dict[int, str] = {}
    seen: set[str] = set()
    for p in params:
        name = p.path if p.path not in seen else f"{p.path}#{p.index}"
        seen.add(name)
        names[p.index] = name
    return names


def normalize(module: HloModule, params: Sequence[EntryParam] | None = None) -> str:
    """The module's canonical text (ends with a newline)."""
    namer = _Namer(module, params if params is not None else entry_params(module))
    header_attrs = ", ".join(f"{k}={v}" for k, v in sorted(module.header_attrs.items()))
    header = f"HloModule {strip_number_suffix(module.name)}" + (f", {header_attrs}" if header_attrs else "")
    lines = [strip_index_comments(header)]
    for comp in call_graph_postorder(module):
        lines.append("")
        lines.extend(namer.computation(comp))
    return "\n".join(lines) + "\n"
