"""Canonical HLO text for goldens and diffs.

XLA names instructions from a module-wide counter (``add.123``), so one inserted instruction renumbers
everything printed after it and a golden diff drowns in renames. Here, as in LLVM's IRNormalizer, a
value is named from what it computes: opcode + a digest of its shape, its operands' canonical names and
its semantic attributes. Entry parameters are named by their state path, nested parameters by position,
computations by a digest of their canonical body. Inserting or removing one instruction then changes
only its own line and the lines that really use it.

The order is the graph's, not the printer's: parameters first by number, then every instruction right
after the operands (and control predecessors) it needs, depth first from the root; computations callees
first. So a shared constant, or any instruction that depends on nothing before it, prints in the same place
wherever the printer put it. An ``entry_computation_layout`` that only spells out the default layouts of the
entry's parameters and root says nothing and is left out, as are ``/*...*/`` and ``//`` comments.

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
from hlo_audit.hlo.shapes import with_default_layout
from hlo_audit.hlo.text import (
    COMPUTATION_ATTRS, Computation, HloModule, Instruction, split_name_list, strip_number_suffix,
)

VOLATILE_ATTRS = frozenset({"metadata", "statistics_viz", "origin"})
# Custom calls whose backend_config is a serialized kernel (megabytes, with embedded source locations).
KERNEL_CUSTOM_CALLS = ("tpu_custom_call", "__gpu$xla.gpu.triton", "mosaic_gpu", "__gpu$xla.gpu.ext.mosaic")
COMMUTATIVE = frozenset({"add", "multiply", "maximum", "minimum", "and", "or", "xor"})
_INSTR_REF_ATTRS = frozenset({"control-predecessors"})


# Counter numbers (region_1.3.clone.1) and this module's own digests (region.1a2b3c4d): not the kind of
# computation, so not part of its canonical name.
_COUNTER = re.compile(r"[._-](?:\d+|[0-9a-f]{8})(?=$|[._-])")
_SPACE = re.compile(r"\s+")
_NOT_IN_NAME = re.compile(r"[^\w.\-]")
_NUMBER_SUFFIX_AT_END = re.compile(r"\.\d+$")


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


def print_order(comp: Computation, names: dict[str, str]) -> list[Instruction]:
    """Parameters by number, then each instruction right after its operands and control predecessors, depth
    first from the root (operands in order; a commutative op's by ``names``). Instructions the root does not
    reach follow, in printed order."""
    by_name = comp.by_name
    order = comp.parameters
    placed = {p.name for p in order}
    for start in (comp.root, *comp.instructions):
        if start.name in placed:
            continue
        stack = [(start, False)]
        while stack:
            instr, expanded = stack.pop()
            name = instr.name
            if name in placed:
                continue
            if expanded:
                placed.add(name)
                order.append(instr)
                continue
            stack.append((instr, True))
            needs = instr.operands
            if instr.opcode in COMMUTATIVE:
                needs = sorted(needs, key=lambda ref: names.get(ref, ref))
            if "control-predecessors" in instr.attrs:
                needs = (*needs, *split_name_list(instr.attrs["control-predecessors"]))
            for ref in reversed(needs):
                if ref not in placed and ref in by_name:  # not a placeholder (rng.RNG_VALUE)
                    stack.append((by_name[ref], False))
    return order


def _kernel_call(instr: Instruction) -> bool:
    return any(k in instr.custom_call_target for k in KERNEL_CUSTOM_CALLS)


class _Namer:
    """Canonical names and lines for one module."""

    def __init__(self, params: Sequence[EntryParam]):
        self.entry_param_names = _entry_param_names(params)
        self.computation_names: dict[str, str] = {}  # name in the module -> canonical name
        self.bodies: dict[str, list[str]] = {}  # canonical name -> lines; identical computations print once
        self.callees: dict[str, list[str]] = {}  # canonical name -> canonical callees, in the order named
        self.rendered_attrs: dict[tuple[tuple[str, str], ...], str] = {}

    def computation(self, comp: Computation) -> None:
        """Name one computation and its instructions (its callees first) and keep its canonical lines.

        An instruction's name is a digest of what it computes, from its operands' names; the printed order
        then comes from the graph; identical instructions are numbered in that order (``.2``, ``.3``).
        """
        base: dict[str, str] = {}
        attrs_of: dict[str, str] = {}
        for instr in comp.instructions:  # operands before users, as the parser guarantees
            opcode = instr.opcode
            attrs = attrs_of[instr.name] = self._attrs(instr) if instr.attrs else ""
            if opcode == "parameter":
                n = instr.parameter_number
                base[instr.name] = self.entry_param_names.get(n, f"arg{n}") if comp.is_entry else f"p{n}"
                continue
            operands = [base.get(op, op) for op in instr.operands]
            if opcode in COMMUTATIVE:
                operands.sort()
            key = "|".join((opcode, instr.shape.text, ",".join(operands), attrs, instr.literal))
            base[instr.name] = f"{opcode}.{_digest(key)}"
        order = print_order(comp, base)
        names: dict[str, str] = {}
        taken: dict[str, int] = {}
        for instr in order:
            name = base[instr.name]
            copies = taken.get(name, 0)
            taken[name] = copies + 1
            # Identical instructions repeated (constants, mostly): number the copies in printed order.
            names[instr.name] = f"{name}.{copies + 1}" if copies else name
        body: list[str] = []
        callees: list[str] = []
        for instr in order:
            opcode = instr.opcode
            attrs = attrs_of[instr.name]
            if "control-predecessors" in instr.attrs:  # they may be printed later: named only now
                attrs = self._render_attrs(instr, names)
            if opcode == "parameter" and comp.is_entry:
                args = ""  # position is the line order; a number would shift on every insertion
            elif opcode in ("parameter", "constant"):
                args = instr.literal
            else:
                operands = [names.get(op, op) for op in instr.operands]
                if opcode in COMMUTATIVE:
                    operands.sort()
                args = "%" + ", %".join(operands) if operands else ""
            if not COMPUTATION_ATTRS.isdisjoint(instr.attrs):
                callees.extend(self.computation_names[c] for key in sorted(instr.attrs) if key in COMPUTATION_ATTRS
                               for c in split_name_list(instr.attrs[key]))
            root = "ROOT " if instr.is_root else ""
            body.append(f"  {root}%{names[instr.name]} = {instr.shape.text} {opcode}({args}){attrs}")
        tail = "}" + "".join(f", {k}={v}" for k, v in sorted(comp.attrs.items()))  # execution_thread
        if comp.is_entry:
            canonical = strip_number_suffix(comp.name)
        else:
            # Counter numbers hide inside names too (region_1.3.clone.1.clone, while.90_computation):
            # keep only the words, which say what kind of computation it is. The same words and body are the
            # same computation (jax emits one reducer / threefry per call site): it prints once.
            prefix = _COUNTER.sub("", comp.name).strip("._-") or "computation"
            canonical = f"{prefix}.{_digest(chr(10).join(body) + tail)}"
        self.computation_names[comp.name] = canonical
        if canonical not in self.bodies:
            head = f"ENTRY %{canonical} {{" if comp.is_entry else f"%{canonical} {{"
            self.bodies[canonical] = [head, *body, tail]
            self.callees[canonical] = callees

    def print_order(self, entry: str) -> list[str]:
        """Canonical computation names, callees first, each in the order its caller names them; from the
        entry, then computations nobody calls (by name); the entry last."""
        order: list[str] = []
        seen: set[str] = set()

        def visit(name: str) -> None:
            stack = [(name, iter(self.callees[name]))]
            seen.add(name)
            while stack:
                current, callees = stack[-1]
                for callee in callees:
                    if callee not in seen:
                        seen.add(callee)
                        stack.append((callee, iter(self.callees[callee])))
                        break
                else:
                    stack.pop()
                    order.append(current)

        visit(entry)
        order.pop()
        for name in sorted(self.bodies):
            if name not in seen:
                visit(name)
        return [*order, entry]

    def _attrs(self, instr: Instruction) -> str:
        """``, key=value`` for every kept attribute but control predecessors, sorted by key: what the
        instruction's name is a digest of (control predecessors order it, they do not change its value)."""
        if not COMPUTATION_ATTRS.isdisjoint(instr.attrs):
            return self._render_attrs(instr, None)
        # Attributes that name nothing render the same wherever they appear, and a module has few
        # distinct lists of them (", dimensions={0,1}", ", direction=EQ", ...): render each list once.
        key = tuple(instr.attrs.items())
        rendered = self.rendered_attrs.get(key)
        if rendered is None:
            rendered = self.rendered_attrs[key] = self._render_attrs(instr, None)
        return rendered

    def _render_attrs(self, instr: Instruction, names: dict[str, str] | None) -> str:
        """The attributes as printed; control predecessors only with ``names`` (their canonical names)."""
        rendered = ""
        for key in sorted(instr.attrs):
            if key in VOLATILE_ATTRS:
                continue
            value = instr.attrs[key]
            if key in COMPUTATION_ATTRS:
                value = _name_list(value, (self.computation_names[c] for c in split_name_list(value)))
            elif key in _INSTR_REF_ATTRS:
                if names is None:
                    continue
                value = _name_list(value, (names.get(c, c) for c in split_name_list(value)))
            elif key == "backend_config" and _kernel_call(instr):
                value = '"<kernel body dropped>"'
            rendered += f", {key}={value}"
        return rendered


def _name_list(original: str, names: Iterable[str]) -> str:
    rendered = ", ".join(f"%{n}" for n in names)
    return f"{{{rendered}}}" if original.strip().startswith("{") else rendered


def _entry_param_names(params: Sequence[EntryParam]) -> dict[int, str]:
    """Entry parameter -> its state path as an HLO name, which params.path_from_mangled_name reads back:
    characters a name cannot hold become ``_``, a path ending in a number gets a ``_`` (else it would read as
    a counter), a second parameter of one path is ``<path>-<number>``."""
    names: dict[int, str] = {}
    seen: set[str] = set()
    for p in params:
        path = _NOT_IN_NAME.sub("_", p.path)
        if not path[:1].isalpha() and not path.startswith("_"):
            path = "_" + path
        if _NUMBER_SUFFIX_AT_END.search(path):
            path += "_"
        name = path if path not in seen else f"{path}-{p.index}"
        seen.add(name)
        names[p.index] = name
    return names


def normalize(module: HloModule, params: Sequence[EntryParam] | None = None) -> str:
    """The module's canonical text (ends with a newline)."""
    namer = _Namer(params if params is not None else entry_params(module))
    header_attrs = ", ".join(f"{k}={v}" for k, v in sorted(module.header_attrs.items())
                             if k != "entry_computation_layout" or not spells_out_defaults(module, v))
    lines = [f"HloModule {strip_number_suffix(module.name)}" + (f", {header_attrs}" if header_attrs else "")]
    for comp in call_graph_postorder(module):
        namer.computation(comp)
    for name in namer.print_order(namer.computation_names[module.entry.name]):
        lines.append("")
        lines.extend(namer.bodies[name])
    return "\n".join(lines) + "\n"


def spells_out_defaults(module: HloModule, layout: str) -> bool:
    """Whether ``entry_computation_layout`` says what XLA assumes without it: each entry parameter's and the
    root's own layout, the default one where the shape has none."""
    entry = module.entry
    implied = "{(" + ",".join(with_default_layout(p.shape) for p in entry.parameters) + ")->" + \
        with_default_layout(entry.root.shape) + "}"
    return _SPACE.sub("", layout) == _SPACE.sub("", implied)
