"""What one GPU step launches, counted from XLA's thunk sequence (thunks.py) and traced back to the entry
parameters (param_reads.py).

What counts as a launch: every leaf thunk that makes the GPU do work (``thunks.category``): not the thunks that
hold others (a command buffer's kernels still count, one each, as a CUDA graph still runs every kernel node), nor
the waits.

Per step: a leaf in a while body runs once per iteration, one in its condition once more than that (the trip
count is XLA's ``known_trip_count``, or jax's ``i < N`` loop shape, from the while instruction in the
optimized module: loops.py; a loop whose count is not known counts once and is listed in ``unknown_trip_counts``). A
conditional runs one branch: the largest (by launches per step) is counted, so totals are an upper bound there.

Scalar: a generated kernel launched with grid 1x1x1 and one thread; it does one element's work and costs a
full launch in the step's dependency chain.

Attribution: with the thunk metadata and the module after optimizations, each launch carries the HLO instruction
it was emitted for and the entry parameters it reads directly (``ParameterReads``), which for a counter increment
is the counter itself. The same count predicted from the scheduled module, before codegen: launch_model.py;
launches grouped by what they run and read, and differences between two steps: launch_groups.py.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from hlo_audit.hlo.launch_groups import LaunchGroup, group_counts, launch_groups
from hlo_audit.hlo.loops import trip_count
from hlo_audit.hlo.param_reads import ParameterReads
from hlo_audit.hlo.params import EntryParam
from hlo_audit.hlo.text import HloModule, strip_number_suffix
from hlo_audit.hlo.thunks import (
    CATEGORIES,
    METADATA_SUFFIX,
    SEQUENCE_SUFFIX,
    Thunk,
    category,
    parse_thunk_metadata,
    parse_thunk_sequence,
)


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
        return launch_groups(self, scalar_only)

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
    walk = _SequenceWalk(thunks, annotations, ParameterReads(module) if module is not None else None)
    for top in walk.children.get(None, []):
        walk.thunk(top, (), 1, True, "")
    return LaunchReport(thunks=len(thunks), launches=tuple(walk.launches), params=tuple(params),
                        unknown_trip_counts=tuple(walk.unknown), conditionals=walk.conditionals,
                        attributed=bool(annotations) and module is not None)


class _SequenceWalk:
    """One walk of a thunk sequence's tree, from its top-level thunks down: the launches it finds, the loops whose
    trip count is not known and the conditionals it met (``launch_report``)."""

    def __init__(self, thunks: Sequence[Thunk], annotations: dict[int, str], reads: ParameterReads | None):
        self.annotations = annotations
        self.reads = reads
        self.children: dict[int | None, list[Thunk]] = {}
        for thunk in thunks:
            self.children.setdefault(thunk.parent, []).append(thunk)
        self.unknown: list[str] = []
        self.conditionals = 0
        self.launches: list[Launch] = []

    def instruction_of(self, thunk: Thunk) -> str:
        return self.annotations.get(thunk.id, "")

    def trips(self, thunk: Thunk) -> int | None:
        if self.reads is None:
            return None
        found = self.reads.instruction(self.instruction_of(thunk))
        if found is None or found[1].opcode != "while":
            return None
        comp, loop = found
        return trip_count(self.reads.module, comp, loop)

    def thunk(self, thunk: Thunk, scope: tuple[str, ...], times: int, counted: bool, outer: str) -> int:
        """Add ``thunk``'s launches; return its launches per step. ``outer``: the instruction of the nearest
        enclosing thunk that has one (a dynamic-slice fusion's embedded copy has none of its own)."""
        inner = self.children.get(thunk.position, [])
        if not inner:
            return self.leaf(thunk, scope, times, counted, outer)
        label = self.instruction_of(thunk) or f"{thunk.kind}@{thunk.id:03d}"
        if thunk.kind == "kWhile":
            return self.while_loop(thunk, inner, label, scope, times, counted)
        if thunk.kind == "kConditional":
            return self.conditional(inner, label, scope, times, counted)
        outer = self.instruction_of(thunk) or outer
        return sum(self.thunk(child, scope, times, counted, outer) for child in inner)

    def leaf(self, thunk: Thunk, scope: tuple[str, ...], times: int, counted: bool, outer: str) -> int:
        """A thunk that holds none: a launch (its runs per step), or a wait (0)."""
        kind_category = category(thunk.kind)
        if not kind_category:
            return 0
        name = self.instruction_of(thunk) or outer
        target, operand_reads = "", frozenset()
        if self.reads is not None and name:
            found = self.reads.instruction(name)
            if found is not None:
                target = found[1].custom_call_target if found[1].opcode == "custom-call" else ""
                operand_reads = self.reads.operand_reads(name)
        self.launches.append(Launch(
            thunk_id=thunk.id, kind=thunk.kind, category=kind_category, kernel=thunk.kernel, instruction=name,
            target=target, grid=thunk.grid, threads=thunk.threads, shared_memory=thunk.shared_memory,
            scope=scope, times=times, counted=counted, reads=tuple(sorted(operand_reads)),
            is_scalar=kind_category == "kernel" and thunk.is_scalar))
        return times

    def while_loop(self, thunk: Thunk, inner: list[Thunk], label: str, scope: tuple[str, ...], times: int,
                   counted: bool) -> int:
        """A loop's body once per trip, its condition once more (a trip count not known: once, listed)."""
        n = self.trips(thunk)
        if n is None:
            self.unknown.append(label)
            n = 1
        total = 0
        for child in inner:  # a loop's own instruction names no work inside it: no ``outer``
            again = n + 1 if child.region == "condition" else n
            total += self.thunk(child, (*scope, f"{label}:{child.region or 'body'}"), times * again, counted, "")
        return total

    def conditional(self, inner: list[Thunk], label: str, scope: tuple[str, ...], times: int, counted: bool) -> int:
        """Every branch's launches recorded, only the largest branch's counted (module doc)."""
        self.conditionals += 1
        branches: dict[str, list[Thunk]] = {}
        for child in inner:
            branches.setdefault(child.region, []).append(child)
        # Count each branch's launches once to pick the largest, then record them counted or not.
        sizes = {region: _branch_size(members, self.children) for region, members in branches.items()}
        largest = max(sizes, key=lambda region: (sizes[region], region)) if sizes else ""
        total = 0
        for region, members in branches.items():
            for child in members:
                added = self.thunk(child, (*scope, f"{label}:{region}"), times, counted and region == largest, "")
                total += added if region == largest else 0
        return total


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
