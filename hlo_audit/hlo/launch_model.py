"""What one GPU step launches, predicted from the scheduled module after optimizations, before any code exists
(stage optimized), and the count a stage's kept dump gives (``step_launches``: the thunk sequence when codegen
wrote one, launches.py, else this prediction).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from hlo_audit.hlo.launches import Launch, LaunchReport, launch_report
from hlo_audit.hlo.loops import trip_count
from hlo_audit.hlo.param_reads import ParameterReads
from hlo_audit.hlo.params import EntryParam
from hlo_audit.hlo.text import Computation, HloModule, Instruction
from hlo_audit.hlo.thunks import category

# Custom call targets XLA's GPU backend runs as library thunks of their own kind; AllocateBuffer emits none.
_LIBRARY_TARGETS = (("__cublas$lt$matmul", "kCublasLtMatmul"), ("__cublas$gemm", "kGemm"), ("__cudnn$", "kCuDnn"),
                    ("__cub$", "kCubSort"), ("__cufft", "kFft"))
_NO_THUNK_TARGETS = frozenset({"AllocateBuffer"})
_NO_WORK = frozenset({"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "optimization-barrier",
                      "after-all", "add-dependency", "domain", "opt-barrier"})
_COLLECTIVE_OPCODES = re.compile(r"^(all-gather|all-reduce|all-to-all|ragged-all-to-all|reduce-scatter|"
                                 r"collective-permute|collective-broadcast)(-start)?$")


def module_launches(module: HloModule, params: Sequence[EntryParam] = ()) -> LaunchReport:
    """Launches per step predicted from the scheduled module after optimizations, before any code exists.

    One thunk per fusion (a generated kernel; a cuDNN fusion a library call; a fused collective XLA's collective
    kernel), per custom call (its library
    kind; ``AllocateBuffer`` none), per copy and copy-start, per collective (``*-done`` none), per host
    transfer (a fusion XLA runs as a copy: a slice of contiguous bytes, or a dynamic slice at an address computed
    on the host, its root marked ``dynamic_slice_config``); none for parameters, constants, tuples, get-tuple-element,
    bitcasts; while bodies per trip,
    conditionals by their largest branch, async and called computations through. Scalar: a loop fusion whose
    outputs are one element each (an in-place dynamic-update-slice's: its update), which XLA launches as one block
    of one thread. What only codegen decides is
    not seen: a sort fusion's extra copy into its output buffer, a reduction's memset, a copy elided by buffer
    assignment (measured equal to the thunk sequence on the GPU profile's MaxText cells: docs/gpu.md).
    """
    walk = _ModuleWalk(module)
    walk.computation(module.entry, (), 1, True)
    return LaunchReport(thunks=len(walk.launches), launches=tuple(walk.launches), params=tuple(params),
                        unknown_trip_counts=tuple(walk.unknown), conditionals=walk.conditionals, attributed=True,
                        from_module=True)


class _ModuleWalk:
    """One walk of a module from its entry: the launches each instruction would be, the loops whose trip count is
    not known and the conditionals it met (``module_launches``)."""

    def __init__(self, module: HloModule):
        self.module = module
        self.reads = ParameterReads(module)
        self.launches: list[Launch] = []
        self.unknown: list[str] = []
        self.conditionals = 0

    def computation(self, comp: Computation, scope: tuple[str, ...], times: int, counted: bool) -> int:
        """Add the launches of ``comp``'s instructions (and of what they call); return its launches per step."""
        module = self.module
        total = 0
        for instr in comp.instructions:
            op = instr.opcode
            if op in _NO_WORK or op.endswith("-done") or op == "async-update":
                continue
            if op == "while":
                total += self.while_loop(comp, instr, scope, times, counted)
            elif op == "conditional":
                total += self.conditional(instr, scope, times, counted)
            elif op in ("async-start", "call"):
                for called in instr.called_computations():
                    if called in module.computations:
                        total += self.computation(module.computations[called], scope, times, counted)
            elif (thunk := _thunk_kind(module, instr)) is not None:
                kind, scalar = thunk
                total += self.add(instr, kind, scope, times, counted, scalar)
        return total

    def add(self, instr: Instruction, kind: str, scope: tuple[str, ...], times: int, counted: bool,
            scalar: bool = False) -> int:
        self.launches.append(Launch(
            thunk_id=-1, kind=kind, category=category(kind), kernel="", instruction=instr.name,
            target=instr.custom_call_target if instr.opcode == "custom-call" else "", grid=None, threads=None,
            shared_memory=None, scope=scope, times=times, counted=counted,
            reads=tuple(sorted(self.reads.operand_reads(instr.name))), is_scalar=scalar))
        return times

    def while_loop(self, comp: Computation, instr: Instruction, scope: tuple[str, ...], times: int,
                   counted: bool) -> int:
        """The body once per trip, the condition once more (a trip count not known: once, listed)."""
        body = self.module.computations.get(instr.attrs.get("body", "").strip().lstrip("%"))
        condition = self.module.computations.get(instr.attrs.get("condition", "").strip().lstrip("%"))
        n = trip_count(self.module, comp, instr)
        if n is None:
            self.unknown.append(instr.name)
            n = 1
        total = 0
        if condition is not None:
            total += self.computation(condition, (*scope, f"{instr.name}:condition"), times * (n + 1), counted)
        if body is not None:
            total += self.computation(body, (*scope, f"{instr.name}:body"), times * n, counted)
        return total

    def conditional(self, instr: Instruction, scope: tuple[str, ...], times: int, counted: bool) -> int:
        """Every branch's launches recorded, only the largest branch's counted."""
        module = self.module
        self.conditionals += 1
        branches = [module.computations[c] for c in instr.called_computations() if c in module.computations]
        sizes = [_module_size(module, b) for b in branches]
        largest = max(range(len(branches)), key=lambda i: sizes[i]) if branches else -1
        total = 0
        for i, branch in enumerate(branches):
            added = self.computation(branch, (*scope, f"{instr.name}:{branch.name}"), times, counted and i == largest)
            total += added if i == largest else 0
        return total


def _thunk_kind(module: HloModule, instr: Instruction) -> tuple[str, bool] | None:
    """The thunk kind an instruction that does work emits, and whether it is a scalar kernel; None for a custom
    call that emits no thunk. Control flow (while, conditional, async-start, call) is the walk's."""
    op = instr.opcode
    if op == "fusion":
        return _fusion_kind(module, instr)
    if op == "custom-call":
        target = instr.custom_call_target
        if target in _NO_THUNK_TARGETS:
            return None
        return next((k for prefix, k in _LIBRARY_TARGETS if target.startswith(prefix)), "kCustomCall"), False
    if op in ("copy", "copy-start"):
        return "kCopy", False
    if collective := _COLLECTIVE_OPCODES.match(op):
        words = "".join(w.capitalize() for w in collective.group(1).split("-"))
        return "k" + words + ("Start" if op.endswith("-start") else ""), False
    if op in ("send", "recv", "infeed", "outfeed"):
        return ("kHost" + op.capitalize() if op in ("send", "recv") else "k" + op.capitalize()), False
    if op in ("partition-id", "replica-id"):
        return ("kPartitionId" if op == "partition-id" else "kReplicaId"), False
    return "kKernel", False  # an operation left unfused (sort, rng-bit-generator...): a kernel of its own


def _fusion_kind(module: HloModule, instr: Instruction) -> tuple[str, bool]:
    fused = module.computations.get(instr.attrs.get("calls", "").strip().lstrip("%"))
    if '"kind":"__cudnn$' in instr.attrs.get("backend_config", ""):
        return "kCuDnn", False
    if fused is not None and any(_COLLECTIVE_OPCODES.match(i.opcode) for i in fused.instructions):
        # A collective fused into a kernel of XLA's own (a one-shot all-reduce): kCollectiveKernel.
        return "kCollectiveKernel", False
    if fused is not None and fused.instructions and (_addressed_slice(fused) or _contiguous_slice(fused)):
        # A (dynamic-update-)slice at an address computed on the host, or a slice of contiguous bytes:
        # XLA copies them instead of launching a kernel.
        return "kCopy", False
    return "kCustomKernel", instr.attrs.get("kind") == "kLoop" and _one_element_per_output(instr, fused)


def _one_element_per_output(fusion: Instruction, fused: Computation | None) -> bool:
    """Every output of a loop fusion is one element: XLA launches it as one block of one thread. An output that is a
    dynamic-update-slice is written in place, so its loop runs over the update (measured: ``u32[4]`` counters of a
    scanned stack, each layer's element updated, are 1x1x1 launches)."""
    if fused is None or not fused.instructions:
        return all(leaf.num_elements == 1 for leaf in fusion.shape.leaves())
    root = fused.root
    outputs = [fused.by_name[o] for o in root.operands] if root.opcode == "tuple" else [root]
    for output in outputs:
        if output.opcode == "dynamic-update-slice" and len(output.operands) > 1:
            output = fused.by_name.get(output.operands[1], output)
        if any(leaf.num_elements != 1 for leaf in output.shape.leaves()):
            return False
    return True


def _addressed_slice(fused: Computation) -> bool:
    """A fusion that only moves bytes: a root (dynamic-)slice or dynamic-update-slice XLA marks
    ``dynamic_slice_config``, fed by parameters, constants, bitcasts and the integer scalars that compute its
    offsets. Measured (nnx_models scanned, the control-flow test function): such a fusion is a kCopy thunk; one
    that computes the data it writes is a kernel."""
    if "dynamic_slice_config" not in fused.root.attrs.get("backend_config", ""):
        return False
    return all(i.opcode in ("parameter", "constant", "bitcast") or _integer_scalar(i.shape)
               for i in fused.instructions if i is not fused.root)


def _integer_scalar(shape) -> bool:
    return not shape.is_tuple and not shape.dims and bool(re.fullmatch(r"[su]\d+", shape.dtype or ""))


_SLICE_RANGE = re.compile(r"\[\s*(\d+)\s*:\s*(\d+)\s*(?::\s*(\d+)\s*)?\]")


def _contiguous_slice(fused: Computation) -> bool:
    """A fusion of one parameter and a root ``slice`` whose bytes are one contiguous range of the parameter's:
    unit strides, every dimension minor to the first partial one whole, every dimension major to it of size 1.
    Measured: 71 such fusions of MaxText llama3-8b on 8 GPUs (slices of the stacked f32[16] and bf16 buffers) are
    kCopy thunks."""
    if len(fused.instructions) != 2 or fused.root.opcode != "slice":
        return False
    operand = fused.by_name.get(fused.root.operands[0]) if fused.root.operands else None
    if operand is None or operand.opcode != "parameter" or operand.shape.is_tuple:
        return False
    ranges = [(int(a), int(b), int(c or 1)) for a, b, c in _SLICE_RANGE.findall(fused.root.attrs.get("slice", ""))]
    dims = operand.shape.dims
    if len(ranges) != len(dims) or any(stride != 1 for _, _, stride in ranges):
        return False
    layout = operand.shape.layout
    minor_to_major = [int(d) for d in re.findall(r"\d+", layout.split(":")[0])] if layout else list(
        reversed(range(len(dims))))
    partial = False
    for dim in minor_to_major:
        start, limit, _ = ranges[dim]
        if partial and limit - start != 1:
            return False
        if (start, limit) != (0, dims[dim]):
            partial = True
    return True


def _module_size(module: HloModule, comp: Computation) -> int:
    """Instructions of ``comp`` (and what it calls, loops not unrolled) that emit work: picks the largest branch."""
    size = 0
    for instr in comp.instructions:
        if instr.opcode in _NO_WORK or instr.opcode.endswith("-done"):
            continue
        if instr.opcode in ("while", "conditional", "async-start", "call"):
            size += sum(_module_size(module, module.computations[c]) for c in instr.called_computations()
                        if c in module.computations)
        elif not (instr.opcode == "custom-call" and instr.custom_call_target in _NO_THUNK_TARGETS):
            size += 1
    return size


def step_launches(module: HloModule, params: Sequence[EntryParam], dump: dict[str, str] | None,
                  source: str = "<thunk sequence>") -> LaunchReport | None:
    """What one step of a GPU program launches, from what its stage kept of XLA's dump (``Lowering.dump``): the
    thunk sequence and metadata when codegen wrote them (stage compiled), else the scheduled module itself (stage
    optimized: ``module_launches``). None for a program that is not a GPU's (``dump`` None)."""
    if dump is None:
        return None
    if dump.get("thunk_sequence"):
        return launch_report(dump["thunk_sequence"], dump.get("thunk_metadata"), module, params, source)
    return module_launches(module, params)

