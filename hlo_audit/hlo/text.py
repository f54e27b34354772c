"""HLO text parser.

No public Python parser for XLA's HLO text exists, so this one is hand-written. It reads both printers
that users meet:

* jax's ``Lowered.as_text(dialect="hlo")``: names without ``%``, operands as bare names, ``ENTRY main.2 {``
  with no signature;
* XLA's ``--xla_dump_to`` files: ``%name``, operands prefixed by their shape, computation signatures, and
  the FileNames / FunctionNames / FileLocations / StackFrames tables between header and computations.

It is line-oriented (XLA prints one instruction per line) and keeps the raw text of attribute values: the
analyses only need a few attributes decoded, and decoding all of them would cost most of the parse time
on a 9 MB module.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import re
from dataclasses import dataclass, field
from pathlib import Path

# Bytes per element for every HLO primitive type we may meet; sub-byte types round up per element
# only when summed (see Shape.bytes).
DTYPE_BITS: dict[str, int] = {
    "pred": 8, "s2": 2, "s4": 4, "s8": 8, "s16": 16, "s32": 32, "s64": 64,
    "u2": 2, "u4": 4, "u8": 8, "u16": 16, "u32": 32, "u64": 64,
    "f16": 16, "bf16": 16, "f32": 32, "f64": 64, "c64": 64, "c128": 128,
    "f4e2m1fn": 4, "f8e3m4": 8, "f8e4m3": 8, "f8e4m3fn": 8, "f8e4m3fnuz": 8, "f8e4m3b11fnuz": 8,
    "f8e5m2": 8, "f8e5m2fnuz": 8, "f8e8m0fnu": 8, "token": 0, "opaque": 0,
}

# Attributes whose value names computations (single name or a {a, b} list).
COMPUTATION_ATTRS = frozenset({
    "calls", "to_apply", "body", "condition", "true_computation", "false_computation",
    "branch_computations", "called_computations", "scatter", "select", "async_wrapped_computation",
})

_INDEX_COMMENT = re.compile(r"/\*index=\d+\*/")
_ARRAY_SHAPE = re.compile(r"([a-z][a-z0-9]*)\[([^\]]*)\](\{[^}]*\})?")
# One regex for the common line: array shape, operands without nested parentheses.
_SIMPLE_INSTRUCTION = re.compile(
    r"\s*(ROOT\s+)?%?([^\s=]+)\s*=\s*([a-z][a-z0-9]*\[[^\]]*\](?:\{[^}]*\})?)\s+([a-z][a-z0-9\-_]*)\(([^()]*)\)(.*)")
_PERCENT_NAME = re.compile(r"%([^\s,()%]+)")
_NEEDS_TOKENIZER = re.compile(r'[{(\["]')
_OPERAND_SYNTAX = re.compile(r'[{(\["/]')  # brackets, strings, comments: operands need the tokenizer
_LAST_WORD_OF_PIECE = re.compile(r"[^\s,]+(?=\s*(?:,|\Z))")
_INSTR_HEAD = re.compile(r"\s*(ROOT\s+)?%?([^\s=]+)\s*=\s*")
_OPCODE = re.compile(r"\s*([a-z][a-z0-9\-_]*)\(")
_OP_NAME = re.compile(r'op_name="((?:[^"\\]|\\.)*)"')
_COMP_HEAD = re.compile(r"(ENTRY\s+)?%?([A-Za-z_][\w.\-]*)\s*(\(.*)?\{\s*$")
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[{}()\[\],]')
_NUMBER_SUFFIX = re.compile(r"\.\d+$")
_DUMP_TABLES = frozenset({"FileNames", "FunctionNames", "FileLocations", "StackFrames"})


class HloParseError(ValueError):
    """Malformed HLO text. ``str()`` is one line naming the source and, where known, the line."""

    def __init__(self, message: str, source: str = "<text>", line: int | None = None):
        self.message, self.source, self.line = message, source, line
        where = f"{source}:{line}" if line is not None else source
        super().__init__(f"{where}: {message}")


@dataclass(frozen=True, slots=True)
class Shape:
    """An HLO shape: an array (dtype, dims, layout) or a tuple of shapes."""

    text: str
    dtype: str | None = None  # None for tuples
    dims: tuple[int, ...] = ()
    layout: str | None = None
    elements: tuple["Shape", ...] = ()

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
        return (self.num_elements * DTYPE_BITS.get(self.dtype, 0) + 7) // 8

    def leaves(self) -> list["Shape"]:
        if not self.is_tuple:
            return [self]
        return [leaf for e in self.elements for leaf in e.leaves()]


@dataclass(slots=True)
class Instruction:
    name: str
    opcode: str
    shape: Shape
    # Operand references (empty for parameter / constant). Newer XLA prints ``%t#2`` for element 2 of
    # tuple ``t``; operand_base() strips that.
    operands: tuple[str, ...]
    literal: str  # raw operand text of parameter / constant, "" otherwise
    attrs: dict[str, str]  # attribute -> raw value text, in printed order
    is_root: bool
    line: int
    users: list[str] = field(default_factory=list)

    @property
    def operand_bases(self) -> list[str]:
        return [operand_base(op) for op in self.operands]

    @property
    def reads_tuple_element(self) -> bool:
        """A get-tuple-element, or an operand written ``t#k`` (element k of tuple t)."""
        return self.opcode == "get-tuple-element" or any("#" in ref for ref in self.operands)

    @property
    def parameter_number(self) -> int | None:
        return int(self.literal) if self.opcode == "parameter" else None

    @property
    def custom_call_target(self) -> str:
        """The custom call's target without quotes; "" for other instructions."""
        return self.attrs.get("custom_call_target", "").strip().strip('"')

    @property
    def op_name(self) -> str:
        """The ``op_name`` of the metadata (jax's primitive or pytree key string, escapes kept); "" if none."""
        m = _OP_NAME.search(self.attrs.get("metadata", ""))
        return m.group(1) if m else ""

    def called_computations(self) -> list[str]:
        names: list[str] = []
        if COMPUTATION_ATTRS.isdisjoint(self.attrs):  # most instructions call nothing
            return names
        for key, value in self.attrs.items():
            if key in COMPUTATION_ATTRS:
                names.extend(split_name_list(value))
        return names


