"""Where in the user's source an instruction comes from: ``file:line``, from its metadata.

Two ways a module says it. XLA's dumps after optimization put it in each instruction's metadata
(``source_file="/.../model.py" source_line=41``). jax's own printer with debug info (``Lowered.as_text(dialect="hlo",
debug_info=True)``, and XLA's dumps before optimization) prints tables before the first computation instead (the
parser keeps them: ``HloModule.debug_tables``) and a ``stack_frame_id`` per instruction::

    FileNames        3 "/work/project/model.py"
    FunctionNames    4 "Block.__call__"
    FileLocations    4 {file_name_id=3 function_name_id=4 line=72 end_line=72 column=48 end_column=60}
    StackFrames      62 {file_location_id=35 parent_frame_id=59}

A frame's ``parent_frame_id`` is the caller's frame number plus one (0: none; checked against jax 0.12's output,
where it reads ``linear.py:422 Linear.__call__`` <- ``model.py:72 Block.__call__`` <- ...). The innermost frame is
usually inside a framework (flax's ``Linear.__call__``, jax's ``lax``); the place a reviewer wants is the
innermost frame outside them: the model's own line. Only the file's name is kept (``model.py:72``): the same code
checked out elsewhere places alike.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import NamedTuple

from hlo_audit.hlo.numbers import INT32_MAX, bounded
from hlo_audit.hlo.text import TABLE_FIELD, HloModule, Instruction, hlo_int

# Packages whose frames are the machinery, not the model: skipped while an outer frame is the user's.
# equinox's filter_checkpoint and filter_jit, haiku's and penzai's modules are wrappers over jax as flax's are: an
# equinox remat placed at equinox/_ad.py said nothing of where the model asked for it.
FRAMEWORKS = frozenset({"jax", "jaxlib", "flax", "optax", "numpy", "chex", "orbax", "qwix", "aqt", "tokamax",
                        "transformer_engine", "equinox", "haiku", "penzai", "einops", "functools", "contextlib",
                        "typing"})
# Modules that replace jax's own functions process-wide once imported (MaxText's tunix adapter swaps
# jax.lax.with_sharding_constraint and jax.lax.top_k for compat shims): their frames are jax's, whoever calls.
SHIMS = ("maxtext/integration/tunix/tunix_adapter.py",)
class Origin(NamedTuple):
    """Where an instruction comes from: jax's op_name, the innermost ``file:line`` outside the frameworks, and the
    user's frames that called it (``file:line``, innermost first: the call site of ``source``'s function first)."""

    op_name: str
    source: str
    callers: tuple[str, ...] = ()


# The user frames a stack keeps, innermost first: real stacks hold a few dozen (MaxText's under hlo-audit's CLI, 50);
# a hostile text's frames tens of thousands deep cost no more than this each.
CHAIN_FRAMES = 128
# (computation, instruction) -> its Origin, by the names of a module's canonical text.
Places = Mapping[tuple[str, str], Origin]
_SOURCE_FILE = re.compile(r'source_file="((?:[^"\\]|\\.)*)"')
_SOURCE_LINE = re.compile(r"source_line=(\d+)")
_STACK_FRAME = re.compile(r"stack_frame_id=(\d+)")


class Locations:
    """``file:line`` of each instruction of one module (module doc); "" where the module does not say."""

    def __init__(self, module: HloModule | None = None):
        tables = module.debug_tables if module is not None else {}
        self._source = module.source if module is not None else "<text>"
        self._files = {n: _unquote(v) for n, v in tables.get("FileNames", {}).items()}
        self._locations = {n: _fields(v) for n, v in tables.get("FileLocations", {}).items()}
        self._frames = {n: _fields(v) for n, v in tables.get("StackFrames", {}).items()}
        self._resolved: dict[int, tuple[tuple[str, ...], str]] = {}  # frame -> (user frames, innermost frame)

    @classmethod
    def of_tables(cls, files: Mapping[int, str], locations: Mapping[int, dict[str, int]],
                  frames: Mapping[int, dict[str, int]]) -> Locations:
        """From the tables as the text numbers them (module doc), read elsewhere (a serialized module's
        ``stack_frame_index``)."""
        made = cls()
        made._files, made._locations, made._frames = dict(files), dict(locations), dict(frames)
        return made

    def of(self, instr: Instruction) -> str:
        chain = self.chain_of(instr)
        return chain[0] if chain else ""

    def chain_of(self, instr: Instruction) -> tuple[str, ...]:
        """``file:line`` of the instruction (``of``) and of the user's frames that called it, innermost first: one
        where the metadata names a source file (a compiled module's), none where it says nothing."""
        metadata = instr.attrs.get("metadata", "")
        if not metadata:
            return ()
        file = _SOURCE_FILE.search(metadata)
        if file:
            line = _SOURCE_LINE.search(metadata)
            number = hlo_int(line.group(1), f"{instr.name}: source_line", self._source, instr.line,
                             INT32_MAX) if line else 0
            return (source_text(file.group(1), number),)
        frame = _STACK_FRAME.search(metadata)
        return self.chain(hlo_int(frame.group(1), f"{instr.name}: stack_frame_id", self._source, instr.line,
                                  INT32_MAX)) if frame else ()

    def frame(self, frame_id: int) -> str:
        chain = self.chain(frame_id)
        return chain[0] if chain else ""

    def chain(self, frame_id: int) -> tuple[str, ...]:
        """The frames outside the frameworks from ``frame_id`` outwards, innermost first (``CHAIN_FRAMES`` at most);
        the innermost frame alone where every frame is a framework's."""
        if frame_id not in self._resolved:
            self._resolve(frame_id)
        user, innermost = self._resolved.get(frame_id, ((), ""))
        return user if user else ((innermost,) if innermost else ())

    def _resolve(self, frame_id: int) -> None:
        """Each frame's user frames and innermost frame from its caller's, resolved once: the frames up to the first
        one resolved (or the outermost, or a cycle), then back down, so a module of deep stacks costs its frames
        times ``CHAIN_FRAMES``, not their depths squared (a text can hold tens of thousands of frames)."""
        path: list[int] = []
        seen: set[int] = set()
        while frame_id and frame_id in self._frames and frame_id not in self._resolved and frame_id not in seen:
            seen.add(frame_id)
            path.append(frame_id)
            frame_id = self._frames[frame_id].get("parent_frame_id", 0) - 1
        user, innermost = self._resolved.get(frame_id, ((), ""))
        for frame_id in reversed(path):
            location = self._locations.get(self._frames[frame_id].get("file_location_id", 0), {})
            path_name = self._files.get(location.get("file_name_id", 0), "")
            if path_name:
                innermost = f"{PurePosixPath(path_name).name}:{location.get('line', 0)}"
                if not _in_framework(path_name):
                    user = (innermost, *user[:CHAIN_FRAMES - 1])
            self._resolved[frame_id] = (user, innermost)


def source_text(path: str, line: int) -> str:
    """``model.py:41``: the file's name only (where it is installed or checked out says nothing of the model)."""
    name = PurePosixPath(path.replace("\\\\", "/")).name
    return f"{name}:{line}" if line else name


def _in_framework(path: str) -> bool:
    """A frame of jax, flax, optax... (a directory named after one), of a shim that replaces jax's own functions
    for every caller (``SHIMS``), or of Python's own library (a ``python3.*`` directory with no ``site-packages``
    below it)."""
    if path.replace("\\", "/").endswith(SHIMS):
        return True
    folders = PurePosixPath(path).parts[:-1]
    if any(part in FRAMEWORKS for part in folders):
        return True
    installed = "site-packages" in folders or "dist-packages" in folders
    return not installed and any(part.startswith("python3") for part in folders)


def _unquote(value: str) -> str:
    value = value.strip()
    return value[1:-1] if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'" else value


def _fields(value: str) -> dict[str, int]:
    """A debug table entry's numbers (bounded when the text was parsed: ``text.skip_dump_tables``; read here
    without their leading zeros, as XLA reads them)."""
    return {k: bounded(v, k, INT32_MAX) for k, v in TABLE_FIELD.findall(value)}


@dataclass(frozen=True)
class Metadata:
    """What a module's instructions' metadata says, as a stage read it beside a text printed without it (the
    serialized module: ``stages.lowered``): by (computation, instruction), jax's op_name, ``source_file:line``
    where the metadata names it, else its stack frame (``frame``); and the module's stack frame tables as its text
    numbers them (module doc): ``files`` (1 is the first), ``locations`` (file number, line), ``frames`` (location
    number, caller's number plus one). Raw: which frame is the model's is decided here, where the analysis is."""

    instructions: Mapping[tuple[str, str], tuple[str, str, int]]
    files: tuple[str, ...] = ()
    locations: tuple[tuple[int, int], ...] = ()
    frames: tuple[tuple[int, int], ...] = ()

    def places(self, names: Mapping[tuple[str, str], tuple[str, str]] | None = None) -> Places:
        """Each instruction's ``Origin``, keyed by ``names`` (the canonical text's: ``normalize.normalize_with_names``)
        where given. Of identical computations (printed once) the first's; an instruction ``names`` does not hold is
        left out."""
        frames = Locations.of_tables(
            dict(enumerate(self.files, 1)),
            {n: {"file_name_id": f, "line": line} for n, (f, line) in enumerate(self.locations, 1)},
            {n: {"file_location_id": loc, "parent_frame_id": parent} for n, (loc, parent) in enumerate(self.frames, 1)})
        found: dict[tuple[str, str], Origin] = {}
        for where, (op_name, source, frame) in self.instructions.items():
            key = names.get(where) if names is not None else where
            if key is not None and key not in found:
                chain = (source,) if source else frames.chain(frame) if frame else ()
                found[key] = Origin(op_name, chain[0] if chain else "", chain[1:])
        return found

    def to_record(self) -> dict:
        """JSON (``_interned_to_record``'s, each instruction's frame after its op_name and source), with the tables."""
        return {**_interned_to_record(self.instructions), "files": list(self.files),
                "locations": [list(x) for x in self.locations], "frames": [list(x) for x in self.frames]}

    @classmethod
    def from_record(cls, record: Mapping) -> Metadata:
        return cls(_interned_from_record(record), tuple(record["files"]), tuple(map(tuple, record["locations"])),
                   tuple(map(tuple, record["frames"])))


def places_to_record(places: Places) -> dict:
    """Places as JSON (``_interned_to_record``'s), the callers as the stack frames they are: ``"callers"`` lists each
    frame once, ``[its source's index, its caller's number + 1]`` (0: none), and an instruction with callers has its
    innermost caller's number after its op_name's and source's indices (thousands of instructions share a few hundred
    frames)."""
    sources: dict[str, int] = {}
    frames: dict[tuple[int, int], int] = {}

    def frame_of(callers: tuple[str, ...]) -> int:
        parent = 0
        for caller in reversed(callers):
            parent = frames.setdefault((sources.setdefault(caller, len(sources)), parent), len(frames)) + 1
        return parent - 1

    rows = {key: (origin.op_name, origin.source, *((frame_of(origin.callers),) if origin.callers else ()))
            for key, origin in places.items()}
    record = _interned_to_record(rows, sources)
    return {**record, **({"callers": [list(f) for f in frames]} if frames else {})}


def places_from_record(record: Mapping) -> dict[tuple[str, str], Origin]:
    """``places_to_record``'s other way; a record written before callers were kept reads with none."""
    sources, frames = record["sources"], record.get("callers", ())
    chains: dict[int, tuple[str, ...]] = {}

    def chain(number: int) -> tuple[str, ...]:
        if number not in chains:
            found, at = [], number
            while at >= 0 and len(found) < len(frames):  # a record's frames are a tree; bounded all the same
                source, parent = frames[at]
                found.append(sources[source])
                at = parent - 1
            chains[number] = tuple(found)
        return chains[number]

    return {key: Origin(op_name, source, chain(rest[0]) if rest else ())
            for key, (op_name, source, *rest) in _interned_from_record(record).items()}


def _interned_to_record(rows: Mapping[tuple[str, str], tuple], sources: dict[str, int] | None = None) -> dict:
    """Rows of an op_name, a source and what follows as JSON, each op_name and source once (a few hundred distinct
    ones place thousands of instructions): ``{"op_names": [...], "sources": [...], "at": {computation: {instruction:
    [op_name's index, source's index, *the rest]}}}``; ``sources``: those numbered already."""
    op_names: dict[str, int] = {}
    sources = {} if sources is None else sources
    at: dict[str, dict[str, list]] = {}
    for (computation, instruction), (op_name, source, *rest) in rows.items():
        at.setdefault(computation, {})[instruction] = [op_names.setdefault(op_name, len(op_names)),
                                                       sources.setdefault(source, len(sources)), *rest]
    return {"op_names": list(op_names), "sources": list(sources), "at": at}


def _interned_from_record(record: Mapping) -> dict[tuple[str, str], tuple]:
    op_names, sources = record["op_names"], record["sources"]
    return {(computation, instruction): (op_names[o], sources[s], *rest)
            for computation, instructions in record["at"].items()
            for instruction, (o, s, *rest) in instructions.items()}


def text_places(module: HloModule, names: Mapping[tuple[str, str], tuple[str, str]]) -> Places:
    """Each instruction's ``Origin``, from the metadata ``module``'s own text prints (a dump, a file
    written with debug info), keyed by ``names`` (its canonical text's: ``normalize.normalize_with_names``): what
    places the changes of a module compared through its canonical text, as a stage's ``Metadata.places`` does for
    a text printed without it. Of identical computations (printed once) the first's."""
    locations = Locations(module)
    found: dict[tuple[str, str], Origin] = {}
    for comp in module.computations.values():
        for instr in comp.instructions:
            key = names.get((comp.name, instr.name))
            if key is None or key in found:
                continue
            chain = locations.chain_of(instr)
            if instr.op_name or chain:
                found[key] = Origin(instr.op_name, chain[0] if chain else "", chain[1:])
    return found


def named_lines(module: HloModule, metadata: Metadata | None = None) -> dict[str, set[int]]:
    """Every source line an instruction's stack names, by the file's path as the module gives it, the frameworks'
    frames aside (``_in_framework``): the stack frame tables' locations (a stage's ``metadata``, else the module's
    own tables) and each instruction's ``source_file``/``source_line``. What ``check --changes`` reads as the lines
    in a cell's program (``analysed.CodeReach.named``)."""
    found: dict[str, set[int]] = {}

    def add(path: str, line: int) -> None:
        if path and line > 0 and not _in_framework(path):
            found.setdefault(path, set()).add(line)

    if metadata is not None:
        for file_number, line in metadata.locations:
            if 0 < file_number <= len(metadata.files):
                add(metadata.files[file_number - 1], line)
    tables = module.debug_tables
    files = {n: _unquote(v) for n, v in tables.get("FileNames", {}).items()}
    for value in tables.get("FileLocations", {}).values():
        fields = _fields(value)
        add(files.get(fields.get("file_name_id", 0), ""), fields.get("line", 0))
    for instr in module.instructions():
        metadata_text = instr.attrs.get("metadata", "")
        if "source_file" in metadata_text and (file := _SOURCE_FILE.search(metadata_text)):
            line = _SOURCE_LINE.search(metadata_text)
            add(file.group(1), hlo_int(line.group(1), f"{instr.name}: source_line", module.source, instr.line,
                                          INT32_MAX) if line else 0)
    return found


class PlacedByChange(dict):
    """Places (``Places``: instruction -> ``Origin``) moved to a pull request's changed lines (``placed_by_change``),
    with those lines (``changed``): where one story of many instructions is placed, a changed line its instructions
    pass through is preferred to the line most of them share (the copy a match called inserted may be the old call's:
    two identical calls of one helper are told apart by the change alone)."""

    def __init__(self, places: Places, changed: frozenset[str]):
        super().__init__(places)
        self.changed = changed


def placed_by_change(places: Places, changed: frozenset[str]) -> Places:
    """``places`` with each instruction placed at the innermost frame of its stack that is a changed line
    (``changed``: ``file:line`` as places name them, a pull request's changed lines), the frames it was called from
    kept: a new call of a helper the path already calls is placed at the new call, not at the helper's line every
    call shares, and an instruction whose stack passes through no changed line keeps its place."""
    if not changed:
        return places
    moved: dict[tuple[str, str], Origin] = {}
    for key, origin in places.items():
        chain = (origin.source, *origin.callers)
        at = next((i for i, frame in enumerate(chain) if frame in changed), None)
        moved[key] = origin if at in (None, 0) else Origin(origin.op_name, chain[at], chain[at + 1:])
    return PlacedByChange(moved, changed)


def changed_lines_of(places: Places | None) -> frozenset[str]:
    """The changed lines ``places`` were placed by (``PlacedByChange``); none for any other."""
    return places.changed if isinstance(places, PlacedByChange) else frozenset()
