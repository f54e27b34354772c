"""What a GPU step launches: XLA's thunk sequence, counted and traced back to the entry parameters.

Seed 000's regression was "673 extra scalar counter kernels per step", not "more parameters": each carried RNG
counter is incremented by a kernel of its own (grid 1x1x1, one thread), launched every step, serialized into the
dependency chain. XLA's GPU compiler says what a step launches in two dump files, written at the end of codegen
(a deviceless compile writes them too):

* ``*.thunk_sequence.txt``: one line per thunk, ``NNN: <kind> [<dependencies>] <details>``; a kernel's details
  are its name, grid, block and shared memory (``loop_add_fusion_44 grid: [1, 1, 1] threads: [1, 1, 1]
  shared_memory: 0 bytes``). Thunks that hold others print them below, indented: a while loop its
  ``condition:`` and ``body:``, a conditional its branches, an async start the work it runs on another
  stream, a dynamic-slice fusion its embedded copy. ``*.thunk_sequence_after_thunk_passes.txt`` is the same
  after XLA's thunk passes, which wrap runs of thunks in ``kCommandBuffer`` (CUDA graphs); it parses the same.
* ``*.thunk_metadata.txt``: per thunk id, the HLO instruction it was emitted for (``profile_annotation``). The
  kernel name is not that: XLA reuses one compiled kernel for identical fusions (``loop_add_fusion_2`` runs
  ``loop_add_fusion.1``, whose ``deduplicated_name`` says so), so the metadata is what ties a launch to HLO.

What counts as a launch (``launches``): every leaf thunk that makes the GPU do work, in categories

* ``kernel``: XLA's generated kernels (``kKernel``, ``kCustomKernel``: fusions, Triton gemms, sorts);
* ``library``: cuBLAS / cuDNN / cuFFT / CUB calls (``kGemm``, ``kCublasLtMatmul``, ``kCuDnn``, ``kCubSort``...)
  and custom calls (``kCustomCall``: Transformer Engine's FFI calls ``te_gemm_v2_ffi``,
  ``te_dbias_quantize_ffi``...);
* ``copy`` and ``memset``: device copies and fills XLA issues as thunks of their own;
* ``collective``: NCCL collectives (the ``*Start`` of an asynchronous one, or the synchronous thunk);
* ``host`` (host transfers, infeed/outfeed) and ``other`` (a kind this module does not know; still counted).

Not launches: thunks that hold others (sequential, command buffer, while, conditional, async start,
dynamic-slice fusion: their leaves are counted instead, so a command buffer's kernels still count, one each, as
a CUDA graph still runs every kernel node), and the waits (``*Done``, ``kWaitForStreams``).

Per step: a leaf in a while body runs once per iteration, one in its condition once more than that (the trip
count is XLA's ``known_trip_count``, or jax's ``i < N`` loop shape, from the while instruction in the
optimized module; a loop whose count is not known counts once and is listed in ``unknown_trip_counts``). A
conditional runs one branch: the largest (by launches per step) is counted, so totals are an upper bound there.

Scalar: a generated kernel launched with grid 1x1x1 and one thread; it does one element's work and costs a
full launch in the step's dependency chain.

Attribution: each launch's HLO instruction is found by name in the module after optimizations, and each of its
operands is followed back to the entry parameters whose value it is: through get-tuple-element, tuple,
bitcast, copy (and copy-start/done), optimization barriers, while loop state (a body parameter element is the
loop's initial value for it, a while result the body's root element), conditional branch and called
computations' parameters. A value some other kernel computed is not followed further: ``reads`` are the
parameters a launch reads directly, which for a counter increment is the counter itself.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from hlo_audit.hlo.shapes import quoted_body
from hlo_audit.hlo.params import EntryParam, collapse_layers
from hlo_audit.hlo.rng_flow import trip_count
from hlo_audit.hlo.text import COMPUTATION_ATTRS, Computation, HloModule, HloParseError, Instruction
from hlo_audit.hlo.text import read_text, split_name_list, strip_number_suffix

SEQUENCE_SUFFIX = ".thunk_sequence.txt"
SEQUENCE_AFTER_PASSES_SUFFIX = ".thunk_sequence_after_thunk_passes.txt"
METADATA_SUFFIX = ".thunk_metadata.txt"
CATEGORIES = ("kernel", "library", "copy", "memset", "collective", "host", "other")

# `006: kWhile        [prev=005 (1) | next=023 (1)]   ` and `001: kCustomKernel [source | sink] name grid: ...`.
_THUNK_LINE = re.compile(r"^( *)(\d+):\s+(k\w+)\s*(?:\[([^\]]*)\])?\s?(.*?)\s*$")
# `condition:`, `  body:`, `      true_branch:`: the region of the thunk above whose thunks follow, indented.
_REGION_LINE = re.compile(r"^( *)([A-Za-z_][\w ]*?):\s*$")
_LAUNCH_DIMS = re.compile(r"grid:\s*\[(\d+),\s*(\d+),\s*(\d+)\]\s*threads:\s*\[(\d+),\s*(\d+),\s*(\d+)\]"
                          r"(?:\s*shared_memory:\s*(\d+)\s*bytes)?")
_METADATA = re.compile(r'thunk_info\s*\{([^{}]*)\}\s*thunk_kind:\s*"(\w+)"')
_ANNOTATION = re.compile(r'profile_annotation:\s*"(' + quoted_body('"') + ')"')
_THUNK_ID = re.compile(r"thunk_id:\s*(\d+)")

_GENERATED_KERNELS = frozenset({"kKernel", "kCustomKernel"})
_LIBRARY_CALLS = frozenset({"kGemm", "kCublasLtMatmul", "kCuDnn", "kConvolution", "kConvolutionReorder", "kFft",
                            "kCholesky", "kTriangularSolve", "kCubSort", "kNorm", "kFusedMHA", "kCustomCall",
                            "kFfiCall", "kTopK"})
_COPIES = frozenset({"kCopy", "kDeviceToDeviceCopy", "kDeviceToHostCopy", "kHostToDeviceCopy", "kDynamicMemcpy"})
_MEMSETS = frozenset({"kMemset32BitValue", "kMemzero"})
_HOST = re.compile(r"^k(Host\w*|Infeed|Outfeed)$")
_COLLECTIVE = re.compile(r"^k(?:Nvshmem)?(AllGather|AllReduce|AllToAll|CollectiveBroadcast|CollectivePermute|"
                         r"RaggedAllToAll|ReduceScatter|CollectiveKernel|Send|Recv)(?:Start)?$")
# Thunks that only order or group other work: never a launch themselves, even when they print no children.
_CONTROL = frozenset({"kSequential", "kCommandBuffer", "kWhile", "kConditional", "kAsyncStart", "kGroupStart"})
# Operations whose result is (part of) an operand's value, unchanged: attribution follows them.
_PASS_THROUGH = frozenset({"bitcast", "copy", "optimization-barrier", "add-dependency", "domain"})


class ThunkParseError(HloParseError):
    """A thunk sequence or metadata file this module cannot read: one line naming the file and the line."""


# --------------------------------------------------------------------------------------------------------------
# The thunk sequence as XLA prints it
# --------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Thunk:
    """One line of ``thunk_sequence.txt``."""

    position: int  # index in the sequence, in printed order (ids are not unique: every command buffer is 000)
    id: int  # XLA's thunk id, the key of ``thunk_metadata.txt``
    kind: str  # XLA's Thunk::Kind name: kCustomKernel, kCopy, kCustomCall, kWhile, kAllReduceStart...
    details: str  # what follows the dependency brackets
    kernel: str  # the launched kernel's name, "" where the line names none
    grid: tuple[int, int, int] | None
    threads: tuple[int, int, int] | None
    shared_memory: int | None
    parent: int | None  # position of the thunk that holds this one
    region: str  # the parent's region this thunk is in: "body", "condition", "true_branch", ""
    line: int

    @property
    def is_scalar(self) -> bool:
        """A generated kernel with one block of one thread."""
        return self.kind in _GENERATED_KERNELS and self.grid == (1, 1, 1) and self.threads == (1, 1, 1)


def parse_thunk_sequence(text: str, source: str = "<thunk sequence>") -> tuple[Thunk, ...]:
    """Every thunk of a ``thunk_sequence.txt`` (or ``..._after_thunk_passes.txt``), nesting kept."""
    thunks: list[Thunk] = []
    # (indent, position) of the thunks that may still hold the next line; the region each is printing.
    open_thunks: list[tuple[int, int]] = []
    regions: dict[int, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        m = _THUNK_LINE.match(raw)
        if m is None:
            region = _REGION_LINE.match(raw)
            if region is None:
                raise ThunkParseError(f"not a thunk line: {raw.strip()[:80]!r}", source, number)
            indent = len(region.group(1))
            while open_thunks and open_thunks[-1][0] > indent:
                open_thunks.pop()
            if not open_thunks:
                raise ThunkParseError(f"region {region.group(2)!r} outside any thunk", source, number)
            regions[open_thunks[-1][1]] = region.group(2).strip()
            continue
        indent = len(m.group(1))
        while open_thunks and open_thunks[-1][0] >= indent:
            open_thunks.pop()
        parent = open_thunks[-1][1] if open_thunks else None
        details = m.group(5)
        dims = _LAUNCH_DIMS.search(details)
        kernel = details[:dims.start()].strip() if dims else ""
        position = len(thunks)
        thunks.append(Thunk(
            position=position, id=int(m.group(2)), kind=m.group(3), details=details, kernel=kernel,
            grid=tuple(int(g) for g in dims.group(1, 2, 3)) if dims else None,
            threads=tuple(int(t) for t in dims.group(4, 5, 6)) if dims else None,
            shared_memory=int(dims.group(7)) if dims and dims.group(7) else None,
            parent=parent, region=regions.get(parent, "") if parent is not None else "", line=number))
        open_thunks.append((indent, position))
    return tuple(thunks)


def parse_thunk_metadata(text: str, source: str = "<thunk metadata>") -> dict[int, str]:
    """Thunk id -> the HLO instruction it was emitted for (``profile_annotation``), from ``thunk_metadata.txt``.

    Thunks without an id (command buffers, sequential wrappers) or without an annotation are left out."""
    annotations: dict[int, str] = {}
    found = False
    for m in _METADATA.finditer(text):
        found = True
        thunk_id, annotation = _THUNK_ID.search(m.group(1)), _ANNOTATION.search(m.group(1))
        if thunk_id and annotation:
            annotations[int(thunk_id.group(1))] = re.sub(r"\\(.)", r"\1", annotation.group(1))
    if not found and text.strip():
        raise ThunkParseError("no thunk_metadata entries (expected `thunk_info { ... } thunk_kind: ...`)", source)
    return annotations


def category(kind: str) -> str:
    """What a leaf thunk of ``kind`` launches (module doc); "" for waits and thunks that only hold others."""
    if kind in _GENERATED_KERNELS:
        return "kernel"
    if kind.endswith("Done") or kind == "kWaitForStreams" or kind in _CONTROL:
        return ""
    if kind in _LIBRARY_CALLS:
        return "library"
    if kind in _COPIES:
        return "copy"
    if kind in _MEMSETS:
        return "memset"
    if _COLLECTIVE.match(kind):
        return "collective"
    if _HOST.match(kind):
        return "host"
    return "other"


# --------------------------------------------------------------------------------------------------------------
# Attribution: which entry parameters an instruction reads
# --------------------------------------------------------------------------------------------------------------

class ParameterReads:
    """Follows values of an optimized module back to the entry parameters they are (module doc, Attribution)."""

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


# --------------------------------------------------------------------------------------------------------------
# Launches per step
# --------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Launch:
    """One leaf thunk that makes the GPU work, once per ``times`` per step."""

    thunk_id: int
    kind: str
    category: str  # kernel | library | copy | memset | collective | host | other
    kernel: str  # the kernel's name as launched; "" for thunks that print none
    instruction: str  # the HLO instruction it was emitted for ("" when the metadata says none)
    target: str  # a custom call's target (te_gemm_v2_ffi, __cublas$gemm); "" otherwise
    grid: tuple[int, int, int] | None
    threads: tuple[int, int, int] | None
    shared_memory: int | None
    scope: tuple[str, ...]  # enclosing control flow, outermost first: ("while.14:body",)
    times: int  # runs per step if its branch runs: the trip counts of enclosing loops multiplied
    counted: bool  # False inside a conditional branch that is not the largest (module doc)
    reads: tuple[int, ...]  # entry parameter numbers it reads directly
    # A generated kernel of one block of one thread (from a module: a loop fusion of one-element outputs).
    is_scalar: bool = False

    @property
    def per_step(self) -> int:
        return self.times if self.counted else 0

    @property
    def name(self) -> str:
        """What it runs, without XLA's numbering: ``loop_add_fusion``, ``te_gemm_v2_ffi``, ``copy``,
        ``all-reduce-start``."""
        if self.target:
            return self.target
        if self.instruction:
            return strip_number_suffix(self.instruction)
        if self.kernel:
            return re.sub(r"_\d+$", "", self.kernel)
        return self.kind

    def to_record(self, params: dict[int, EntryParam] | None = None) -> dict:
        record = {"thunk_id": self.thunk_id, "kind": self.kind, "category": self.category, "name": self.name,
                  "kernel": self.kernel, "instruction": self.instruction, "target": self.target,
                  "grid": list(self.grid) if self.grid else None,
                  "threads": list(self.threads) if self.threads else None, "shared_memory": self.shared_memory,
                  "scope": list(self.scope), "times": self.times, "counted": self.counted,
                  "scalar": self.is_scalar, "reads": list(self.reads)}
        if params is not None:
            record["read_paths"] = [params[i].path for i in self.reads if i in params]
        return record


# What a launch of each category is called, one and many.
_CATEGORY_WORDS = {"kernel": ("kernel", "kernels"), "library": ("library call", "library calls"),
                   "collective": ("collective", "collectives"), "copy": ("copy", "copies"),
                   "memset": ("memset", "memsets"), "host": ("host transfer", "host transfers")}


@dataclass(frozen=True, slots=True)
class LaunchGroup:
    """Launches of one kind of work reading one kind of state: ``42 scalar kernels loop_add_fusion, each reading
    state.model.decoder.layers_*.*.to_nnx__rngs.*.count`` (a count is signed in a diff)."""

    count: int
    category: str
    scalar: bool
    name: str
    reads: str  # the common pattern of the parameters read ("" when none)
    reads_per_launch: int  # the most parameters one launch of the group reads

    def describe(self, signed: bool = False) -> str:
        one, many = _CATEGORY_WORDS.get(self.category, (f"{self.category} launch", f"{self.category} launches"))
        number = f"{self.count:+d}" if signed else str(self.count)
        text = f"{number} {'scalar ' if self.scalar else ''}{one if abs(self.count) == 1 else many} {self.name}"
        if self.reads:
            each = "" if abs(self.count) == 1 else "each "
            more = "" if self.reads_per_launch <= 1 else f" (up to {self.reads_per_launch} parameters)"
            text += f", {each}reading {self.reads}{more}"
        return text

    def to_record(self) -> dict:
        return {"count": self.count, "category": self.category, "scalar": self.scalar, "name": self.name,
                "reads": self.reads, "reads_per_launch": self.reads_per_launch}


@dataclass(frozen=True)
class LaunchReport:
    """What one step launches, from a thunk sequence (and its metadata and optimized module, for attribution)."""

    thunks: int  # every thunk printed, the ones that hold others included
    launches: tuple[Launch, ...]  # each leaf launch thunk once, in sequence order
    params: tuple[EntryParam, ...] = ()  # the optimized module's entry parameters (paths for ``reads``)
    unknown_trip_counts: tuple[str, ...] = ()  # while loops counted once: their trip count is not known
    conditionals: int = 0  # conditionals, each counted by its largest branch
    attributed: bool = False  # launches carry the HLO instruction (metadata and module were given)
    # Counted from the scheduled module (``module_launches``) rather than codegen's thunk sequence.
    from_module: bool = False

    @property
    def total(self) -> int:
        """Launches per step."""
        return sum(launch.per_step for launch in self.launches)

    @property
    def static(self) -> int:
        """Launch thunks in the program, each once (loops and branches not unrolled)."""
        return len(self.launches)

    @property
    def by_category(self) -> dict[str, int]:
        counts = Counter()
        for launch in self.launches:
            counts[launch.category] += launch.per_step
        return {c: counts[c] for c in CATEGORIES if counts[c]}

    @property
    def by_kind(self) -> dict[str, int]:
        counts = Counter()
        for launch in self.launches:
            counts[launch.kind] += launch.per_step
        return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))

    @property
    def scalar(self) -> int:
        return sum(launch.per_step for launch in self.launches if launch.is_scalar)

    @property
    def collectives(self) -> int:
        return self.by_category.get("collective", 0)

    @property
    def exact(self) -> bool:
        """Per-step counts are exact: every loop's trip count is known and no branch had to be chosen."""
        return not self.unknown_trip_counts and not self.conditionals

    @property
    def reading_rng(self) -> int:
        """Launches per step that read RNG state directly (an entry parameter of role rng_key or rng_count): a
        carried stream's counter increment, a draw's hash of its key. What grows per layer when each layer keeps
        streams of its own (seed 000: +21 per layer of llama3-8b on an H100)."""
        params = self.param_by_number()
        return sum(launch.per_step for launch in self.launches
                   if any(i in params and params[i].is_rng for i in launch.reads))

    def param_by_number(self) -> dict[int, EntryParam]:
        return {p.index: p for p in self.params}

    def read_paths(self, launch: Launch) -> list[str]:
        params = self.param_by_number()
        return [params[i].path for i in launch.reads if i in params]

    def groups(self, scalar_only: bool = False) -> list[LaunchGroup]:
        """Launches per step grouped by what they run and read, largest first."""
        counts = _fine_counts(self, lambda launch: not scalar_only or launch.is_scalar)
        return _merge(counts)

    def to_record(self, with_launches: bool = False) -> dict:
        """What results, the cache and ``--format json`` keep (``kernels``); ``with_launches``: every launch too."""
        record = {"thunks": self.thunks, "total": self.total, "static": self.static,
                  "by_category": self.by_category, "by_kind": self.by_kind, "scalar": self.scalar,
                  "collectives": self.collectives, "exact": self.exact,
                  "unknown_trip_counts": list(self.unknown_trip_counts), "conditionals": self.conditionals,
                  "attributed": self.attributed, "from_module": self.from_module, "reading_rng": self.reading_rng,
                  "scalar_groups": [g.to_record() for g in self.groups(scalar_only=True)],
                  "groups": group_counts(self)}
        if with_launches:
            params = self.param_by_number()
            record["launches"] = [launch.to_record(params) for launch in self.launches]
        return record


