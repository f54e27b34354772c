"""HLO shapes: arrays (``f32[2,4]{1,0}``), tuples (``(f32[], s32[2])``), buffers of an array (``b(f32[16])``).

Element types are read by their name's pattern rather than from a fixed table, so a type XLA adds later
(``f6e3m2fn``, say) is still an array of known width: the number after the kind letter is its bit width.

Nothing here recurses: a tuple nested hundreds deep (valid HLO) is parsed, walked and printed with explicit
stacks, so its depth costs memory, never Python's recursion limit. Past ``MAX_NESTING`` levels a shape is
refused with a message: XLA's own parser refuses past 500 levels of recursion (``HloParserOptions::
kDefaultMaxRecursionDepth``, xla/hlo/parser/hlo_parser.h; one level per tuple parenthesis, so it reads at most
498 nested tuples), and jaxlib 0.12.0.1's, which has no such limit, crashes (SIGSEGV) past about 7000.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from hlo_audit.hlo.numbers import bounded, canonical

# Kind letters and widths: s32, u4, f16, bf16, c64, and the small floats f8e4m3fn, f8e4m3b11fnuz, f4e2m1fn...
_ELEMENT_TYPE = re.compile(r"(?:s|u|f|bf|c)(\d+)(?:e\d+m\d+[a-z0-9]*)?")
_SPECIAL_TYPES = {"pred": 8, "token": 0, "opaque": 0}
_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
# Whitespace may stand between any two tokens, as XLA's lexer reads them (``s32 [5, 10] {1, 0}``).
_ARRAY = re.compile(r"([a-z][a-z0-9]*)\s*\[([^\]]*)\]\s*(\{[^}]*\})?")
# One token of a shape's text: a buffer's opening ``b(``, a parenthesis, a comma, or one whole array shape.
_SHAPE_TOKEN = re.compile(r"\s*(?:(b\s*\()|([(),])|([a-z][a-z0-9]*\s*\[[^\]]*\]\s*(?:\{[^}]*\})?))")
_SPACE = re.compile(r"\s+")
_TRAILING_SPACE = re.compile(r"\s*")


def quoted_body(quote: str, newline: bool = True) -> str:
    """A regex for the inside of a ``quote``-delimited string with backslash escapes (without ``newline``, no line
    break outside an escape), as the unrolled loop ``[^q\\]*+(?:\\.[^q\\]*+)*+``: possessive, so it never
    backtracks and holds no state per character. The textbook ``(?:[^q\\]|\\.)*`` keeps a backtracking point per
    character: 10 MB of a generated ``op_name`` took 1.1 GB and 5 s to match, 60 MB ran out of memory."""
    plain = "[^" + re.escape(quote) + r"\\" + ("" if newline else r"\n") + "]*+"
    return plain + r"(?:\\." + plain + ")*+"


def quoted(quote: str, newline: bool = True) -> str:
    """A regex for a whole ``quote``-delimited string (``quoted_body`` between the quotes)."""
    return quote + quoted_body(quote, newline) + quote


# Brackets, commas, strings, comment starts and lone quotes (an unterminated string): what splitting a shape
# or an attribute list at its top-level commas must see.
TOKEN = re.compile(quoted('"') + "|" + quoted("'") + r'|//|/\*|["\']|[{}()\[\],]')

# As many levels of nesting (tuple parentheses here; nested operands and inline computations in text.py) as
# XLA's parser reads at most: 500 levels of recursion (see the module docstring).
MAX_NESTING = 500


def element_bits(dtype: str) -> int | None:
    """Bits per element of an HLO element type; None if ``dtype`` is not one."""
    bits = _SPECIAL_TYPES.get(dtype)
    if bits is not None:
        return bits
    m = _ELEMENT_TYPE.fullmatch(dtype)
    return int(m.group(1)) if m and len(m.group(1)) <= 3 else None  # f99999...: no type of XLA's


def is_element_type(word: str) -> bool:
    return element_bits(word) is not None


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class Shape:
    """An HLO shape: an array (dtype, dims, layout), a tuple of shapes, or a buffer of one array.

    Two shapes are equal when their texts are (every other field is read off the text); comparing and hashing
    the text, rather than the nested elements, keeps a deep tuple from recursing.
    """

    text: str
    dtype: str | None = None  # None for tuples; a buffer's is its array's
    dims: tuple[int, ...] = ()
    layout: str | None = None
    elements: tuple["Shape", ...] = ()  # a tuple's elements

    def __eq__(self, other: object) -> bool:
        return self is other or (isinstance(other, Shape) and self.text == other.text)

    def __hash__(self) -> int:
        return hash(self.text)

    def __repr__(self) -> str:
        return f"Shape({self.text!r})"

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
        return sum((leaf.num_elements * (element_bits(leaf.dtype) or 0) + 7) // 8 for leaf in self.leaves())

    def leaves(self) -> list["Shape"]:
        """The arrays of a tuple, depth first in order (an array is its own one leaf)."""
        if not self.is_tuple:
            return [self]
        leaves: list[Shape] = []
        stack: list[Iterator[Shape]] = [iter(self.elements)]
        while stack:
            element = next(stack[-1], None)
            if element is None:
                stack.pop()
            elif element.is_tuple:
                stack.append(iter(element.elements))
            else:
                leaves.append(element)
        return leaves


def tuple_shape(elements: list[Shape] | tuple[Shape, ...]) -> Shape:
    return Shape(text="(" + ", ".join(e.text for e in elements) + ")", elements=tuple(elements))


@functools.lru_cache(maxsize=65536)
def parse_shape(text: str) -> Shape:
    """Parse a shape such as ``f32[2,4]{1,0}``, ``u32[]``, ``(f32[], /*index=1*/s32[2])`` or ``b(f32[16])``.

    Comments and whitespace between tokens are allowed, as XLA allows them (``bf16[1,128] {1,0}``). Raises
    ValueError for anything else, or for tuples nested deeper than ``MAX_NESTING``.
    """
    if "/" in text:
        text = _COMMENT.sub("", text)
    if "(" not in text:  # an array: the common case, one regex
        m = _ARRAY.fullmatch(text.strip())
        if not m:
            raise ValueError(f"not an HLO shape: {text.strip()[:60]!r}")
        return _array(m)
    return _nested_shape(text)


def _array(m: re.Match) -> Shape:
    if not is_element_type(m.group(1)):
        raise ValueError(f"not an HLO shape: {m.group()[:60]!r}")
    dims = tuple(_parse_dim(d) for d in m.group(2).split(",") if d.strip())
    layout = m.group(3)[1:-1] if m.group(3) else None
    text = m.group().rstrip()
    if layout is not None and len(layout) >= 19:  # its dimension numbers and tiles, read later as ints
        layout = _LONG_DIGITS.sub(lambda d: canonical(d.group(), "layout"), layout)
        text = text[:text.rindex("{") + 1] + layout + "}"
    if _SPACE.search(text):  # spaces go, as XLA prints the shape: ``s32 [5, 10] {1, 0}`` is ``s32[5,10]{1,0}``
        text = _SPACE.sub("", text)
        layout = _SPACE.sub("", layout) if layout is not None else None
    return Shape(text=text, dtype=m.group(1), dims=dims, layout=layout)


def _nested_shape(text: str) -> Shape:
    """Tuples and buffers, read with a stack: ``(`` and ``b(`` open a level, ``)`` closes it."""
    def bad(why: str = "") -> ValueError:
        return ValueError(f"not an HLO shape{why}: {text.strip()[:60]!r}")

    open_levels: list[tuple[bool, list[Shape]]] = []  # (is a buffer, elements so far) per open parenthesis
    result: Shape | None = None
    pos, end = 0, len(text)
    after_element = False  # the last token ended an element: a ',' or ')' may follow, not another element
    while True:
        m = _SHAPE_TOKEN.match(text, pos)
        if m is None or result is not None:
            break
        pos = m.end()
        buffer_open, punctuation, array_text = m.groups()
        if buffer_open or punctuation == "(":
            if after_element:
                raise bad()
            if len(open_levels) >= MAX_NESTING:
                raise ValueError(f"shape nested deeper than {MAX_NESTING} levels (XLA's parser reads at most "
                                 f"{MAX_NESTING} levels of nesting)")
            open_levels.append((bool(buffer_open), []))
            continue
        if punctuation == ",":
            if not after_element or not open_levels or open_levels[-1][0]:
                raise bad()
            after_element = False
            continue
        if punctuation == ")":
            if not open_levels or (not after_element and open_levels[-1][1]):
                raise bad()
            is_buffer, elements = open_levels.pop()
            if is_buffer:
                if len(elements) != 1 or elements[0].is_tuple or elements[0].text.startswith("b("):
                    raise bad(": a buffer holds one array")
                array = elements[0]
                shape = Shape(text=f"b({array.text})", dtype=array.dtype, dims=array.dims, layout=array.layout)
            else:
                shape = tuple_shape(elements)
        else:
            if after_element:
                raise bad()
            shape = _array(_ARRAY.match(array_text))
        after_element = True
        if open_levels:
            open_levels[-1][1].append(shape)
        else:
            result = shape
    if result is None or open_levels or _TRAILING_SPACE.match(text, pos).end() != end:
        raise bad()
    return result


def split_top_level(text: str, sep: str = ",") -> list[str]:
    """Split at ``sep`` outside brackets, braces, parentheses and string literals."""
    parts: list[str] = []
    depth = 0
    start = 0
    for m in TOKEN.finditer(text):
        tok = m.group()
        if tok in "{([":
            depth += 1
        elif tok in "})]":
            depth -= 1
        elif tok == sep and depth == 0:
            parts.append(text[start:m.start()])
            start = m.end()
    parts.append(text[start:])
    return parts


_LONG_DIGITS = re.compile(r"\d{19,}")


def _parse_dim(d: str) -> int:
    d = d.strip()
    if d == "?":
        return -1
    return bounded(d.removeprefix("<="), "dimension")  # the parser names the line


def map_leaves(shape: Shape, leaf_text: Callable[[Shape], str]) -> str:
    """The shape's text with every array written by ``leaf_text``, tuples as XLA prints them; no recursion."""
    if not shape.is_tuple:
        return leaf_text(shape)
    parts: list[str] = ["("]
    stack: list[Iterator[Shape]] = [iter(shape.elements)]
    first = [True]
    while stack:
        element = next(stack[-1], None)
        if element is None:
            stack.pop()
            first.pop()
            parts.append(")")
            continue
        if not first[-1]:
            parts.append(", ")
        first[-1] = False
        if element.is_tuple:
            parts.append("(")
            stack.append(iter(element.elements))
            first.append(True)
        else:
            parts.append(leaf_text(element))
    return "".join(parts)


def with_default_layout(shape: Shape) -> str:
    """The shape's text with XLA's default layout where it has none (``f32[2,3]`` -> ``f32[2,3]{1,0}``).

    XLA gives every array without a layout the default one, so the two spellings are one shape.
    """
    return map_leaves(shape, _array_with_default_layout)


def _array_with_default_layout(shape: Shape) -> str:
    if shape.layout is not None or not shape.dims:
        return shape.text
    default = "{" + ",".join(str(i) for i in reversed(range(len(shape.dims)))) + "}"
    return shape.text[:-1] + default + ")" if shape.text.startswith("b(") else shape.text + default
