"""XLA's GPU thunk sequence as it prints it, and where a dump folder keeps it.

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

What each leaf thunk launches (``category``: launches.py counts them per step):

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
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from hlo_audit.hlo.numbers import OutOfRange, bounded
from hlo_audit.hlo.shapes import quoted_body
from hlo_audit.hlo.text import HloParseError, read_text

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

        def read(digits: str, what: str, line: int = number) -> int:
            return _bounded(digits, what, source, line)

        thunks.append(Thunk(
            position=position, id=read(m.group(2), "thunk id"), kind=m.group(3), details=details, kernel=kernel,
            grid=tuple(read(g, "grid") for g in dims.group(1, 2, 3)) if dims else None,
            threads=tuple(read(t, "threads") for t in dims.group(4, 5, 6)) if dims else None,
            shared_memory=read(dims.group(7), "shared memory") if dims and dims.group(7) else None,
            parent=parent, region=regions.get(parent, "") if parent is not None else "", line=number))
        open_thunks.append((indent, position))
    return tuple(thunks)


def _bounded(digits: str, what: str, source: str, line: int | None) -> int:
    """A number of a thunk file within int64, as every number of HLO text (``hlo.numbers``), else one line."""
    try:
        return bounded(digits, what)
    except OutOfRange as exc:
        raise ThunkParseError(str(exc), source, line) from None


def parse_thunk_metadata(text: str, source: str = "<thunk metadata>") -> dict[int, str]:
    """Thunk id -> the HLO instruction it was emitted for (``profile_annotation``), from ``thunk_metadata.txt``.

    Thunks without an id (command buffers, sequential wrappers) or without an annotation are left out."""
    annotations: dict[int, str] = {}
    found = False
    for m in _METADATA.finditer(text):
        found = True
        thunk_id, annotation = _THUNK_ID.search(m.group(1)), _ANNOTATION.search(m.group(1))
        if thunk_id and annotation:
            key = _bounded(thunk_id.group(1), "thunk_id", source, None)
            annotations[key] = re.sub(r"\\(.)", r"\1", annotation.group(1))
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
