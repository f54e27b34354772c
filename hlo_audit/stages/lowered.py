"""Stage ``lowered``: jax's module as it hands it to XLA, with jax's argument paths."""

from __future__ import annotations

import hashlib
import math
from typing import TYPE_CHECKING

from hlo_audit.attribution import arg_keys
from hlo_audit.lowering import Lowering

if TYPE_CHECKING:
    from hlo_audit.matrix import Cell


def run(lowered, cell: Cell) -> Lowering:
    module = lowered.compiler_ir(dialect="hlo").as_hlo_module()
    return Lowering(text=hlo_text(lowered, module), arg_keys=arg_keys(lowered), literal_digests=literal_digests(module))


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


# XLA elides a constant's literal in the text when it has more than this many elements (print_large_constants off).
_PRINTED_ELEMENTS = 10
# HloInstructionProto's `literal` field (xla/service/hlo.proto): the constant's LiteralProto, shape and values.
_LITERAL_FIELD = 8


def literal_digests(module) -> tuple[tuple[str, str, str], ...]:
    """(computation, instruction, sha256 of its literal) of every constant of an XLA ``HloModule`` whose values the
    text elides: what makes a value-only change show in the canonical text (``hlo.constants.add_literal_digests``)."""
    digests = []
    for computation in module.computations():
        for instr in computation.instructions():
            if str(instr.opcode) != "HloOpcode.kConstant" or _elements(instr.shape) <= _PRINTED_ELEMENTS:
                continue
            literal = _field(instr.as_serialized_proto(), _LITERAL_FIELD)
            if literal is not None:
                digests.append((computation.name, instr.name, "sha256:" + hashlib.sha256(literal).hexdigest()[:32]))
    return tuple(digests)


def _elements(shape) -> int:
    if shape.is_tuple():
        return sum(_elements(s) for s in shape.tuple_shapes())
    return math.prod(shape.dimensions())


def _field(message: bytes, number: int) -> bytes | None:
    """The bytes of the first length-delimited field ``number`` of a serialized protobuf message (top level)."""
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
            varint()
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire == 2:
            size = varint()
            if tag >> 3 == number:
                return bytes(view[pos:pos + size])
            pos += size
        else:  # groups: not in HloInstructionProto
            return None
    return None
