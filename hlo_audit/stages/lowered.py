"""Stage ``lowered``: jax's module as it hands it to XLA, with jax's argument paths."""

from __future__ import annotations

import hashlib
import re
from typing import TYPE_CHECKING

from hlo_audit.attribution import arg_keys
from hlo_audit.lowering import Lowering

if TYPE_CHECKING:
    from hlo_audit.matrix import Cell


def run(lowered, cell: Cell) -> Lowering:
    module = lowered.compiler_ir(dialect="hlo").as_hlo_module()
    text = hlo_text(lowered, module)
    return Lowering(text=text, arg_keys=arg_keys(lowered), literal_digests=literal_digests(module, text))


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


def _fields(message, number: int):
    """The length-delimited fields ``number`` of a serialized protobuf message (its top level), as memoryviews."""
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
                yield view[pos:pos + size]
            pos += size
        else:  # groups: no HLO proto has them
            return
