"""Kernels in custom calls (Pallas on Mosaic TPU, Triton, Mosaic GPU), compared by what they compute.

A Pallas kernel reaches HLO as a custom call whose ``backend_config`` carries the kernel itself: for Mosaic TPU
(``tpu_custom_call``) a JSON object whose ``custom_call_config.body`` is the kernel's MLIR module, serialized as
MLIR bytecode and base64-encoded. The canonical text drops that body (megabytes, normalize.py); the structural diff
compares it by a digest of its content, so a changed kernel (another block size, another grid) is a change.

What is not the kernel's content is left out of the digest, so that the same program lowered from another checkout
or another virtual environment digests alike (MaxText PR #4445's false alarm: the body embedded the absolute path
of jax's install):

* source locations kept apart: jax 0.12 moves a Mosaic kernel's locations into ``debug_locations`` (a second
  bytecode beside the body, unless ``jax_mosaic_unzip_debug_locations`` is off); that key is dropped;
* paths inside the bytecode: where locations stay in the body, each file name is a string of the bytecode's string
  table (``mlir/lib/Bytecode``: a section of null-terminated strings, referenced by index). The digest reads the
  string table and keeps each absolute path's last component only (``/venv/.../jax/_src/pallas/core.py`` ->
  ``core.py``); the other sections, which refer to strings by index, are digested as they are. (Line and column
  numbers of such locations are varints inside the attribute section: a kernel whose source moved digests apart
  there, never one installed elsewhere.)
* Triton's config (``__gpu$xla.gpu.triton``) is an MLIR attribute dictionary (``{grid_x = 4 : i32, ..., ir =
  "ML\\EFR..."}``) whose ``ir`` string is the kernel's bytecode, escaped (``\\XX`` per byte): it is unescaped and
  digested as above. In any other config (Mosaic GPU's, a format this module does not read), absolute paths and
  MLIR ``loc(...)`` annotations of the text are masked the same way.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re

from hlo_audit.hlo.text import HloModule, Instruction

# Custom calls whose backend_config is a serialized kernel (megabytes, with embedded source locations).
KERNEL_CUSTOM_CALLS = ("tpu_custom_call", "__gpu$xla.gpu.triton", "mosaic_gpu", "__gpu$xla.gpu.ext.mosaic")
# Keys of a kernel config that only say where the kernel's source is.
_LOCATION_KEYS = frozenset({"debug_locations", "locations", "location", "loc", "source_location", "source_file",
                            "source_line"})
_BYTECODE_MAGIC = b"ML\xefR"
_BASE64_BYTECODE = "TUzvU"  # base64 of the magic's first bytes
_STRING_SECTION = 0
# An absolute path (POSIX or Windows), as text inside a config.
_PATH_IN_TEXT = re.compile(r"(?:[A-Za-z]:[\\/]|/)(?:[\w.+@~-]+[\\/])+([\w.+@~-]+)")
_LOC = re.compile(r"\bloc\((?:[^()\"]|\"(?:[^\"\\]|\\.)*\")*\)")
_ABSOLUTE_PATH = re.compile(rb"^(?:[A-Za-z]:[\\/]|/)(?:[^\\/\x00]+[\\/])+([^\\/\x00]+)$")
# An MLIR string literal (its escapes read by _mlir_unescape).
_MLIR_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"', re.S)
_MLIR_ESCAPES = {"n": b"\n", "t": b"\t", '"': b'"', "\\": b"\\"}
_KERNEL_NAME = re.compile(r'\\?"name\\?"\s*:\s*\\?"([^"\\]+)|\bname\s*=\s*"([^"\\]+)"')  # JSON's, MLIR's


def is_kernel_call(instr: Instruction) -> bool:
    return instr.opcode == "custom-call" and any(k in instr.custom_call_target for k in KERNEL_CUSTOM_CALLS)


def kernel_name(instr: Instruction) -> str:
    """The kernel's own name where the config says it (Mosaic's ``name``), else the custom call's target."""
    m = _KERNEL_NAME.search(instr.attrs.get("backend_config", ""))
    return (m.group(1) or m.group(2)) if m else instr.custom_call_target


def kernel_digests(module: HloModule) -> dict[str, tuple[str, ...]]:
    """The module's kernels by name, each name's content digests sorted (a golden keeps them: its canonical text
    drops the bodies); empty when it runs none."""
    found: dict[str, list[str]] = {}
    for instr in module.instructions():
        if is_kernel_call(instr):
            found.setdefault(kernel_name(instr), []).append(kernel_digest(instr))
    return {name: tuple(sorted(digests)) for name, digests in sorted(found.items())}


def kernel_digest(instr: Instruction) -> str:
    """16 hex digits of the kernel's content: its ``backend_config`` without source locations and install paths
    (module doc). Equal for the same kernel lowered anywhere; different for any change to what it computes."""
    return hashlib.sha256(canonical_config(instr.attrs.get("backend_config", "")).encode()).hexdigest()[:16]


def canonical_config(value: str) -> str:
    """A kernel config as compared: JSON without location keys, bytecode with paths cut to file names."""
    text = _unquoted(value.strip())
    try:
        config = json.loads(text)
    except ValueError:
        return _MLIR_STRING.sub(_mlir_string, _masked_text_outside_strings(text))
    return json.dumps(_without_locations(config), sort_keys=True, separators=(",", ":"))


