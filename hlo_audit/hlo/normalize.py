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
import re
from collections.abc import Iterable, Sequence

from hlo_audit.hlo.params import EntryParam, entry_params
from hlo_audit.hlo.text import (
    COMPUTATION_ATTRS, Computation, HloModule, Instruction, split_name_list, strip_index_comments,
    strip_number_suffix,
)

VOLATILE_ATTRS = frozenset({"metadata", "statistics_viz", "origin"})
# Custom calls whose backend_config is a serialized kernel (megabytes, with embedded source locations).
KERNEL_CUSTOM_CALLS = ("tpu_custom_call", "__gpu$xla.gpu.triton", "mosaic_gpu", "__gpu$xla.gpu.ext.mosaic")
COMMUTATIVE = frozenset({"add", "multiply", "maximum", "minimum", "and", "or", "xor"})
_INSTR_REF_ATTRS = frozenset({"control-predecessors"})
_NAME_REF_ATTRS = COMPUTATION_ATTRS | _INSTR_REF_ATTRS  # values that are renamed, so depend on context


_COUNTER = re.compile(r"[._-]\d+(?=$|[._-])")


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
    return any(k in instr.custom_call_target for k in KERNEL_CUSTOM_CALLS)


class _Namer:
    """Canonical names for one module."""

    def __init__(self, params: Sequence[EntryParam]):
        self.entry_param_names = _entry_param_names(params)
        self.computation_names: dict[str, str] = {}
        self.computation_copies: dict[str, int] = {}
        self.rendered_attrs: dict[tuple[tuple[str, str], ...], str] = {}

    def computation(self, comp: Computation) -> list[str]:
        """Canonical lines of one computation; records its canonical name."""
        names: dict[str, str] = {}
        taken: dict[str, int] = {}
        body: list[str] = []
        for instr in _print_order(comp):
            opcode = instr.opcode
            operands = [names.get(op, op) for op in instr.operands]
            if opcode in COMMUTATIVE:
                operands.sort()
            attrs = self._attrs(instr, names) if instr.attrs else ""
            if opcode == "parameter":
                n = instr.parameter_number
                name = self.entry_param_names.get(n, f"arg{n}") if comp.is_entry else f"p{n}"
            else:
                key = "|".join((opcode, instr.shape.text, ",".join(operands), attrs, instr.literal))
                name = f"{opcode}.{_digest(key)}"
            copies = taken.get(name, 0)
            taken[name] = copies + 1
            if copies:  # identical instruction repeated (constants, mostly): number the copies in order
                name = f"{name}.{copies + 1}"
            names[instr.name] = name
            if opcode == "parameter" and comp.is_entry:
                args = ""  # position is the line order; a number would shift on every insertion
            elif opcode in ("parameter", "constant"):
                args = instr.literal
            else:
                args = "%" + ", %".join(operands) if operands else ""
            root = "ROOT " if instr.is_root else ""
            body.append(f"  {root}%{name} = {instr.shape.text} {opcode}({args}){attrs}")
        if comp.is_entry:
            canonical = strip_number_suffix(comp.name)
        else:
            # Counter numbers hide inside names too (region_1.3.clone.1.clone, while.90_computation):
            # keep only the words, which say what kind of computation it is.
            prefix = _COUNTER.sub("", comp.name).strip("._-") or "computation"
            canonical = f"{prefix}.{_digest(chr(10).join(body))}"
            copies = self.computation_copies.get(canonical, 0)
            self.computation_copies[canonical] = copies + 1
            if copies:  # same body (jax emits one reducer / threefry per call site): number the copies
                canonical = f"{canonical}.{copies + 1}"
        self.computation_names[comp.name] = canonical
        head = f"ENTRY %{canonical} {{" if comp.is_entry else f"%{canonical} {{"
        return [head, *body, "}"]

    def _attrs(self, instr: Instruction, names: dict[str, str]) -> str:
        """``, key=value`` for every kept attribute, sorted by key."""
        if not _NAME_REF_ATTRS.isdisjoint(instr.attrs):
            return self._render_attrs(instr, names)
        # Attributes that name nothing render the same wherever they appear, and a module has few
        # distinct lists of them (", dimensions={0,1}", ", direction=EQ", ...): render each list once.
        key = tuple(instr.attrs.items())
        rendered = self.rendered_attrs.get(key)
        if rendered is None:
            rendered = self.rendered_attrs[key] = self._render_attrs(instr, names)
        return rendered

    def _render_attrs(self, instr: Instruction, names: dict[str, str]) -> str:
        rendered = ""
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
            rendered += f", {key}={value}"
        return rendered


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
    namer = _Namer(params if params is not None else entry_params(module))
    header_attrs = ", ".join(f"{k}={v}" for k, v in sorted(module.header_attrs.items()))
    header = f"HloModule {strip_number_suffix(module.name)}" + (f", {header_attrs}" if header_attrs else "")
    lines = [strip_index_comments(header)]
    for comp in call_graph_postorder(module):
        lines.append("")
        lines.extend(namer.computation(comp))
    return "\n".join(lines) + "\n"