@dataclass(slots=True)
class Computation:
    name: str
    is_entry: bool
    line: int
    instructions: list[Instruction] = field(default_factory=list)
    by_name: dict[str, Instruction] = field(default_factory=dict)

    @property
    def root(self) -> Instruction:
        for instr in reversed(self.instructions):
            if instr.is_root:
                return instr
        return self.instructions[-1]

    @property
    def parameters(self) -> list[Instruction]:
        params = [i for i in self.instructions if i.opcode == "parameter"]
        return sorted(params, key=lambda i: i.parameter_number)


@dataclass(slots=True)
class HloModule:
    name: str
    header_attrs: dict[str, str]
    computations: dict[str, Computation]
    entry: Computation
    source: str = "<text>"

    def instructions(self):
        for comp in self.computations.values():
            yield from comp.instructions


def strip_number_suffix(name: str) -> str:
    """``main.2`` -> ``main``: XLA appends ``.N`` from a global counter to keep names unique."""
    return _NUMBER_SUFFIX.sub("", name)


def strip_index_comments(text: str) -> str:
    """Drop the ``/*index=N*/`` comments XLA prints every fifth tuple element."""
    return _INDEX_COMMENT.sub("", text) if "/*" in text else text


def operand_base(ref: str) -> str:
    """``arg_tuple.1#0`` -> ``arg_tuple.1``."""
    return ref.split("#", 1)[0]


def operand_index(ref: str) -> int | None:
    """``arg_tuple.1#0`` -> 0: the tuple element a reference reads; None for a plain name (parsed modules only:
    the parser checks every index)."""
    return int(ref.split("#", 1)[1]) if "#" in ref else None


def split_name_list(value: str) -> list[str]:
    value = value.strip()
    if value.startswith("{"):
        value = value[1:-1]
    return [v.strip().lstrip("%") for v in value.split(",") if v.strip()]


