"""Canonical HLO text for goldens and diffs.

XLA names instructions from a module-wide counter (``add.123``), so one inserted instruction renumbers
everything printed after it and a golden diff drowns in renames. Here, as in LLVM's IRNormalizer, a
value is named from what it computes: opcode + a digest of its shape, its operands' canonical names and
its semantic attributes. Entry parameters are named by their state path, nested parameters by position,
computations by a digest of their canonical body. Inserting or removing one instruction then changes
only its own line and the lines that really use it.

The order is the graph's, not the printer's: parameters first by number, then every instruction right
after the operands (and control predecessors) it needs, depth first from the root (a commutative op's
operands by what they are); computations callees first. So a shared constant, or any instruction that
depends on nothing before it, prints in the same place wherever the printer put it. A shape without a layout
prints with XLA's default one (the same shape to XLA). An ``entry_computation_layout`` that only spells out the
default layouts of the entry's parameters and root says nothing and is left out, as are comments, and so are the
SPMD propagation flags of a one-partition module (compile options XLA's dump prints and jax's lowering does not:
``header_attr_says_nothing``), so a module read from a dump and the same module lowered print alike.

Dropped as volatile: metadata (op_name, source file/line, stack_frame_id), the dump's FileNames /
StackFrames tables, ``/*index=N*/`` comments, module-id suffixes, and serialized kernel bodies in
``backend_config`` of Mosaic / Triton custom calls. Kept: opcodes, shapes, layouts, shardings and every
other attribute, a JSON-valued one (``backend_config``) with its keys sorted (json_attrs.py: two XLA clients print
one config in two key orders).
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable, Iterator, Sequence

from hlo_audit.hlo.json_attrs import canonical_attr_value
from hlo_audit.hlo.kernels import KERNEL_CUSTOM_CALLS
from hlo_audit.hlo.params import EntryParam, entry_params
from hlo_audit.hlo.shapes import Shape, with_default_layout
from hlo_audit.hlo.text import (
    COMPUTATION_ATTRS,
    Computation,
    HloModule,
    Instruction,
    cyclic_gc_paused,
    split_name_list,
    strip_number_suffix,
)

VOLATILE_ATTRS = frozenset({"metadata", "statistics_viz", "origin"})
COMMUTATIVE = frozenset({"add", "multiply", "maximum", "minimum", "and", "or", "xor"})
_INSTR_REF_ATTRS = frozenset({"control-predecessors"})


# Counter numbers (region_1.3.clone.1) and this module's own digests (region.1a2b3c4d): not the kind of
# computation, so not part of its canonical name.
_COUNTER = re.compile(r"[._-](?:\d+|[0-9a-f]{8})(?=$|[._-])")
_SPACE = re.compile(r"\s+")
_NOT_IN_NAME = re.compile(r"[^\w.\-]")
_NUMBER_SUFFIX_AT_END = re.compile(r"\.\d+$")


def computation_words(name: str) -> str:
    """What kind of computation a name says, its counters and digests dropped: ``region_1.3.clone.1`` ->
    ``region.clone``, ``while.90_computation`` -> ``while_computation``."""
    return _COUNTER.sub("", name).strip("._-") or "computation"


def _digest(text: str) -> str:
    """Eight hex digits of ``text``: CRC-32, the same in every process and fast (a module has ~100k)."""
    return f"{zlib.crc32(text.encode()):08x}"


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
    return [c for instr in comp.instructions if not COMPUTATION_ATTRS.isdisjoint(instr.attrs)
            for c in instr.called_computations()]


def _needs(instr: Instruction, by_name: dict[str, Instruction], orders: dict[str, list[str]]):
    """What prints before an instruction: its operands, a commutative op's by what they are (opcode, shape,
    literal; ties as written, and kept in ``orders`` for its line), then its control predecessors."""
    needs = instr.operands
    if instr.opcode in COMMUTATIVE and len(needs) > 1:
        needs = orders[instr.name] = sorted(needs, key=lambda ref: _what(by_name.get(ref)))
    if "control-predecessors" in instr.attrs:
        needs = (*needs, *split_name_list(instr.attrs["control-predecessors"]))
    return needs


_CANONICAL_SHAPES: dict[str, str] = {}  # shape text -> with its default layout (few distinct shapes)


def _canonical_shape(shape: Shape) -> str:
    """The shape with XLA's default layout where it has none: ``f32[4]`` and ``f32[4]{0}`` are one shape."""
    text = _CANONICAL_SHAPES.get(shape.text)
    if text is None:
        text = _CANONICAL_SHAPES[shape.text] = with_default_layout(shape)
    return text


def _what(instr: Instruction | None) -> tuple[str, str, str]:
    """What an operand is, before it has a name (rng.RNG_VALUE is nothing)."""
    return ("", "", "") if instr is None else (instr.opcode, instr.shape.text, instr.literal)


def _kernel_call(instr: Instruction) -> bool:
    return any(k in instr.custom_call_target for k in KERNEL_CUSTOM_CALLS)