def launch_report(sequence: str, metadata: str | None = None, module: HloModule | None = None,
                  params: Sequence[EntryParam] = (), source: str = "<thunk sequence>") -> LaunchReport:
    """Launches per step of a thunk sequence; with its metadata and optimized ``module`` (and that module's
    ``params``, from ``entry_params``), each launch's instruction, trip counts and the parameters it reads."""
    thunks = parse_thunk_sequence(sequence, source)
    annotations = parse_thunk_metadata(metadata, source.replace(SEQUENCE_SUFFIX, METADATA_SUFFIX)) if metadata else {}
    reads = ParameterReads(module) if module is not None else None
    children: dict[int | None, list[Thunk]] = {}
    for thunk in thunks:
        children.setdefault(thunk.parent, []).append(thunk)

    unknown: list[str] = []
    conditionals = 0
    launches: list[Launch] = []

    def instruction_of(thunk: Thunk) -> str:
        return annotations.get(thunk.id, "")

    def trips(thunk: Thunk) -> int | None:
        if reads is None:
            return None
        found = reads.instruction(instruction_of(thunk))
        if found is None or found[1].opcode != "while":
            return None
        comp, loop = found
        condition = reads.module.computations.get(loop.attrs.get("condition", "").strip().lstrip("%"))
        return trip_count(comp, loop, condition) if condition is not None else None

    def walk(thunk: Thunk, scope: tuple[str, ...], times: int, counted: bool, outer: str) -> int:
        """Add ``thunk``'s launches; return its launches per step. ``outer``: the instruction of the nearest
        enclosing thunk that has one (a dynamic-slice fusion's embedded copy has none of its own)."""
        nonlocal conditionals
        inner = children.get(thunk.position, [])
        if not inner:
            kind_category = category(thunk.kind)
            if not kind_category:
                return 0
            name = instruction_of(thunk) or outer
            target, operand_reads = "", frozenset()
            if reads is not None and name:
                found = reads.instruction(name)
                if found is not None:
                    target = found[1].custom_call_target if found[1].opcode == "custom-call" else ""
                    operand_reads = reads.operand_reads(name)
            launches.append(Launch(
                thunk_id=thunk.id, kind=thunk.kind, category=kind_category, kernel=thunk.kernel, instruction=name,
                target=target, grid=thunk.grid, threads=thunk.threads, shared_memory=thunk.shared_memory,
                scope=scope, times=times, counted=counted, reads=tuple(sorted(operand_reads)),
                is_scalar=kind_category == "kernel" and thunk.is_scalar))
            return times
        label = instruction_of(thunk) or f"{thunk.kind}@{thunk.id:03d}"
        if thunk.kind == "kWhile":
            outer = ""  # a loop's own instruction names no work inside it
            n = trips(thunk)
            if n is None:
                unknown.append(label)
                n = 1
            total = 0
            for child in inner:
                again = n + 1 if child.region == "condition" else n
                total += walk(child, (*scope, f"{label}:{child.region or 'body'}"), times * again, counted, outer)
            return total
        if thunk.kind == "kConditional":
            outer = ""
            conditionals += 1
            branches: dict[str, list[Thunk]] = {}
            for child in inner:
                branches.setdefault(child.region, []).append(child)
            # Count each branch's launches once to pick the largest, then record them counted or not.
            sizes = {region: _branch_size(members, children) for region, members in branches.items()}
            largest = max(sizes, key=lambda region: (sizes[region], region)) if sizes else ""
            total = 0
            for region, members in branches.items():
                for child in members:
                    added = walk(child, (*scope, f"{label}:{region}"), times, counted and region == largest, outer)
                    total += added if region == largest else 0
            return total
        outer = instruction_of(thunk) or outer
        return sum(walk(child, scope, times, counted, outer) for child in inner)

    for top in children.get(None, []):
        walk(top, (), 1, True, "")
    return LaunchReport(thunks=len(thunks), launches=tuple(launches), params=tuple(params),
                        unknown_trip_counts=tuple(unknown), conditionals=conditionals,
                        attributed=bool(annotations) and module is not None)