def split_top_level(text: str, sep: str = ",") -> list[str]:
    """Split at ``sep`` outside brackets, braces, parentheses and string literals."""
    parts: list[str] = []
    depth = 0
    start = 0
    for m in _TOKEN.finditer(text):
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


def _match_close(text: str, start: int) -> int:
    """Index just past the bracket that closes the one at ``start`` (strings respected); -1 if none."""
    depth = 0
    for m in _TOKEN.finditer(text, start):
        tok = m.group()
        if tok in "{([":
            depth += 1
        elif tok in "})]":
            depth -= 1
            if depth == 0:
                return m.end()
    return -1


@functools.lru_cache(maxsize=65536)
def parse_shape(text: str) -> Shape:
    """Parse a shape such as ``f32[2,4]{1,0}``, ``u32[]`` or ``(f32[], /*index=1*/s32[2])``."""
    text = _INDEX_COMMENT.sub("", text).strip()
    if text.startswith("("):
        inner = text[1:-1].strip()
        elements = tuple(parse_shape(p) for p in split_top_level(inner)) if inner else ()
        return Shape(text=text, elements=elements)
    m = _ARRAY_SHAPE.fullmatch(text)
    if not m or m.group(1) not in DTYPE_BITS:
        raise ValueError(f"not an HLO shape: {text[:60]!r}")
    dims = tuple(_parse_dim(d) for d in m.group(2).split(",") if d.strip())
    layout = m.group(3)[1:-1] if m.group(3) else None
    return Shape(text=text, dtype=m.group(1), dims=dims, layout=layout)


def _parse_dim(d: str) -> int:
    d = d.strip()
    if d == "?":
        return -1
    return int(d.removeprefix("<="))


def _parse_instruction(text: str, lineno: int, seen_attrs: dict[str, dict[str, str]]) -> Instruction:
    fast = _SIMPLE_INSTRUCTION.match(text)
    if fast is None:
        return _parse_instruction_slow(text, lineno, seen_attrs)
    return _build_instruction(*fast.groups(), lineno, seen_attrs)


def _build_instruction(root: str | None, name: str, shape_text: str, opcode: str, operand_text: str, rest: str,
                       lineno: int, seen_attrs: dict[str, dict[str, str]]) -> Instruction:
    """An Instruction from the pieces of its line, in the order the line has them."""
    if opcode in ("parameter", "constant"):
        operands: tuple[str, ...] = ()
        literal = operand_text.strip()
        if opcode == "parameter" and not literal.isdigit():
            raise ValueError(f"parameter number must be a non-negative integer, got {literal[:20]!r}")
    else:
        literal = ""
        operands = _parse_operands(operand_text)
    # A module repeats few distinct attribute lists (", dimensions={0,1}", ", direction=EQ", ...): parse
    # each once per module and hand every instruction its own copy.
    attrs = seen_attrs.get(rest)
    if attrs is None:
        attrs = seen_attrs[rest] = _parse_attributes(rest)
    return Instruction(
        name=name.lstrip("%"), opcode=opcode, shape=parse_shape(shape_text), operands=operands,
        literal=literal, attrs=attrs.copy(), is_root=bool(root), line=lineno,
    )


def _parse_operands(text: str) -> tuple[str, ...]:
    if "%" in text:  # XLA dump: "f32[8]{0} %a, (s32[], f32[]) %t" -- every name has a %
        return tuple(_PERCENT_NAME.findall(text))
    if not text:
        return ()
    # jax: "a, b" (names only). An operand is the last word of its comma-separated piece; blank pieces
    # are skipped. The common line has no brackets, strings or comments, and one regex does that.
    if _OPERAND_SYNTAX.search(text) is None:
        return tuple(_LAST_WORD_OF_PIECE.findall(text))
    text = strip_index_comments(text)
    parts = split_top_level(text) if _NEEDS_TOKENIZER.search(text) else text.split(",")
    return tuple([words[-1] for words in map(str.split, parts) if words])


