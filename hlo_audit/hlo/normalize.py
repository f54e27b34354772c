"""Canonical HLO text for goldens and diffs.

XLA names instructions from a module-wide counter (``add.123``), so one inserted instruction renumbers
everything printed after it and a golden diff drowns in renames. Naming a value by a digest of everything
upstream of it (a Merkle hash) does no better: an inserted instruction renames every value downstream of it, and
a computation named by a digest of its body renames its callers when one line of it changes (MaxText's
2c4910630, +89 instructions, rewrote 4,245 of a golden's lines). So a name here says only what is local to
the value (as LLVM's IRNormalizer names from operands' opcodes, not their names): its opcode and a digest of its
shape, its semantic attributes and what kind of value each operand is (an opcode and shape; a parameter, a
constant or a tuple element by what it is), numbered in printed order where two share that (``.2``).
Entry parameters are named by their state path, nested parameters by position; computations by their words
and a digest of their signature (parameter and root shapes, the root's opcode), numbered likewise, so a body
whose lines change keeps its name. Inserting one instruction then changes its own line, its users' lines and
their users' operand names, and renumbers only the values printed after it that share its name: a golden's git
diff is about the size of the change. The text is still canonical: names are a function of the graph, so two
programs print alike exactly when they are the same program (the diff matches them as graphs: match.py).

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
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

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


@dataclass(slots=True)
class _Placed:
    """An instruction placed in printed order, before it is told apart from others of its base name."""

    instr: Instruction
    name: str  # its name in the module
    base: str  # its name but for telling alike ones apart: a digest of what is local to it
    shape: str
    attrs: str  # its attributes as printed, control predecessors but for their names
    args: str  # what its parentheses print where that names no operand (a literal, a parameter's number)
    operands: list[str] | None  # its operands in printed order (their names printed once all are named)
    source: bool  # a parameter or an element of one: what the values it reaches are told apart by


# A computation's provisional name (``_Namer._keep``): its words and signature, \x01, its body's digest.
_PROVISIONAL = re.compile("[\\w.\\-]+\x01[0-9a-f]{8}")
_PROVISIONAL_BODY = re.compile("\x01[0-9a-f]{8}")
_FAR = 1 << 30  # steps from a value no source reaches
_NONE = (_FAR, frozenset())


def _told_apart(placed: Sequence[_Placed]) -> dict[str, str]:
    """Each placed instruction's canonical name: its base name where no other has it, else the base and four hex
    digits of what tells them apart without counting: the parameters (and their tuple elements) fewest steps upstream
    of it (an unrolled layer's ops by its weights, a norm's running sum by the leaf it adds; the nearest only, so
    that a parameter added elsewhere renames nothing but what it feeds) and, where those are alike too, its first
    user: its base name and what its other operands are (a constant by what reads it: the first only, so that a
    constant read in fifty places keeps its name when one of them changes); ``.2``, ``.3`` in printed order only
    where those are alike too. Counting alone
    would rename every later value of one base when one is inserted (a global norm's chain of adds)."""
    names = {at.name: at.base for at in placed}
    bases = names.copy()
    seen: dict[str, int] = {}
    for at in placed:
        seen[at.base] = seen.get(at.base, 0) + 1
    alike = {base for base, n in seen.items() if n > 1}
    if not alike:
        return names
    nearest: dict[str, tuple[int, frozenset[str]]] = {}  # the sources fewest joins upstream, and how many
    first_user: dict[str, _Placed] = {}  # the first instruction printed that reads each
    for at in placed:  # operands come first
        operands = at.operands
        if at.source:
            nearest[at.name] = (0, frozenset((at.base,)))
        elif not operands:
            nearest[at.name] = _NONE
        elif len(operands) == 1:  # most instructions: what its operand has
            op = operands[0]
            if op not in first_user:
                first_user[op] = at
            nearest[at.name] = nearest.get(op, _NONE)
        else:
            # A step is a join: where two operands bring sources. A value passed through ops that bring none (a
            # convert, a negate, a multiply by a constant inserted) keeps its nearest sources.
            steps, found, bringing = _FAR, frozenset(), 0
            for op in operands:
                if op not in first_user:
                    first_user[op] = at
                d, upstream = nearest.get(op, _NONE)
                if d == _FAR:
                    continue
                bringing += 1
                if d < steps:
                    steps, found = d, upstream
                elif d == steps and upstream is not found:
                    found = found | upstream
            nearest[at.name] = (steps + (bringing > 1), found)
    # What tells an alike instruction apart: the sources nearest upstream; where other instructions of its base name
    # have those too, its first user (its base name and what its other operands are); its number in printed order
    # where all that is alike too (the same value computed twice). Never its operands' names: a name told apart by
    # another's carries every rename upstream of it downstream (a global norm's, into every clipped update).
    said: dict[int, str] = {}  # a set of sources in words, by identity: most values share their operand's set

    def in_words(sources: frozenset[str]) -> str:
        words = said.get(id(sources))
        if words is None:
            words = said[id(sources)] = ",".join(sorted(sources))
        return words

    nearest_of = {at.name: at.base + "|" + in_words(nearest[at.name][1])
                  for at in placed if at.base in alike}
    alike_nearest = Counter(nearest_of.values())
    numbered: dict[str, int] = {}
    for at in placed:
        if at.base in alike:
            name = at.name
            tie = nearest_of[name]
            if alike_nearest[tie] > 1:
                user = first_user.get(name)
                if user is not None:
                    others = (nearest_of.get(op, bases.get(op, "")) for op in user.operands or () if op != name)
                    tie += "|" + user.base + "|" + ",".join(others)
            tie = f"{at.base}.{_digest(tie)[:4]}"
            n = numbered[tie] = numbered.get(tie, 0) + 1
            names[name] = tie if n == 1 else f"{tie}.{n}"
    return names


class _Namer:
    """Canonical names and lines for one module."""

    def __init__(self, params: Sequence[EntryParam]):
        self.entry_param_names = _entry_param_names(params)
        self.computation_names: dict[str, str] = {}  # name in the module -> canonical name
        self.bodies: dict[str, list[str]] = {}  # canonical name -> lines; identical computations print once
        self.callees: dict[str, list[str]] = {}  # canonical name -> canonical callees, in the order named
        # attributes -> as printed, as a base name reads them, the computations they call
        self.rendered_attrs: dict[tuple[tuple[str, str], ...], tuple[str, str, list[str]]] = {}
        self.callees_of: dict[str, list[str]] = {}  # this computation's instruction -> canonical callees
        self.instruction_names: dict[str, dict[str, str]] = {}  # computation -> its instructions' canonical names
        self.named_bodies: dict[tuple[str, str], str] = {}  # (words, body) -> canonical name: each body prints once
        self.computations_taken: dict[str, int] = {}  # a computation name's base -> bodies named with it so far

    def computation(self, comp: Computation) -> None:
        """Name, order and print one computation (its callees are done) and keep its canonical lines.

        One depth-first walk from the root places each instruction right after what it needs and gives it its
        base name (a digest of what is local to it: opcode, shape, its literal or what kind of value each operand
        is, attributes); instructions of one base name are then told apart (``_told_apart``), and every line
        printed with its operands' names.
        """
        entry_names = self.entry_param_names if comp.is_entry else None
        self.callees_of = {}
        orders: dict[str, list[str]] = {}  # a commutative op's operands in the order visited and printed
        kinds_of: dict[str, str] = {}  # what kind of value each placed instruction is (_kind), as its users read it
        parameters = frozenset(p.name for p in comp.parameters)
        placed = [self._place(instr, orders, entry_names, kinds_of, parameters)
                  for instr in _placement_order(comp, orders)]
        names = _told_apart(placed)
        body: list[str] = []
        callees: list[str] = []
        for at in placed:
            instr = at.instr
            if instr.name in self.callees_of:
                callees.extend(self.callees_of[instr.name])
            args = "%" + ", %".join(names.get(op, op) for op in at.operands) if at.operands else at.args
            root = "ROOT " if instr.is_root else ""
            line = f"  {root}%{names[instr.name]} = {at.shape} {instr.opcode}({args}){at.attrs}"
            if "control-predecessors" in instr.attrs:
                line += self._render_attrs(instr, names, only=_INSTR_REF_ATTRS)
            body.append(line)
        self.instruction_names[comp.name] = names
        self._keep(comp, body, callees)

    def _place(self, instr: Instruction, orders: dict[str, list[str]], entry_names: dict[int, str] | None,
               kinds_of: dict[str, str], parameters: frozenset[str]) -> _Placed:
        """An instruction placed (what it needs is placed): its base name and what its line prints."""
        opcode = instr.opcode
        held = instr.attrs
        shape = _canonical_shape(instr.shape)
        # Most of jax's instructions hold metadata alone, which is dropped.
        attrs, keyed = ("", "") if not held or len(held) == 1 and "metadata" in held else self._attrs(instr)
        if opcode == "parameter":
            n = instr.parameter_number
            base = kinds_of[instr.name] = entry_names.get(n, f"arg{n}") if entry_names is not None else f"p{n}"
            args = "" if entry_names is not None else instr.literal  # entry: the line order is the number
            return _Placed(instr, instr.name, base, shape, attrs, args, None, True)
        if opcode == "constant":
            base = kinds_of[instr.name] = f"{opcode}.{_digest(f'{opcode}|{shape}|{instr.literal}|{keyed}')}"
            return _Placed(instr, instr.name, base, shape, attrs, instr.literal, None, False)
        # A commutative op's operands print in the order they were visited (so the text reads back to the same
        # order) and enter its name sorted (so either order names it alike).
        operands = orders.get(instr.name, instr.operands)
        kinds = [kinds_of.get(op, op) for op in operands]
        what = "|".join(sorted(kinds) if opcode in COMMUTATIVE else kinds)
        base = f"{opcode}.{_digest(f'{opcode}|{shape}|{what}|{keyed}')}"
        if opcode == "get-tuple-element":  # a tuple element by its index and what it is an element of
            kinds_of[instr.name] = f"{shape}{keyed}<{kinds[0] if kinds else ''}"
            source = bool(operands) and operands[0] in parameters
        else:
            kinds_of[instr.name] = f"{opcode} {shape}"
            source = False
        return _Placed(instr, instr.name, base, shape, attrs, "", list(operands), source)

    def _keep(self, comp: Computation, body: list[str], callees: list[str]) -> None:
        """Name a printed computation (provisionally: ``final_names``) and keep its lines, once per body."""
        tail = "}" + "".join(f", {k}={v}" for k, v in sorted(comp.attrs.items()))  # execution_thread
        if comp.is_entry:
            canonical = strip_number_suffix(comp.name)
        else:
            # Counter numbers hide inside names too (region_1.3.clone.1.clone, while.90_computation):
            # keep only the words, which say what kind of computation it is. The same words and body are the
            # same computation (jax emits one reducer / threefry per call site): it prints once. Its name is its
            # words and signature where no other body has them, so that a body whose lines change keeps its name
            # (and its callers their lines); the body's digest tells apart those that share them. Which is so is
            # known once every computation is read: until then the name holds both (``_PROVISIONAL``).
            words = computation_words(comp.name)
            root = comp.root
            signature = ",".join(_canonical_shape(p.shape) for p in comp.parameters)
            key = f"{words}.{_digest(f'{signature}->{_canonical_shape(root.shape)} {root.opcode}')}"
            canonical = f"{key}\x01{_digest(words + chr(10).join(body) + tail)}"
        self.computation_names[comp.name] = canonical
        if canonical not in self.bodies:
            self.bodies[canonical] = [*body, tail]
            self.callees[canonical] = callees

    def rename(self, final: dict[str, str]) -> None:
        """Every provisional computation name replaced by its canonical one (``final_names``)."""
        self.computation_names = {name: final.get(c, c) for name, c in self.computation_names.items()}
        self.bodies = {final.get(c, c): body for c, body in self.bodies.items()}
        self.callees = {final.get(c, c): [final.get(x, x) for x in callees] for c, callees in self.callees.items()}

    def final_names(self) -> dict[str, str]:
        """Each printed computation's provisional name -> its canonical one: its words and signature (``key``) where
        only one body has them, else those and its body's digest."""
        bodies_of: dict[str, list[str]] = {}
        for provisional in self.bodies:
            key, sep, _ = provisional.partition("\x01")
            if sep:
                bodies_of.setdefault(key, []).append(provisional)
        final = {}
        for key, provisionals in bodies_of.items():
            for provisional in provisionals:
                final[provisional] = key if len(provisionals) == 1 else key + "." + provisional.partition("\x01")[2]
        return final

    def print_order(self, entry: str) -> list[str]:
        """Canonical computation names, callees first, a caller's callees by name (so that where a computation
        prints does not follow where in its caller the call moved); from the entry, then computations nobody
        calls (by name); the entry last."""
        order: list[str] = []
        seen: set[str] = set()

        def visit(name: str) -> None:
            stack = [(name, iter(sorted(set(self.callees[name]))))]
            seen.add(name)
            while stack:
                current, callees = stack[-1]
                for callee in callees:
                    if callee not in seen:
                        seen.add(callee)
                        stack.append((callee, iter(sorted(set(self.callees[callee])))))
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

    def _attrs(self, instr: Instruction) -> tuple[str, str]:
        """``, key=value`` for every kept attribute but control predecessors, sorted by key, as printed and as the
        instruction's base name reads it (a computation it calls by words and signature: a callee's body changed
        renames no caller). Records the computations it calls, in that order, in ``callees_of``."""
        # A module has few distinct attribute lists once metadata is left out (", dimensions={0,1}",
        # ", to_apply=%region_0.5"...), and each renders the same wherever it appears: render each once.
        key = tuple(item for item in instr.attrs.items() if item[0] not in VOLATILE_ATTRS)
        cached = self.rendered_attrs.get(key)
        if cached is None:
            callees = [self.computation_names[c] for name, value in sorted(key) if name in COMPUTATION_ATTRS
                       for c in split_name_list(value)]
            text = self._render_attrs(instr)
            cached = self.rendered_attrs[key] = (text, _PROVISIONAL_BODY.sub("", text) if callees else text, callees)
        if cached[2]:
            self.callees_of[instr.name] = cached[2]
        return cached[0], cached[1]

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
    final = namer.final_names()
    namer.rename(final)

    def named(line: str) -> str:
        return _PROVISIONAL.sub(lambda m: final[m.group(0)], line) if "\x01" in line else line

    for name in namer.print_order(namer.computation_names[module.entry.name]):
        body = namer.bodies[name]
        lines.append("")
        lines.append(f"ENTRY %{name} {{" if name == namer.computation_names[module.entry.name] else f"%{name} {{")
        lines.extend(named(line) for line in body)
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