# --------------------------------------------------------------------------------------------------------------
# The same count from the scheduled module, before codegen
# --------------------------------------------------------------------------------------------------------------

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
    reads = ParameterReads(module)
    launches: list[Launch] = []
    unknown: list[str] = []
    conditionals = 0

    def add(instr: Instruction, kind: str, scope: tuple[str, ...], times: int, counted: bool,
            scalar: bool = False) -> int:
        launches.append(Launch(
            thunk_id=-1, kind=kind, category=category(kind), kernel="", instruction=instr.name,
            target=instr.custom_call_target if instr.opcode == "custom-call" else "", grid=None, threads=None,
            shared_memory=None, scope=scope, times=times, counted=counted,
            reads=tuple(sorted(reads.operand_reads(instr.name))), is_scalar=scalar))
        return times

    def walk(comp: Computation, scope: tuple[str, ...], times: int, counted: bool) -> int:
        nonlocal conditionals
        total = 0
        for instr in comp.instructions:
            op = instr.opcode
            if op in _NO_WORK or op.endswith("-done") or op == "async-update":
                continue
            if op == "fusion":
                fused = module.computations.get(instr.attrs.get("calls", "").strip().lstrip("%"))
                if '"kind":"__cudnn$' in instr.attrs.get("backend_config", ""):
                    total += add(instr, "kCuDnn", scope, times, counted)
                elif fused is not None and any(_COLLECTIVE_OPCODES.match(i.opcode) for i in fused.instructions):
                    # A collective fused into a kernel of XLA's own (a one-shot all-reduce): kCollectiveKernel.
                    total += add(instr, "kCollectiveKernel", scope, times, counted)
                elif fused is not None and fused.instructions and (_addressed_slice(fused) or _contiguous_slice(fused)):
                    # A (dynamic-update-)slice at an address computed on the host, or a slice of contiguous bytes:
                    # XLA copies them instead of launching a kernel.
                    total += add(instr, "kCopy", scope, times, counted)
                else:
                    scalar = instr.attrs.get("kind") == "kLoop" and _one_element_per_output(instr, fused)
                    total += add(instr, "kCustomKernel", scope, times, counted, scalar)
            elif op == "custom-call":
                target = instr.custom_call_target
                if target not in _NO_THUNK_TARGETS:
                    kind = next((k for prefix, k in _LIBRARY_TARGETS if target.startswith(prefix)), "kCustomCall")
                    total += add(instr, kind, scope, times, counted)
            elif op in ("copy", "copy-start"):
                total += add(instr, "kCopy", scope, times, counted)
            elif _COLLECTIVE_OPCODES.match(op):
                base = _COLLECTIVE_OPCODES.match(op).group(1)
                kind = ("k" + "".join(w.capitalize() for w in base.split("-"))
                        + ("Start" if op.endswith("-start") else ""))
                total += add(instr, kind, scope, times, counted)
            elif op in ("send", "recv", "infeed", "outfeed"):
                total += add(instr, "kHost" + op.capitalize() if op in ("send", "recv") else "k" + op.capitalize(),
                             scope, times, counted)
            elif op == "while":
                body = module.computations.get(instr.attrs.get("body", "").strip().lstrip("%"))
                condition = module.computations.get(instr.attrs.get("condition", "").strip().lstrip("%"))
                n = trip_count(comp, instr, condition) if condition is not None else None
                if n is None:
                    unknown.append(instr.name)
                    n = 1
                if condition is not None:
                    total += walk(condition, (*scope, f"{instr.name}:condition"), times * (n + 1), counted)
                if body is not None:
                    total += walk(body, (*scope, f"{instr.name}:body"), times * n, counted)
            elif op == "conditional":
                conditionals += 1
                branches = [module.computations[c] for c in instr.called_computations() if c in module.computations]
                sizes = [_module_size(module, b) for b in branches]
                largest = max(range(len(branches)), key=lambda i: sizes[i]) if branches else -1
                for i, branch in enumerate(branches):
                    added = walk(branch, (*scope, f"{instr.name}:{branch.name}"), times, counted and i == largest)
                    total += added if i == largest else 0
            elif op in ("async-start", "call"):
                for called in instr.called_computations():
                    if called in module.computations:
                        total += walk(module.computations[called], scope, times, counted)
            elif op in ("partition-id", "replica-id"):
                total += add(instr, "kPartitionId" if op == "partition-id" else "kReplicaId", scope, times, counted)
            else:  # an operation left unfused (sort, rng-bit-generator...): a kernel of its own
                total += add(instr, "kKernel", scope, times, counted)
        return total

    walk(module.entry, (), 1, True)
    return LaunchReport(thunks=len(launches), launches=tuple(launches), params=tuple(params),
                        unknown_trip_counts=tuple(unknown), conditionals=conditionals, attributed=True,
                        from_module=True)


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