def _placement_order(comp: Computation, orders: dict[str, list[str]]) -> Iterator[Instruction]:
    """``comp``'s instructions in printed order, each after what it needs: parameters first, by number; then
    depth first from the root; what the root does not reach, as written. A commutative op's operand order is
    kept in ``orders``."""
    by_name = comp.by_name
    seen: set[str] = set()
    for start in (*comp.parameters, comp.root, *comp.instructions):
        if start.name in seen:
            continue
        seen.add(start.name)
        stack = [(start, iter(_needs(start, by_name, orders)))]
        while stack:
            instr, needs = stack[-1]
            for ref in needs:  # what it needs comes first (a DAG: nothing on the stack is needed again)
                if ref not in seen and ref in by_name:  # not a placeholder (rng.RNG_VALUE)
                    seen.add(ref)
                    needed = by_name[ref]
                    plain = needed.opcode not in COMMUTATIVE and "control-predecessors" not in needed.attrs
                    stack.append((needed, iter(needed.operands if plain else _needs(needed, by_name, orders))))
                    break
            else:
                stack.pop()
                yield instr


class _Namer:
    """Canonical names and lines for one module."""

    def __init__(self, params: Sequence[EntryParam]):
        self.entry_param_names = _entry_param_names(params)
        self.computation_names: dict[str, str] = {}  # name in the module -> canonical name
        self.bodies: dict[str, list[str]] = {}  # canonical name -> lines; identical computations print once
        self.callees: dict[str, list[str]] = {}  # canonical name -> canonical callees, in the order named
        self.rendered_attrs: dict[tuple[tuple[str, str], ...], tuple[str, list[str]]] = {}  # -> text, callees
        self.callees_of: dict[str, list[str]] = {}  # this computation's instruction -> canonical callees
        self.instruction_names: dict[str, dict[str, str]] = {}  # computation -> its instructions' canonical names

    def computation(self, comp: Computation) -> None:
        """Name, order and print one computation (its callees are done) and keep its canonical lines.

        One depth-first walk from the root places each instruction right after what it needs; placing it
        names it (a digest of what it computes: opcode, shape, its operands' names or literal, attributes)
        and prints its line. Identical instructions are numbered in printed order (``.2``, ``.3``).
        """
        entry_names = self.entry_param_names if comp.is_entry else None
        self.callees_of = {}
        names: dict[str, str] = {}  # canonical names; holding one means placed
        taken: dict[str, int] = {}
        body: list[str] = []
        late: list[tuple[int, Instruction]] = []  # lines naming control predecessors printed after them
        callees: list[str] = []
        orders: dict[str, list[str]] = {}  # a commutative op's operands in the order visited and printed
        for instr in _placement_order(comp, orders):
            name, line = self._place(instr, names, taken, orders, entry_names)
            names[instr.name] = name
            if instr.name in self.callees_of:
                callees.extend(self.callees_of[instr.name])
            if "control-predecessors" in instr.attrs:
                late.append((len(body), instr))
            body.append(line)
        for at, instr in late:  # every instruction is named now
            body[at] += self._render_attrs(instr, names, only=_INSTR_REF_ATTRS)
        self.instruction_names[comp.name] = names
        self._keep(comp, body, callees)

    def _place(self, instr: Instruction, names: dict[str, str], taken: dict[str, int], orders: dict[str, list[str]],
               entry_names: dict[int, str] | None) -> tuple[str, str]:
        """An instruction placed (what it needs is named): its canonical name and its line."""
        opcode = instr.opcode
        held = instr.attrs
        shape = _canonical_shape(instr.shape)
        # Placed: named and printed. Most of jax's instructions hold metadata alone, which is dropped.
        attrs = "" if not held or len(held) == 1 and "metadata" in held else self._attrs(instr)
        if opcode == "parameter":
            n = instr.parameter_number
            name = entry_names.get(n, f"arg{n}") if entry_names is not None else f"p{n}"
            args = "" if entry_names is not None else instr.literal  # entry: the line order is the number
        else:
            # A commutative op's operands print in the order they were visited (so the text reads
            # back to the same order) and enter its name sorted (so either order names it alike).
            operands = [names.get(op, op) for op in orders.get(instr.name, instr.operands)]
            args = instr.literal if opcode == "constant" else "%" + ", %".join(operands) if operands else ""
            what = f"%{', %'.join(sorted(operands))}" if opcode in COMMUTATIVE else args
            name = f"{opcode}.{_digest(f'{opcode}|{shape}|{what}|{attrs}')}"
            copies = taken.get(name, 0)
            taken[name] = copies + 1
            if copies:  # identical instructions repeated (constants, mostly)
                name = f"{name}.{copies + 1}"
        root = "ROOT " if instr.is_root else ""
        return name, f"  {root}%{name} = {shape} {opcode}({args}){attrs}"

    def _keep(self, comp: Computation, body: list[str], callees: list[str]) -> None:
        """Name a printed computation and keep its lines, once per canonical name."""
        tail = "}" + "".join(f", {k}={v}" for k, v in sorted(comp.attrs.items()))  # execution_thread
        if comp.is_entry:
            canonical = strip_number_suffix(comp.name)
        else:
            # Counter numbers hide inside names too (region_1.3.clone.1.clone, while.90_computation):
            # keep only the words, which say what kind of computation it is. The same words and body are the
            # same computation (jax emits one reducer / threefry per call site): it prints once.
            canonical = f"{computation_words(comp.name)}.{_digest(chr(10).join(body) + tail)}"
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
        instruction's name is a digest of (control predecessors order it, they do not change its value).
        Records the computations it calls, in that order, in ``callees_of``."""
        # A module has few distinct attribute lists once metadata is left out (", dimensions={0,1}",
        # ", to_apply=%region_0.5"...), and each renders the same wherever it appears: render each once.
        key = tuple(item for item in instr.attrs.items() if item[0] not in VOLATILE_ATTRS)
        cached = self.rendered_attrs.get(key)
        if cached is None:
            callees = [self.computation_names[c] for name, value in sorted(key) if name in COMPUTATION_ATTRS
                       for c in split_name_list(value)]
            cached = self.rendered_attrs[key] = (self._render_attrs(instr), callees)
        if cached[1]:
            self.callees_of[instr.name] = cached[1]
        return cached[0]

    def _render_attrs(self, instr: Instruction, names: dict[str, str] | None = None,
                      only: frozenset[str] | None = None) -> str:
        """The attributes as printed, control predecessors only with ``names`` (theirs) and alone (``only``)."""
        rendered = ""
        for key in sorted(instr.attrs):
            if key in VOLATILE_ATTRS or (only is not None and key not in only):
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
            else:
                value = canonical_attr_value(value)  # a JSON object's keys in one order: json_attrs.py
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
    return normalize_with_printed(module, params)[0]


def normalize_with_printed(module: HloModule,
                           params: Sequence[EntryParam] | None = None) -> tuple[str, frozenset[str]]:
    """The canonical text and the module's computations it prints: one of each set of identical ones."""
    with cyclic_gc_paused():
        _, text, printed = _normalize(module, params)
    return text, printed