def _mlir_string(m: re.Match) -> str:
    """An MLIR string literal of a config: bytecode as its digest, any other as its text, paths masked."""
    data = _mlir_unescape(m.group(1))
    if data.startswith(_BYTECODE_MAGIC):
        try:
            return f'"<bytecode {_digest_parts(_bytecode_parts(data))}>"'
        except (IndexError, ValueError):
            pass
    return '"' + _masked_text(data.decode("utf-8", "replace")) + '"'


def _masked_text_outside_strings(text: str) -> str:
    """Paths and locations masked outside string literals (inside them, ``_mlir_string`` reads the bytes)."""
    pieces, at = [], 0
    for m in _MLIR_STRING.finditer(text):
        pieces += [_masked_text(text[at:m.start()]), m.group()]
        at = m.end()
    return "".join(pieces) + _masked_text(text[at:])


def _mlir_unescape(body: str) -> bytes:
    """An MLIR string literal's bytes: ``\\XX`` is the byte XX, ``\\n`` / ``\\t`` / ``\\"`` / ``\\\\`` their
    characters."""
    out = bytearray()
    i = 0
    while i < len(body):
        c = body[i]
        if c != "\\" or i + 1 >= len(body):
            out += c.encode()
            i += 1
        elif body[i + 1] in _MLIR_ESCAPES:
            out += _MLIR_ESCAPES[body[i + 1]]
            i += 2
        else:
            try:
                out.append(int(body[i + 1:i + 3], 16))
                i += 3
            except ValueError:
                out += c.encode()
                i += 1
    return bytes(out)


def _unquoted(value: str) -> str:
    """An HLO string attribute's content (``"{\\"a\\": 1}"`` -> ``{"a": 1}``: XLA's escapes are JSON's); anything
    else as it is."""
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        try:
            return json.loads(value) if value[0] == '"' else value[1:-1]
        except ValueError:
            return value[1:-1]
    return value


def _without_locations(value):
    if isinstance(value, dict):
        return {k: _without_locations(v) for k, v in value.items() if k not in _LOCATION_KEYS}
    if isinstance(value, list):
        return [_without_locations(v) for v in value]
    if isinstance(value, str):
        if value.startswith(_BASE64_BYTECODE):
            digest = _bytecode_digest(value)
            if digest is not None:
                return f"<bytecode {digest}>"
        return _masked_text(value)
    return value


def _masked_text(text: str) -> str:
    return _PATH_IN_TEXT.sub(r"\1", _LOC.sub("loc(?)", text))


def _bytecode_digest(encoded: str) -> str | None:
    """The digest of a base64 MLIR bytecode with its string table's paths cut to file names; None when it is not
    bytecode this reader understands (then the text is compared, paths masked)."""
    try:
        data = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        return None
    try:
        return _digest_parts(_bytecode_parts(data))
    except (IndexError, ValueError):
        return None


def _digest_parts(parts: list[bytes]) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(len(part).to_bytes(8, "little"))
        digest.update(part)
    return digest.hexdigest()[:16]


def _bytecode_parts(data: bytes) -> list[bytes]:
    """Header, then each section's id and bytes; the string section as its strings, absolute paths cut to their last
    component (``mlir/lib/Bytecode/Writer/BytecodeWriter.cpp``: magic, version, producer, then sections)."""
    if not data.startswith(_BYTECODE_MAGIC):
        raise ValueError("not MLIR bytecode")
    version, at = _varint(data, len(_BYTECODE_MAGIC))
    end = data.index(b"\0", at)
    parts = [version.to_bytes(8, "little"), data[at:end]]
    at = end + 1
    while at < len(data):
        header = data[at]
        section, aligned = header & 0x7F, header & 0x80
        length, at = _varint(data, at + 1)
        if aligned:
            alignment, at = _varint(data, at)
            if alignment <= 0 or alignment & (alignment - 1):
                raise ValueError("bad section alignment")
            at += -at % alignment
        body = data[at:at + length]
        if len(body) != length:
            raise ValueError("truncated section")
        at += length
        parts.append(bytes([section]))
        parts.extend(_strings(body) if section == _STRING_SECTION else [body])
    return parts


def _strings(section: bytes) -> list[bytes]:
    count, at = _varint(section, 0)
    for _ in range(count):  # each string's length (with its terminator): the data that follows says the same
        _, at = _varint(section, at)
    strings = section[at:].split(b"\0")
    if strings and not strings[-1]:
        strings.pop()
    if len(strings) != count:
        raise ValueError("string table does not match its count")
    return [_ABSOLUTE_PATH.sub(rb"\1", s) for s in strings]


def _varint(data: bytes, at: int) -> tuple[int, int]:
    """MLIR bytecode's prefix varint: the first byte's trailing zeros count the bytes that follow it."""
    first = data[at]
    if first & 1:
        return first >> 1, at + 1
    if first == 0:
        if at + 9 > len(data):
            raise ValueError("truncated varint")
        return int.from_bytes(data[at + 1:at + 9], "little"), at + 9
    size = (first & -first).bit_length()
    if at + size > len(data):
        raise ValueError("truncated varint")
    return int.from_bytes(data[at:at + size], "little") >> size, at + size