def _branch_size(members: list[Thunk], children: dict[int | None, list[Thunk]]) -> int:
    """Leaf launch thunks under ``members`` (loops not unrolled): what picks a conditional's largest branch."""
    size = 0
    stack = list(members)
    while stack:
        thunk = stack.pop()
        inner = children.get(thunk.position, [])
        if inner:
            stack.extend(inner)
        elif category(thunk.kind):
            size += 1
    return size


# --------------------------------------------------------------------------------------------------------------
# Grouping and differences
# --------------------------------------------------------------------------------------------------------------

# (category, scalar, name, roles of the parameters read, their layer-collapsed paths)
_Key = tuple[str, bool, str, tuple[str, ...], tuple[str, ...]]


def _fine_counts(report: LaunchReport, keep=lambda launch: True) -> dict[_Key, tuple[int, int, set[str]]]:
    """Per key: launches per step, the most parameters one launch reads, and the exact paths read."""
    params = report.param_by_number()
    counts: dict[_Key, tuple[int, int, set[str]]] = {}
    for launch in report.launches:
        if not launch.per_step or not keep(launch):
            continue
        read = [params[i] for i in launch.reads if i in params]
        paths = [p.path for p in read]
        key = (launch.category, launch.is_scalar, launch.name, tuple(sorted({p.role for p in read})),
               tuple(sorted({collapse_layers(p) for p in paths})))
        count, most, seen = counts.get(key, (0, 0, set()))
        counts[key] = (count + launch.per_step, max(most, len(paths)), seen | set(paths))
    return counts