def _parse_attributes(rest: str) -> dict[str, str]:
    """``, a={0,1}, b=x`` (the text after the operand list) -> {"a": "{0,1}", "b": "x"}."""
    attrs: dict[str, str] = {}
    rest = rest.strip()
    if not rest:
        return attrs
    if not rest.startswith(","):
        raise ValueError(f"unexpected text after operands: {rest[:40]!r}")
    parts = split_top_level(rest[1:]) if _NEEDS_TOKENIZER.search(rest) else rest[1:].split(",")
    for part in parts:
        key, eq, value = part.partition("=")
        if not eq:
            raise ValueError(f"attribute without '=': {part.strip()[:40]!r}")
        attrs[key.strip()] = value.strip()
    return attrs


def _parse_instruction_slow(text: str, lineno: int, seen_attrs: dict[str, dict[str, str]]) -> Instruction:
    """Tuple shapes, tiled layouts, tuple-typed operands: anything with nested parentheses."""
    head = _INSTR_HEAD.match(text)
    if not head:
        raise ValueError("expected 'name = shape opcode(operands)'")
    pos = head.end()
    if text.startswith("(", pos):
        end = _match_close(text, pos)
        if end < 0:
            raise ValueError("unbalanced parentheses in tuple shape")
    else:
        m = _ARRAY_SHAPE.match(text, pos)
        if not m:
            raise ValueError("expected a shape after '='")
        end = m.end()
    shape_text = text[pos:end]
    op = _OPCODE.match(text, end)
    if not op:
        raise ValueError("expected an opcode followed by '('")
    open_paren = op.end() - 1
    close = _match_close(text, open_paren)
    if close < 0:
        raise ValueError("unbalanced parentheses in operand list")
    return _build_instruction(head.group(1), head.group(2), shape_text, op.group(1),
                              text[open_paren + 1:close - 1], text[close:], lineno, seen_attrs)


def parse_module(text: str, source: str = "<text>") -> HloModule:
    """Parse one HLO module. Raises HloParseError naming ``source`` and the line."""
    with _cyclic_gc_paused():
        return _parse_module(text, source)


