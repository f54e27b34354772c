"""Stage ``lowered``: jax's module as it hands it to XLA, with jax's argument paths."""

from __future__ import annotations

import hashlib
import re
from typing import TYPE_CHECKING

from hlo_audit.attribution import arg_keys
from hlo_audit.hlo.locations import Metadata, source_text
from hlo_audit.lowering import Lowering

if TYPE_CHECKING:
    from hlo_audit.matrix import Cell


def run(lowered, cell: Cell) -> Lowering:
    module = lowered.compiler_ir(dialect="hlo").as_hlo_module()
    text = hlo_text(lowered, module)
    return Lowering(text=text, arg_keys=arg_keys(lowered), literal_digests=literal_digests(module, text),
                    metadata=instruction_metadata(module))


def hlo_text(lowered, module=None) -> str:
    """``lowered.as_text(dialect="hlo")``, except that constants of more than ten elements print as ``{...}``.

    A step that closes over model state holds it as literals, and jax prints them in full: MaxEngine's serve-mode
    decode step with real weights is ~1.93 GB of text at 2 layers. XLA's parser reads ``{...}`` back (the shape
    stays, the values go), and no analysis here reads the values of a constant that large. jax has no public
    switch for it, so its own printer is called with XLA's ``print_large_constants`` off.
    """
    from jax._src.lib import hlo  # noqa: PLC0415 (jax's HloPrintOptions; no public name)

    options = hlo.HloPrintOptions.short_parsable()  # what as_text(dialect="hlo") uses, without metadata
    options.print_metadata = False
    options.print_large_constants = False
    module = module if module is not None else lowered.compiler_ir(dialect="hlo").as_hlo_module()
    return module.to_string(options)


# HloModuleProto.computations, HloComputationProto.{name, instructions}, HloInstructionProto.{name, literal}
# (xla/service/hlo.proto): where each constant's LiteralProto (its shape and values) is.
_COMPUTATIONS, _NAME, _INSTRUCTIONS, _LITERAL = 3, 1, 2, 8
# A constant whose literal XLA's printer elides (print_large_constants off), as hlo_text prints it.
_ELIDED = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=.*?\bconstant\(\{\.\.\.\}\)", re.M)


def literal_digests(module, text: str | None = None) -> tuple[tuple[str, str, str], ...]:
    """(computation, instruction, sha256 of its literal) of every constant whose values ``text`` (the module as
    printed, ``hlo_text``) elides as ``{...}``: what makes a value-only change show in the canonical text
    (``hlo.constants.add_literal_digests``). Read from the serialized module, which every jaxlib has (0.11's
    instructions expose neither their shape nor their proto)."""
    elided = set(_ELIDED.findall(text if text is not None else module.to_string()))
    if not elided:
        return ()
    digests = []
    for computation in _fields(module.as_serialized_hlo_module_proto(), _COMPUTATIONS):
        name = bytes(next(iter(_fields(computation, _NAME)), b"")).decode()
        for instruction in _fields(computation, _INSTRUCTIONS):
            instr = bytes(next(iter(_fields(instruction, _NAME)), b"")).decode()
            if instr in elided:
                literal = next(iter(_fields(instruction, _LITERAL)), None)
                if literal is not None:
                    digests.append((name, instr, "sha256:" + hashlib.sha256(literal).hexdigest()[:32]))
    return tuple(digests)


# HloInstructionProto.metadata (OpMetadata: op_name, source_file, source_line, stack_frame_id) and
# HloModuleProto.stack_frame_index (StackFrameIndexProto: file_names, file_locations, stack_frames), as jaxlib 0.12
# serializes them (its text prints the same tables: hlo.locations).
_METADATA, _STACK_FRAME_INDEX = 7, 17
_OP_NAME, _SOURCE_FILE, _SOURCE_LINE, _STACK_FRAME_ID = 2, 3, 4, 15
_FILE_NAMES, _FILE_LOCATIONS, _STACK_FRAMES = 1, 3, 4
_FILE_NAME_ID, _LINE = 1, 3
_FILE_LOCATION_ID, _PARENT_FRAME_ID = 1, 2


def instruction_metadata(module) -> Metadata:
    """Each instruction's op_name and source (a file and line, or a stack frame) and the module's stack frame tables
    (``hlo.locations.Metadata``): where in the model a change is (``hlo.changes.Place``), which the text, printed
    without metadata (``hlo_text``), does not say. Read from the serialized module, not from a second printing:
    the text with metadata is ~2.3x the text."""
    proto = module.as_serialized_hlo_module_proto()
    instructions = {}
    for computation in _fields(proto, _COMPUTATIONS):
        name = bytes(next(iter(_fields(computation, _NAME)), b"")).decode()
        for instruction in _fields(computation, _INSTRUCTIONS):
            metadata = next(iter(_fields(instruction, _METADATA)), None)
            if metadata is None:
                continue
            strings, numbers = _scalars(metadata)
            op_name, frame = strings.get(_OP_NAME, ""), numbers.get(_STACK_FRAME_ID, 0)
            source = source_text(strings[_SOURCE_FILE], numbers.get(_SOURCE_LINE, 0)) \
                if strings.get(_SOURCE_FILE) else ""
            if op_name or source or frame:
                instr = bytes(next(iter(_fields(instruction, _NAME)), b"")).decode()
                instructions[name, instr] = (op_name, source, 0 if source else frame)
    index = next(iter(_fields(proto, _STACK_FRAME_INDEX)), b"")
    # Numbered as the text prints them: a frame's parent is the caller's number plus one (the proto's: the number).
    return Metadata(instructions, tuple(bytes(v).decode() for v in _fields(index, _FILE_NAMES)),
                    tuple((n.get(_FILE_NAME_ID, 0), n.get(_LINE, 0))
                          for _, n in map(_scalars, _fields(index, _FILE_LOCATIONS))),
                    tuple((n.get(_FILE_LOCATION_ID, 0), n.get(_PARENT_FRAME_ID, 0) + 1)
                          for _, n in map(_scalars, _fields(index, _STACK_FRAMES))))


def _scalars(message) -> tuple[dict[int, str], dict[int, int]]:
    """A flat message's strings and varints by field number (the last of each, as protobuf reads them)."""
    strings: dict[int, str] = {}
    numbers: dict[int, int] = {}
    for number, value in _all_fields(message):
        if isinstance(value, int):
            numbers[number] = value
        else:
            strings[number] = bytes(value).decode(errors="replace")
    return strings, numbers


def _fields(message, number: int):
    """The length-delimited fields ``number`` of a serialized protobuf message (its top level), as memoryviews."""
    return (value for n, value in _all_fields(message) if n == number and not isinstance(value, int))


def _all_fields(message):
    """(field number, value) of a serialized protobuf message's top level: varints as ints, length-delimited fields as
    memoryviews (fixed-width ones skipped)."""
    view, pos = memoryview(message), 0

    def varint() -> int:
        nonlocal pos
        value = shift = 0
        while True:
            byte = view[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                return value

    while pos < len(view):
        tag = varint()
        wire = tag & 7
        if wire == 0:
            yield tag >> 3, varint()
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire == 2:
            size = varint()
            yield tag >> 3, view[pos:pos + size]
            pos += size
        else:  # groups: no HLO proto has them
            return