def _merge(counts: dict[_Key, tuple[int, int, set[str]]]) -> list[LaunchGroup]:
    """One group per (category, scalar, name, roles read, sign of the count): a kernel that increments RNG
    counters is not grouped with the same fusion incrementing the optimizer's step; the group's read pattern is
    common to all its paths."""
    merged: dict[tuple, tuple[int, int, set[str]]] = {}
    for (cat, scalar, name, roles, _collapsed), (count, most, paths) in counts.items():
        if not count:
            continue
        key = (cat, scalar, name, roles, count > 0)
        total, widest, seen = merged.get(key, (0, 0, set()))
        merged[key] = (total + count, max(widest, most), seen | paths)
    groups = [LaunchGroup(count=count, category=cat, scalar=scalar, name=name, reads=common_pattern(paths),
                          reads_per_launch=most)
              for (cat, scalar, name, _roles, _positive), (count, most, paths) in merged.items()]
    return sorted(groups, key=lambda g: (-abs(g.count), g.category, g.name, g.reads))


def launch_delta(before: LaunchReport, after: LaunchReport, scalar_only: bool = False) -> list[LaunchGroup]:
    """What ``after`` launches per step that ``before`` does not (positive counts) and the reverse (negative),
    grouped as ``LaunchGroup``: seed 000's revert is ``+42 scalar kernels loop_add_fusion, each reading
    state.model.decoder.layers_*.*.to_nnx__rngs.*.count``."""
    keep = (lambda launch: launch.is_scalar) if scalar_only else (lambda launch: True)
    return _merge(_delta(_fine_counts(before, keep), _fine_counts(after, keep)))