@contextlib.contextmanager
def _cyclic_gc_paused():
    """Pause Python's cycle collector while a module is built.

    A 9 MB module is ~100k instructions of several objects each, and none of them form reference
    cycles, so the collector finds nothing; but it runs every few hundred allocations and its older
    generations walk the whole growing module again and again: a fifth of the parse time.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _parse_module(text: str, source: str) -> HloModule:
    if not text.strip():
        raise HloParseError("empty input, expected an HLO module", source)
    lines = text.splitlines()
    lineno, header = next((n, l) for n, l in enumerate(lines, 1) if l.strip())
    if not header.startswith("HloModule "):
        raise HloParseError(f"not HLO text: expected 'HloModule' but found {header.strip()[:40]!r}",
                            source, lineno)
    name, *attr_parts = split_top_level(header[len("HloModule "):])
    header_attrs = {}
    for part in attr_parts:
        key, _, value = part.partition("=")
        header_attrs[key.strip()] = value.strip()

    computations: dict[str, Computation] = {}
    entry: Computation | None = None
    current: Computation | None = None
    in_table = False
    seen_attrs: dict[str, dict[str, str]] = {}
    for n in range(lineno, len(lines)):
        raw = lines[n]
        line = raw.strip()
        num = n + 1
        if current is not None:
            if line == "}":
                if not current.instructions:
                    raise HloParseError(f"computation {current.name} has no instructions", source, num)
                computations[current.name] = current
                current = None
                continue
            if not line or line.startswith("//"):
                continue
            try:
                instr = _parse_instruction(raw, num, seen_attrs)
            except ValueError as exc:
                raise HloParseError(f"{exc} in computation {current.name}", source, num) from None
            if instr.name in current.by_name:
                raise HloParseError(f"instruction {instr.name!r} defined twice in computation {current.name}",
                                    source, num)
            current.instructions.append(instr)
            current.by_name[instr.name] = instr
            continue
        if not line or line.startswith("//"):
            in_table = False if not line else in_table
            continue
        if line in _DUMP_TABLES:
            in_table = True
            continue
        if in_table:
            continue
        head = _COMP_HEAD.match(line)
        if not head:
            raise HloParseError(f"unexpected text outside a computation: {line[:40]!r}", source, num)
        current = Computation(name=head.group(2), is_entry=bool(head.group(1)), line=num)
        if current.name in computations:
            raise HloParseError(f"computation {current.name!r} defined twice", source, num)
        if current.is_entry:
            if entry is not None:
                raise HloParseError(f"second ENTRY computation {current.name!r} (first: {entry.name!r})",
                                    source, num)
            entry = current
    if current is not None:
        raise HloParseError(
            f"truncated module: computation {current.name} (opened at line {current.line}) is not closed",
            source, len(lines))
    if entry is None:
        raise HloParseError("no ENTRY computation", source)
    module = HloModule(name=name.strip(), header_attrs=header_attrs, computations=computations,
                       entry=entry, source=source)
    _link(module)
    return module


def _link(module: HloModule) -> None:
    """Resolve operand and computation references, fill ``users``; dangling names are parse errors."""
    for comp in module.computations.values():
        by_name = comp.by_name
        for instr in comp.instructions:
            for ref in instr.operands:
                op = operand_base(ref)
                target = by_name.get(op)
                if target is None:
                    raise HloParseError(f"{instr.name} uses undefined operand {op!r}", module.source,
                                        instr.line)
                target.users.append(instr.name)
            for callee in instr.called_computations():
                if callee not in module.computations:
                    raise HloParseError(f"{instr.name} calls undefined computation {callee!r}",
                                        module.source, instr.line)
            if instr.reads_tuple_element:
                _check_tuple_access(instr, by_name, module.source)
    _check_no_call_cycle(module)


def _check_tuple_access(instr: Instruction, by_name: dict[str, Instruction], source: str) -> None:
    """Element indices must be integers within the tuple: later passes index with them."""
    accesses = [(ref.split("#", 1)[1], operand_base(ref)) for ref in instr.operands if "#" in ref]
    if instr.opcode == "get-tuple-element":
        accesses.append((instr.attrs.get("index", ""), operand_base(instr.operands[0]) if instr.operands else ""))
    for index, base in accesses:
        target = by_name.get(base)
        arity = len(target.shape.elements) if target is not None and target.shape.is_tuple else None
        if not index.isdigit() or arity is None or int(index) >= arity:
            raise HloParseError(f"{instr.name} reads element {index!r} of {base!r}, which has "
                                f"{'no tuple shape' if arity is None else f'{arity} elements'}", source, instr.line)


def _check_no_call_cycle(module: HloModule) -> None:
    """HLO has no recursion; a cycle (a garbled or hand-edited module) would loop every later pass."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        comp = module.computations[name]
        for instr in comp.instructions:
            for callee in instr.called_computations():
                if state.get(callee) == 1:
                    cycle = " -> ".join([*path[path.index(callee):], callee])
                    raise HloParseError(f"call cycle {cycle}", module.source, instr.line)
                if callee not in state:
                    visit(callee, [*path, callee])
        state[name] = 2

    for name in module.computations:
        if name not in state:
            visit(name, [name])


def read_text(path: Path | str) -> str:
    """Read an HLO file as text; binary or unreadable input becomes an HloParseError."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise HloParseError("no such file", str(p)) from None
    except IsADirectoryError:
        raise HloParseError("is a directory, not an HLO file", str(p)) from None
    except OSError as exc:
        raise HloParseError(f"cannot read: {exc.strerror}", str(p)) from None
    return decode_text(data, str(p))


def parse_file(path: Path | str) -> HloModule:
    return parse_module(read_text(path), str(path))


def decode_text(data: bytes, source: str) -> str:
    """HLO bytes as text; binary or non-UTF-8 input becomes an HloParseError naming ``source``."""
    if b"\x00" in data[:4096]:
        raise HloParseError("binary data, not HLO text", source)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HloParseError(f"not UTF-8 text (byte {exc.start})", source) from None
