"""HLO shapes: arrays (``f32[2,4]{1,0}``), tuples (``(f32[], s32[2])``), buffers of an array (``b(f32[16])``).

Element types are read by their name's pattern rather than from a fixed table, so a type XLA adds later
(``f6e3m2fn``, say) is still an array of known width: the number after the kind letter is its bit width.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

# Kind letters and widths: s32, u4, f16, bf16, c64, and the small floats f8e4m3fn, f8e4m3b11fnuz, f4e2m1fn...
_ELEMENT_TYPE = re.compile(r"(?:s|u|f|bf|c)(\d+)(?:e\d+m\d+[a-z0-9]*)?")
_SPECIAL_TYPES = {"pred": 8, "token": 0, "opaque": 0}
_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
_ARRAY = re.compile(r"([a-z][a-z0-9]*)\[([^\]]*)\]\s*(\{[^}]*\})?")
_SHAPE_TOKEN = re.compile(r"[(){}\[\],]")


def element_bits(dtype: str) -> int | None:
    """Bits per element of an HLO element type; None if ``dtype`` is not one."""
    bits = _SPECIAL_TYPES.get(dtype)
    if bits is not None:
        return bits
    m = _ELEMENT_TYPE.fullmatch(dtype)
    return int(m.group(1)) if m else None


def is_element_type(word: str) -> bool:
    return element_bits(word) is not None


@dataclass(frozen=True, slots=True)
class Shape:
    """An HLO shape: an array (dtype, dims, layout), a tuple of shapes, or a buffer of one array."""

    text: str
    dtype: str | None = None  # None for tuples; a buffer's is its array's
    dims: tuple[int, ...] = ()
    layout: str | None = None
    elements: tuple["Shape", ...] = ()  # a tuple's elements

    @property
    def is_tuple(self) -> bool:
        return self.dtype is None

    @property
    def num_elements(self) -> int:
        n = 1
        for d in self.dims:
            n *= max(d, 0)
        return n

    @property
    def bytes(self) -> int:
        if self.is_tuple:
            return sum(e.bytes for e in self.elements)
        return (self.num_elements * (element_bits(self.dtype) or 0) + 7) // 8

    def leaves(self) -> list["Shape"]:
        if not self.is_tuple:
            return [self]
        return [leaf for e in self.elements for leaf in e.leaves()]


def array_shape(dtype: str, dims: tuple[int, ...], layout: str | None = None) -> Shape:
    """An array shape built from its parts (shape inference), printed as XLA prints it."""
    text = f"{dtype}[{','.join(map(str, dims))}]" + (f"{{{layout}}}" if layout is not None and dims else "")
    return Shape(text=text, dtype=dtype, dims=dims, layout=layout if dims else None)


def tuple_shape(elements: list[Shape] | tuple[Shape, ...]) -> Shape:
    return Shape(text="(" + ", ".join(e.text for e in elements) + ")", elements=tuple(elements))


@functools.lru_cache(maxsize=65536)
def parse_shape(text: str) -> Shape:
    """Parse a shape such as ``f32[2,4]{1,0}``, ``u32[]``, ``(f32[], /*index=1*/s32[2])`` or ``b(f32[16])``.

    Comments and whitespace between tokens are allowed, as XLA allows them (``bf16[1,128] {1,0}``).
    """
    if "/" in text:
        text = _COMMENT.sub("", text)
    text = text.strip()
    if text.startswith("("):
        inner = text[1:-1].strip()
        if not text.endswith(")"):
            raise ValueError(f"not an HLO shape: {text[:60]!r}")
        elements = tuple(parse_shape(p) for p in _split_elements(inner)) if inner else ()
        return tuple_shape(elements)
    if text.startswith("b(") and text.endswith(")"):
        array = parse_shape(text[2:-1])
        if array.is_tuple:
            raise ValueError(f"not an HLO shape: a buffer holds an array, got {text[:60]!r}")
        return Shape(text=f"b({array.text})", dtype=array.dtype, dims=array.dims, layout=array.layout)
    m = _ARRAY.fullmatch(text)
    if not m or not is_element_type(m.group(1)):
        raise ValueError(f"not an HLO shape: {text[:60]!r}")
    dims = tuple(_parse_dim(d) for d in m.group(2).split(",") if d.strip())
    layout = m.group(3)[1:-1] if m.group(3) else None
    if m.group(3) and text[m.start(3) - 1].isspace():
        text = text[:m.end(2) + 1] + m.group(3)
    return Shape(text=text, dtype=m.group(1), dims=dims, layout=layout)


def _split_elements(inner: str) -> list[str]:
    """A tuple's element texts: the commas outside every bracket (dims, layouts, nested tuples)."""
    parts: list[str] = []
    depth = start = 0
    for m in _SHAPE_TOKEN.finditer(inner):
        tok = m.group()
        if tok in "({[":
            depth += 1
        elif tok in ")}]":
            depth -= 1
        elif depth == 0:
            parts.append(inner[start:m.start()])
            start = m.end()
    parts.append(inner[start:])
    return parts


def _parse_dim(d: str) -> int:
    d = d.strip()
    if d == "?":
        return -1
    return int(d.removeprefix("<="))


def with_default_layout(shape: Shape) -> str:
    """The shape's text with XLA's default layout where it has none (``f32[2,3]`` -> ``f32[2,3]{1,0}``).

    XLA gives every array without a layout the default one, so the two spellings are one shape.
    """
    if shape.is_tuple:
        return "(" + ", ".join(with_default_layout(e) for e in shape.elements) + ")"
    if shape.layout is not None or not shape.dims:
        return shape.text
    default = "{" + ",".join(str(i) for i in reversed(range(len(shape.dims)))) + "}"
    return shape.text[:-1] + default + ")" if shape.text.startswith("b(") else shape.text + default