def _delta(old: dict[_Key, tuple[int, int, set[str]]],
           new: dict[_Key, tuple[int, int, set[str]]]) -> dict[_Key, tuple[int, int, set[str]]]:
    delta: dict[_Key, tuple[int, int, set[str]]] = {}
    for key in old.keys() | new.keys():
        count_old, most_old, paths_old = old.get(key, (0, 0, set()))
        count_new, most_new, paths_new = new.get(key, (0, 0, set()))
        if count_new != count_old:
            paths = ((paths_new - paths_old or paths_new) if count_new > count_old
                     else (paths_old - paths_new or paths_old))
            delta[key] = (count_new - count_old, max(most_old, most_new), paths)
    return delta


# `kernel scalar loop_add_fusion [rng_count] state.layers_*.mlp.to_nnx__rngs.aqt.count`: one group of a record.
_GROUP_KEY = re.compile(r"^(?P<category>\w+)(?P<scalar> scalar)? (?P<name>\S+)"
                        r"(?: \[(?P<roles>[^\]]*)\] (?P<paths>.*))?$")


def group_counts(report: LaunchReport) -> dict[str, int]:
    """Launches per step by what they run and the entry parameters they read, layer indices collapsed, as
    ``{"kernel scalar loop_add_fusion [rng_count] state.layers_*.bridge.to_nnx__rngs.params.count": 2, ...}``: what
    a record (a result, a golden) keeps so that two of them give the same attribution as ``launch_delta`` of their
    reports (``group_delta``), one line a group in a golden's diff."""
    counts = {}
    for (cat, scalar, name, roles, paths), (count, _most, _seen) in _fine_counts(report).items():
        key = (f"{cat}{' scalar' if scalar else ''} {name}"
               + (f" [{','.join(roles)}] {','.join(paths)}" if paths else ""))
        counts[key] = counts.get(key, 0) + count
    return dict(sorted(counts.items()))