def normalize_with_names(module: HloModule, params: Sequence[EntryParam] | None = None
                         ) -> tuple[str, frozenset[str], dict[tuple[str, str], tuple[str, str]]]:
    """``normalize_with_printed``, and each (computation, instruction) of the module -> its (computation,
    instruction) in the canonical text: what carries facts the text drops (an instruction's metadata) onto it.
    Identical computations (printed once) name their instructions alike."""
    with cyclic_gc_paused():
        namer, text, printed = _normalize(module, params)
    names = {(comp, instr): (namer.computation_names[comp], canonical)
             for comp, instructions in namer.instruction_names.items() for instr, canonical in instructions.items()}
    return text, printed, names


def _normalize(module: HloModule, params: Sequence[EntryParam] | None) -> tuple[_Namer, str, frozenset[str]]:
    namer = _Namer(params if params is not None else entry_params(module))
    header_attrs = ", ".join(f"{k}={v}" for k, v in sorted(module.header_attrs.items())
                             if not header_attr_says_nothing(module, k, v))
    lines = [f"HloModule {strip_number_suffix(module.name)}" + (f", {header_attrs}" if header_attrs else "")]
    for comp in call_graph_postorder(module):
        namer.computation(comp)
    for name in namer.print_order(namer.computation_names[module.entry.name]):
        lines.append("")
        lines.extend(namer.bodies[name])
    first_of_each: dict[str, str] = {}
    for name, canonical in namer.computation_names.items():
        first_of_each.setdefault(canonical, name)
    return namer, "\n".join(lines) + "\n", frozenset(first_of_each.values())


# Compile options only XLA's sharding propagation reads, and XLA runs it only on a module of more than one partition
# (its compilers add the SPMD passes when num_partitions > 1). PJRT sets them when it compiles (jax's unspecified
# in and out shardings give {true,...}), so XLA's dump of the module before optimizations prints them and jax's
# own lowering does not: one partition, they say nothing about the program.
SPMD_PROPAGATION_ATTRS = frozenset({"allow_spmd_sharding_propagation_to_parameters",
                                    "allow_spmd_sharding_propagation_to_output"})


def header_attr_says_nothing(module: HloModule, key: str, value: str) -> bool:
    """Whether a header attribute only says what XLA does without it, so the canonical text leaves it out: an
    ``entry_computation_layout`` of the default layouts, SPMD propagation flags of a one-partition module."""
    if key == "entry_computation_layout":
        return spells_out_defaults(module, value)
    if key in SPMD_PROPAGATION_ATTRS:
        partitions = module.header_attrs.get("num_partitions", "1").strip()
        return not partitions.isdigit() or int(partitions) <= 1
    return False


def spells_out_defaults(module: HloModule, layout: str) -> bool:
    """Whether ``entry_computation_layout`` says what XLA assumes without it: each entry parameter's and the
    root's own layout, the default one where the shape has none."""
    entry = module.entry
    implied = "{(" + ",".join(with_default_layout(p.shape) for p in entry.parameters) + ")->" + \
        with_default_layout(entry.root.shape) + "}"
    return _SPACE.sub("", layout) == _SPACE.sub("", implied)
