"""Which entry parameters a value of an optimized module is, unchanged: what a launch reads (launches.py) and
what a changed instruction reads (change_places.py).

Each launch's HLO instruction is found by name in the module after optimizations, and each of its
operands is followed back to the entry parameters whose value it is: through get-tuple-element, tuple,
bitcast, copy (and copy-start/done), optimization barriers, while loop state (a body parameter element is the
loop's initial value for it, a while result the body's root element), conditional branch and called
computations' parameters. A value some other kernel computed is not followed further: ``reads`` are the
parameters a launch reads directly, which for a counter increment is the counter itself.
"""

from __future__ import annotations

from collections.abc import Callable

from hlo_audit.hlo.text import COMPUTATION_ATTRS, Computation, HloModule, Instruction, split_name_list

# Operations whose result is (part of) an operand's value, unchanged: attribution follows them.
_PASS_THROUGH = frozenset({"bitcast", "copy", "optimization-barrier", "add-dependency", "domain"})


class ParameterReads:
    """Follows values of an optimized module back to the entry parameters they are (module doc)."""

    def __init__(self, module: HloModule, pass_through: Callable[[Instruction], bool] | None = None):
        """``pass_through``: the instructions whose result is their first operand's value, for this question (a
        launch's reads: the default, ops that move a value unchanged)."""
        self.module = module
        self.passes = pass_through or (lambda instr: instr.opcode in _PASS_THROUGH)
        self.where: dict[str, tuple[Computation, Instruction]] = {}
        # Called computation -> (calling computation, caller, attribute, position in the attribute's list).
        self.callers: dict[str, list[tuple[Computation, Instruction, str, int]]] = {}
        for comp in module.computations.values():
            for instr in comp.instructions:
                self.where.setdefault(instr.name, (comp, instr))
                if COMPUTATION_ATTRS.isdisjoint(instr.attrs):
                    continue
                for key, value in instr.attrs.items():
                    if key in COMPUTATION_ATTRS:
                        for position, name in enumerate(split_name_list(value)):
                            self.callers.setdefault(name, []).append((comp, instr, key, position))
        self._memo: dict[tuple[str, str, tuple[int, ...]], frozenset[int]] = {}

    def instruction(self, name: str) -> tuple[Computation, Instruction] | None:
        return self.where.get(name)

    def operand_reads(self, name: str) -> frozenset[int]:
        """Entry parameter numbers the operands of instruction ``name`` are (empty if it is not in the module)."""
        found = self.where.get(name)
        if found is None:
            return frozenset()
        comp, instr = found
        reads: set[int] = set()
        for operand in instr.operands:
            reads |= self.value(comp, operand, ())
        return frozenset(reads)

    def value(self, comp: Computation, name: str, index: tuple[int, ...]) -> frozenset[int]:
        """Entry parameters that element ``index`` of value ``name`` in ``comp`` is, unchanged."""
        key = (comp.name, name, index)
        memo = self._memo.get(key)
        if memo is not None:
            return memo
        self._memo[key] = frozenset()  # a cycle (loop state) adds nothing new
        result = frozenset(self._value(comp, name, index))
        self._memo[key] = result
        return result

    def _value(self, comp: Computation, name: str, index: tuple[int, ...]) -> set[int]:
        instr = comp.by_name.get(name)
        if instr is None:
            return set()
        op = instr.opcode
        if op == "parameter":
            return self._parameter(comp, instr, index)
        if op == "get-tuple-element":
            return set(self.value(comp, instr.operands[0], (int(instr.attrs.get("index", "0")), *index)))
        if op == "tuple":
            if index:
                return set(self.value(comp, instr.operands[index[0]], index[1:])) if index[0] < len(
                    instr.operands) else set()
            return set().union(*(self.value(comp, o, ()) for o in instr.operands))
        if instr.operands and self.passes(instr):
            return set(self.value(comp, instr.operands[0], index))
        if op == "copy-done" and instr.operands:
            start = comp.by_name.get(instr.operands[0])
            if start is not None and start.opcode == "copy-start" and start.operands:
                return set(self.value(comp, start.operands[0], index))
            return set()
        if op == "copy-start" and instr.operands and index and index[0] in (0, 1):
            return set(self.value(comp, instr.operands[0], index[1:]))
        if op == "while":
            body = self.module.computations.get(instr.attrs.get("body", "").strip().lstrip("%"))
            return set(self.value(body, body.root.name, index)) if body and body.instructions else set()
        if op == "conditional" or op == "call":
            reads: set[int] = set()
            for called in instr.called_computations():
                target = self.module.computations.get(called)
                if target is not None and target.instructions:
                    reads |= self.value(target, target.root.name, index)
            return reads
        return set()  # computed here: a kernel's output, a constant...

    def _parameter(self, comp: Computation, instr: Instruction, index: tuple[int, ...]) -> set[int]:
        number = instr.parameter_number or 0
        if comp.is_entry:
            return {number}
        reads: set[int] = set()
        for caller_comp, caller, attribute, position in self.callers.get(comp.name, ()):
            if attribute in ("body", "condition"):
                operand = 0  # the loop's initial state; later iterations carry the same element
            elif attribute == "true_computation":
                operand = 1
            elif attribute == "false_computation":
                operand = 2
            elif attribute == "branch_computations":
                operand = position + 1
            elif attribute in ("calls", "called_computations", "async_wrapped_computation"):
                operand = number
            else:  # to_apply, scatter, select: applied per element, not a value of the program
                continue
            if operand < len(caller.operands):
                reads |= self.value(caller_comp, caller.operands[operand], index)
        return reads