def group_delta(before: dict[str, int], after: dict[str, int],
                reading: Iterable[str] | None = None) -> list[LaunchGroup]:
    """``launch_delta`` of two records' ``group_counts`` (the most parameters a launch reads: its collapsed paths);
    with ``reading`` (roles), only the launches that read an entry parameter of one of those roles."""
    old, new = _parse_groups(before), _parse_groups(after)
    if reading is not None:
        wanted = set(reading)
        old, new = ({k: v for k, v in side.items() if wanted & set(k[3])} for side in (old, new))
    return _merge(_delta(old, new))


def _parse_groups(groups: dict[str, int]) -> dict[_Key, tuple[int, int, set[str]]]:
    fine: dict[_Key, tuple[int, int, set[str]]] = {}
    for text, count in groups.items():
        m = _GROUP_KEY.match(text)
        if m is None:
            raise ValueError(f"not a launch group: {text!r}")
        roles = tuple(r for r in (m.group("roles") or "").split(",") if r)
        paths = tuple(p for p in (m.group("paths") or "").split(",") if p)
        fine[(m.group("category"), bool(m.group("scalar")), m.group("name"), roles, paths)] = (
            count, len(paths), set(paths))
    return fine


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


def common_pattern(paths: Iterable[str]) -> str:
    """One pattern for a set of state paths: layer indices collapsed (``layers_*``), positions that differ as
    ``*``, a run of them as one; paths of different lengths keep their common head and tail around one ``*``.

    ``{layers_0.mlp.wi_0.to_nnx__rngs.aqt.count, layers_1.self_attention.query.to_nnx__rngs.params.count}`` ->
    ``layers_*.*.to_nnx__rngs.*.count``."""
    split = sorted({tuple(collapse_layers(p).split(".")) for p in paths})
    if not split:
        return ""
    if len(split) == 1:
        return ".".join(split[0])
    if len({len(parts) for parts in split}) == 1:
        parts = [column[0] if len(set(column)) == 1 else "*" for column in zip(*split)]
    else:
        head = _common_prefix(split)
        tail = _common_prefix([tuple(reversed(p[len(head):])) for p in split])
        parts = [*head, "*", *reversed(tail)]
    collapsed: list[str] = []
    for part in parts:
        if not (part == "*" and collapsed and collapsed[-1] == "*"):
            collapsed.append(part)
    return ".".join(collapsed)


def _common_prefix(sequences: Sequence[tuple[str, ...]]) -> list[str]:
    prefix: list[str] = []
    for column in zip(*sequences):
        if len(set(column)) != 1:
            break
        prefix.append(column[0])
    return prefix


# --------------------------------------------------------------------------------------------------------------
# Dump folders
# --------------------------------------------------------------------------------------------------------------

# `module_0001.jit_train_step.sm_9.0a_gpu_after_optimizations.txt`; older XLA and other backends drop the arch.
_AFTER_OPTIMIZATIONS = re.compile(r"^(?P<prefix>module_\d+\..+?)\.(?:[\w.]+_)?after_optimizations\.txt$")


@dataclass(frozen=True)
class ThunkDump:
    """The files of one module's GPU compile in an ``--xla_dump_to`` folder."""

    prefix: str  # module_0001.jit_train_step
    sequence: Path
    metadata: Path | None
    after_optimizations: Path | None

    def read(self) -> tuple[str, str | None, str | None]:
        """(sequence, metadata, after-optimizations module) texts."""
        return (read_text(self.sequence), read_text(self.metadata) if self.metadata else None,
                read_text(self.after_optimizations) if self.after_optimizations else None)


def thunk_dumps(folder: Path | str) -> list[ThunkDump]:
    """Every module of a dump folder that has a thunk sequence, with its metadata and optimized module."""
    folder = Path(folder)
    names = sorted(p.name for p in folder.iterdir() if p.is_file())
    modules = {m.group("prefix"): folder / name for name in names if (m := _AFTER_OPTIMIZATIONS.match(name))}
    dumps = []
    for name in names:
        if name.endswith(SEQUENCE_SUFFIX):
            prefix = name[: -len(SEQUENCE_SUFFIX)]
            metadata = folder / (prefix + METADATA_SUFFIX)
            dumps.append(ThunkDump(prefix, folder / name, metadata if metadata.is_file() else None,
                                   modules.get(prefix)))
    return dumps
