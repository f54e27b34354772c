"""HLO text parser: XLA's grammar, read the way XLA's own parser reads it.

Valid input is what XLA's parser (jaxlib's ``hlo_module_from_text``) accepts: the test suite holds this
parser to XLA's on a corpus of real modules nobody here wrote (docs/valid-hlo.md). So whitespace,
newlines included, only separates tokens; ``//`` and ``/* */`` comments may stand anywhere; strings are
double- or single-quoted and may hold newlines and escaped quotes; a computation may lack ``ROOT`` (its last
instruction is the root) and a module may lack ``ENTRY`` (its last computation is the entry). Where XLA
builds something from a shorthand, so does this parser, so that both count the same instructions:

* a nested operand instruction (``add(f32[] constant(1), x)``) becomes an instruction of its own,
  ``<opcode>.anon``;
* ``%t#1#0`` becomes get-tuple-element instructions (``t_1``, ``t_1_0``), shared by every use;
* an inline body (``to_apply={ ... }``) becomes a computation;
* ``custom-call-start`` and every other ``<op>-start/-update/-done`` that is no opcode of its own becomes
  ``async-start/-update/-done``, the start calling a wrapped computation around ``<op>``;
* a missing result shape is inferred (shape_inference.py), for the opcodes XLA infers;
* an operand that is only a shape (``fusion(f32[2,4]{1,0})``) or empty (``(a, , b)``) is no operand: XLA tries
  it as a name and as a nested instruction, and goes on from the ',' or ')' where both stopped.

Depth: nothing recurses. Nested operands are read with a stack, an inline computation by reading it first
and its instruction again, the call-cycle check with a stack; tuple shapes, nested operands and inline
computations nest as deep as XLA's parser reads them (500 levels, shapes.MAX_NESTING) and past that are one
error naming the line. Chains of instructions or of calls are as long as the text is.

Speed: a 9 MB module is ~100k instructions, nearly all printed one per line. Such a line takes a fast path
(one regex; each distinct attribute list parsed once). Anything else (an instruction over several lines,
a comment, a nested operand, a tuple shape) goes through the general parser, which reads XLA's whole
grammar from that point on. The fast path only ever declines; every error message comes from the general
parser, as one line naming the source and the line.

Canonical text (normalize.py) is read too: its entry parameters carry no number (``parameter()``: the
number is the order, so that a golden stays insertion-stable), which XLA would not accept.
"""

from __future__ import annotations

import contextlib
import gc
import os
import re
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path

from hlo_audit.hlo.numbers import INT32_MAX, INT64_MAX, OutOfRange, bounded
from hlo_audit.hlo.shape_inference import ProgramShape, ShapeInferenceError, infer_shape
from hlo_audit.hlo.shapes import (
    MAX_NESTING,
    TOKEN,
    Shape,
    is_element_type,
    parse_shape,
    quoted,
    quoted_body,
    split_top_level,
)

# Attributes whose value names computations (single name or a {a, b} list).
COMPUTATION_ATTRS = frozenset({
    "calls", "to_apply", "body", "condition", "true_computation", "false_computation",
    "branch_computations", "called_computations", "scatter", "select", "async_wrapped_computation",
})
# XLA's own opcodes that end like the asynchronous shorthand; any other `<op>-start` wraps `<op>`.
NATIVE_ASYNC_OPCODES = frozenset({
    "async-start", "async-update", "async-done", "all-gather-start", "all-gather-done", "all-reduce-start",
    "all-reduce-done", "collective-permute-start", "collective-permute-done", "copy-start", "copy-done",
    "send-done", "recv-done",
})
# Attributes an asynchronous shorthand keeps on the async instruction; the rest belong to the wrapped op.
_ASYNC_ATTRS = frozenset({"async_execution_thread", "async_group_id", "metadata", "backend_config",
                          "frontend_attributes", "sharding"})

# Whitespace and comments: what separates tokens.
_SKIP = re.compile(r"(?:\s++|//[^\n]*+|/\*.*?\*/)++", re.S)
_NAME = re.compile(r"%?([A-Za-z_][\w.\-]*)")
_OPCODE = re.compile(r"[a-z][a-z0-9_.\-]*(?=\s*\()")
_KEY = re.compile(r"([A-Za-z_][\w.\-]*)\s*=")
_INSTRUCTION_START = re.compile(r"ROOT\b|%?[A-Za-z_][\w.\-]*\s*=(?!=)")
_ARRAY_SHAPE = re.compile(r"([a-z][a-z0-9]*)\s*\[[^\]]*\](?:\s*\{(?=\s*[\d:}])[^}]*\})?")
_STRING = re.compile(quoted('"') + "|" + quoted("'"), re.S)
_WORD = re.compile(r"(?:[^\s,{}()\[\]\"'/]++|/(?![/*]))++")
# Brackets, strings and comments: what a bracket scan must see (a brace in a string or comment is text).
_BRACKET_TOKEN = re.compile(quoted('"') + "|" + quoted("'") + r"|//[^\n]*|/\*.*?\*/|[{}()\[\]]", re.S)

# The fast path: one instruction on one line, array shape, operands without nested parentheses.
_SIMPLE_INSTRUCTION = re.compile(
    r"(ROOT\s+)?%?([A-Za-z_][\w.\-]*)\s*=\s*([a-z][a-z0-9]*\[[^\]]*\](?:\{[^}]*\})?)\s+([a-z][a-z0-9\-_]*)"
    r"\(([^()]*)\)(.*)")
# An attribute list of the common kind: `, key=value` where a value is a string, a flat {...} (strings
# inside allowed) or a bare word. Anything else (nested braces, brackets, comments) is split by tokens.
_SIMPLE_VALUE = (r'(?:' + quoted('"', newline=False) + r'|\{(?:[^{}"/\n]++|' + quoted('"', newline=False)
                 + r')*+\}|[^\s,{}()\[\]"\'/]++)')
_SIMPLE_ATTRIBUTE = re.compile(r",\s*([A-Za-z_][\w.\-]*)=(" + _SIMPLE_VALUE + r")\s*")
_SIMPLE_ATTRIBUTES = re.compile(r"(?:,\s*[A-Za-z_][\w.\-]*=" + _SIMPLE_VALUE + r"\s*)*+")
_PERCENT_NAME = re.compile(r"%([^\s,()%]+)")
_OPERAND_SYNTAX = re.compile(r'[{(\["/#]')  # operands that need more than "a, b"
_LAST_WORD_OF_PIECE = re.compile(r"[^\s,]+(?=\s*(?:,|\Z))")
_OPERAND_NAME = re.compile(r"[A-Za-z_][\w.\-]*")

_INDEX_COMMENT = re.compile(r"/\*index=\d+\*/")
_LINE_BREAK = re.compile(r"\s*\n\s*")
_ROOT = re.compile(r"ROOT\b")
_ENTRY = re.compile(r"ENTRY\b")
_HLO_MODULE = re.compile(r"HloModule\b")
_SHAPE_START = re.compile(r"([a-z][a-z0-9]*)(?=\s*[\[(])")
_DIGITS = re.compile(r"\d+")
_OP_NAME = re.compile('op_name="(' + quoted_body('"') + ')"')
_NUMBER_SUFFIX = re.compile(r"\.\d+$")
_DUMP_TABLES = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")
# Attributes whose values are text or JSON, not numbers of the instruction (``check_numbers``).
_FREE_TEXT_ATTRS = frozenset({"metadata", "backend_config", "frontend_attributes", "custom_call_target",
                              "raw_backend_config_string", "statistics_viz"})
# A run of digits as long as a number past int64 can be (19 or more), not part of a name or a float ('.', 'e');
# 'x' joins a window's sizes (2x3), '_' its paddings (0_1); a sign is no part of the magnitude bounded.
# metadata={op_name="..." source_line=41 stack_frame_id=7}: its numbers past int32 (10 digits or more).
_METADATA_LONG = re.compile(r"=\d{10}")
_LONG_DIGITS = re.compile(r"\d{19}")
_METADATA_NUMBER_OR_STRING = re.compile(_STRING.pattern + r"|(?P<field>\w+)=(?P<n>\d{10,})", re.S)
_LONG_INTEGER_OR_STRING = re.compile(_STRING.pattern + r"|(?:(?<![\w.])|(?<=\d[x_]))(?P<long>\d{19,})"
                                     r"(?![0-9A-Za-wyz_.])", re.S)
TABLE_FIELD = re.compile(r"(\w+)=(\d+)")  # a debug table entry's numbers (hlo/locations.py reads them)


class HloParseError(ValueError):
    """Malformed HLO text. ``str()`` is one line naming the source and, where known, the line."""

    def __init__(self, message: str, source: str = "<text>", line: int | None = None):
        self.message, self.source, self.line = message, source, line
        where = f"{source}:{line}" if line is not None else source
        super().__init__(f"{where}: {message}")


def hlo_int(digits: str, what: str, source: str = "<text>", line: int | None = None, limit: int = INT64_MAX) -> int:
    """A number read from HLO text (``numbers.bounded``), or HloParseError naming the source, line and what: the one
    conversion every reader of a text's numbers goes through."""
    try:
        return bounded(digits, what, limit)
    except OutOfRange as exc:
        raise HloParseError(str(exc), source, line) from None


@dataclass(slots=True)
class Instruction:
    name: str
    opcode: str
    shape: Shape
    operands: tuple[str, ...]  # names of instructions of the same computation, defined before this one
    literal: str  # raw operand text of parameter / constant, "" otherwise
    attrs: dict[str, str]  # attribute -> raw value text, in printed order; may be shared: never change in place
    is_root: bool
    line: int

    @property
    def parameter_number(self) -> int | None:
        return int(self.literal) if self.opcode == "parameter" else None

    @property
    def custom_call_target(self) -> str:
        """The custom call's target without quotes; "" for other instructions."""
        return self.attrs.get("custom_call_target", "").strip().strip("\"'")

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
    attrs: dict[str, str] = field(default_factory=dict)  # after the closing brace: execution_thread

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
    # Canonical text (normalize.py): entry parameters unnumbered, each named by its state path.
    params_named_by_path: bool = False
    # The debug tables jax's ``as_text(debug_info=True)`` and XLA's dumps print before the first computation
    # (FileNames, FunctionNames, FileLocations, StackFrames): table -> entry number -> its text, as printed.
    debug_tables: dict[str, dict[int, str]] = field(default_factory=dict)

    def instructions(self):
        for comp in self.computations.values():
            yield from comp.instructions


def strip_number_suffix(name: str) -> str:
    """``main.2`` -> ``main``: XLA appends ``.N`` from a global counter to keep names unique."""
    return _NUMBER_SUFFIX.sub("", name)


def strip_index_comments(text: str) -> str:
    """Drop the ``/*index=N*/`` comments XLA prints every fifth tuple element."""
    return _INDEX_COMMENT.sub("", text) if "/*" in text else text


def split_name_list(value: str) -> list[str]:
    value = value.strip()
    if value.startswith("{"):
        value = value[1:-1]
    return [v.strip().lstrip("%") for v in value.split(",") if v.strip()]


def tidy(text: str) -> str:
    """One line for an attribute value or literal that was written over several lines or with comments.

    Comments go; a line break becomes one space, or nothing beside a bracket or before a comma; a newline
    inside a string becomes ``\\n`` (XLA unescapes strings, so the value is the same). One-line text without
    comments is returned as it is.
    """
    if "\n" not in text and "\r" not in text and "//" not in text and "/*" not in text:
        return text.strip()  # a "/" alone starts no comment: a path in an op_name stays one copy of the value
    pieces: list[str] = []
    pos = 0
    for m in _BRACKET_TOKEN.finditer(text):
        tok = m.group()
        if tok[0] in "\"'":
            pieces.append(text[pos:m.start()])
            pieces.append(tok.replace("\r\n", "\\n").replace("\n", "\\n"))
            pos = m.end()
        elif tok[0] == "/":
            pieces.append(text[pos:m.start()] + "\n")
            pos = m.end()
    pieces.append(text[pos:])
    joined = "".join(pieces)
    return _LINE_BREAK.sub(lambda m: _join_lines(joined, m), joined).strip()


def _join_lines(text: str, m: re.Match) -> str:
    before = text[m.start() - 1] if m.start() else ""
    after = text[m.end()] if m.end() < len(text) else ""
    return "" if not before or not after or before in "{([" or after in "})]," else " "


def parse_module(text: str, source: str = "<text>") -> HloModule:
    """Parse one HLO module. Raises HloParseError naming ``source`` and the line."""
    with cyclic_gc_paused():
        return _Parser(text, source).module()


@contextlib.contextmanager
def cyclic_gc_paused():
    """Pause Python's cycle collector while a module is built or walked (parse, normalize).

    A 9 MB module is ~100k instructions of several objects each, and none of them form reference
    cycles, so the collector finds nothing; but it runs every few hundred allocations and its older
    generations walk the whole module again and again: a fifth of the parse time.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class _Declined(Exception):
    """The fast path cannot read this line; the general parser will."""


@dataclass(slots=True)
class _OpenInstruction:
    """An instruction being read: what is known of it before its operand list closes."""

    name: str
    is_root: bool
    line: int
    shape: Shape | None
    opcode: str
    literal: str = ""
    refs: list[str] | None = None  # operands read so far; None for a parameter or constant
    done: bool = False  # read to its ')'


class _InlineBody(Exception):
    """The instruction being read holds an inline computation not read yet: its '{' is at ``at``."""

    def __init__(self, at: int, name: str):
        super().__init__(at, name)
        self.at, self.name = at, name


class _Parser:
    def __init__(self, text: str, source: str):
        self.text = text
        self.end = len(text)
        self.source = source
        self.computations: dict[str, Computation] = {}
        self.calling: list[tuple[str, Instruction]] = []  # (computation, instruction naming computations)
        self.seen_attrs: dict[str, dict[str, str]] = {}
        self.anonymous: dict[str, int] = {}  # name -> uses, for XLA's `<opcode>.anon` names
        self.anonymous_log: list[str] = []  # the names counted, in order: what take_back() undoes
        self.unnumbered: set[int] = set()  # id() of parameters written `parameter()`, numbered by order
        # Inline computations: (name, end) of each read, by the position of its '{'; the names of those being read.
        self.inline_read: dict[int, tuple[str, int]] = {}
        self.open_names: set[str] = set()
        # Where the instruction being read by the general parser starts, and what the parser held before it.
        self.resume: tuple[int, int, int, int, int] = (0, 0, 0, 0, 0)
        self._line_pos = 0
        self._line_no = 1

    # -- positions and errors ---------------------------------------------------------------------------

    def line(self, pos: int) -> int:
        """1-based line of ``pos``; counts from the last position asked, forward or back (an instruction that
        holds an inline computation is read again from its start)."""
        if pos < self._line_pos:
            self._line_no -= self.text.count("\n", pos, self._line_pos)
        else:
            self._line_no += self.text.count("\n", self._line_pos, pos)
        self._line_pos = pos
        return self._line_no

    def error(self, message: str, pos: int) -> HloParseError:
        # At the end of a text that ends in a newline, point at its last line, not the empty one after it.
        last_line = max(1, self.text.count("\n") + (not self.text.endswith("\n")))
        return HloParseError(message, self.source, min(self.line(min(pos, self.end)), last_line))

    def skip(self, pos: int) -> int:
        m = _SKIP.match(self.text, pos)
        pos = m.end() if m else pos
        if self.text.startswith("/*", pos):  # _SKIP takes only closed comments
            raise self.error("unterminated /* comment", pos)
        return pos

    def peek(self, pos: int) -> str:
        return self.text[pos] if pos < self.end else ""

    def found(self, pos: int) -> str:
        if pos >= self.end:
            return "the end of the text"
        return repr(self.text[pos:pos + 30].split("\n", 1)[0])

    def expect(self, pos: int, token: str, what: str) -> int:
        if not self.text.startswith(token, pos):
            raise self.error(f"expected '{token}' {what}, found {self.found(pos)}", pos)
        return self.skip(pos + len(token))

    def close(self, pos: int) -> int:
        """Index just past the bracket that closes the one at ``pos`` (strings and comments skipped)."""
        depth = 0
        for m in _BRACKET_TOKEN.finditer(self.text, pos):
            tok = m.group()
            if tok in "{([":
                depth += 1
            elif tok in "})]":
                depth -= 1
                if depth == 0:
                    return m.end()
        raise self.error(f"unbalanced {self.text[pos]!r}: not closed before the end of the text", pos)

    # -- module ---------------------------------------------------------------------------------------------

    def module(self) -> HloModule:
        text = self.text
        if not text.strip():
            raise HloParseError("empty input, expected an HLO module", self.source)
        pos = self.skip(0)
        if not _HLO_MODULE.match(text, pos):
            raise self.error(f"not HLO text: expected 'HloModule' but found {self.found(pos)}", pos)
        pos = self.skip(pos + len("HloModule"))
        m = _NAME.match(text, pos)
        if not m:
            raise self.error(f"expected the module name after 'HloModule', found {self.found(pos)}", pos)
        name = m.group(1)
        pos = m.end() + (text.startswith(":", m.end()))
        header_at = pos
        header, pos = self.single_value_attributes(pos)
        self.check_numbers(header, "HloModule", self.line(header_at))
        tables: dict[str, dict[int, str]] = {}
        pos = self.skip_dump_tables(self.skip(pos), tables)
        entry: Computation | None = None
        last: Computation | None = None
        while pos < self.end:
            comp, pos = self.computation(pos)
            pos = self.skip(pos)
            last = comp
            if comp.is_entry:
                if entry is not None:
                    raise HloParseError(f"second ENTRY computation {comp.name!r} (first: {entry.name!r})",
                                        self.source, comp.line)
                entry = comp
        if last is None:
            raise self.error("no computation after the HloModule header", pos)
        if entry is None:  # as XLA: without ENTRY, the last computation is the entry
            entry = last
            entry.is_entry = True
        params = [i for i in entry.instructions if i.opcode == "parameter"]
        module = HloModule(name=name, header_attrs=header, computations=self.computations, entry=entry,
                           source=self.source, params_named_by_path=bool(params) and id(params[0]) in self.unnumbered,
                           debug_tables=tables)
        self.check_calls(module)
        return module

    def single_value_attributes(self, pos: int) -> tuple[dict[str, str], int]:
        """``, key=value`` pairs whose values are one token or bracket group (module header, after a body)."""
        attrs: dict[str, str] = {}
        while (found := self.next_attribute(pos, "")) is not None:
            key, value_start = found
            pos = self.atom(value_start, key)
            attrs[key] = tidy(self.text[value_start:pos])
        return attrs, pos

    def next_attribute(self, pos: int, where: str) -> tuple[str, int] | None:
        """(key, where its value starts) of the ``, key=value`` after ``pos``; None if no comma follows."""
        text = self.text
        start = self.skip(pos)
        if not text.startswith(",", start):
            return None
        at = self.skip(start + 1)
        m = _KEY.match(text, at)
        if not m:
            word = _WORD.match(text, at)
            raise self.error(f"attribute without '=': {word.group() if word else self.found(at)!r}{where}", at)
        return m.group(1), self.skip(m.end())

    def skip_dump_tables(self, pos: int, tables: dict[str, dict[int, str]] | None = None) -> int:
        """The FileNames / FunctionNames / FileLocations / StackFrames tables of an XLA dump: numbers,
        strings and braces, up to the first computation. Each ``number value`` pair goes into ``tables``."""
        if not self.text.startswith(_DUMP_TABLES[0], pos):
            return pos
        table: dict[int, str] = {}
        number: int | None = None
        name = _DUMP_TABLES[0]
        while True:
            pos = self.skip(pos)
            c = self.peek(pos)
            if c.isdigit() or c in "\"'{":
                end = self.atom(pos, "FileNames")
                token = self.text[pos:end]
                if token.isdigit() and number is None:
                    number = hlo_int(token, f"{name}: entry number", self.source, self.line(pos), INT32_MAX)
                elif number is not None:
                    if c == "{":  # a location's or a frame's numbers: int32 to XLA, read later as ints
                        for field in TABLE_FIELD.finditer(token):
                            hlo_int(field.group(2), f"{name} {number}: {field.group(1)}", self.source,
                                    self.line(pos + field.start(2)), INT32_MAX)
                    table[number], number = token, None
                pos = end
            elif any(self.text.startswith(t, pos) for t in _DUMP_TABLES):
                name = next(t for t in _DUMP_TABLES if self.text.startswith(t, pos))
                table, number = {}, None
                if tables is not None:
                    tables[name] = table
                pos += len(name)
            else:
                return pos

    def atom(self, pos: int, what: str) -> int:
        """End of one value token at ``pos``: a bracket group, a string or a word."""
        c = self.peek(pos)
        if c in ("{", "(", "["):
            return self.close(pos)
        if c in ("'", '"'):
            m = _STRING.match(self.text, pos)
            if not m:
                raise self.error(f"unterminated string in {what}", pos)
            return m.end()
        m = _WORD.match(self.text, pos)
        if not m:
            raise self.error(f"expected a value for {what}, found {self.found(pos)}", pos)
        return m.end()

    # -- computations ---------------------------------------------------------------------------------------

    def computation(self, pos: int) -> tuple[Computation, int]:
        """``[ENTRY] name [(params) -> shape] { instructions } [, execution_thread=...]``."""
        text = self.text
        start = pos
        is_entry = bool(_ENTRY.match(text, pos))
        if is_entry:
            pos = self.skip(pos + 5)
        m = _NAME.match(text, pos)
        if not m:
            raise self.error(f"unexpected text outside a computation: {self.found(pos)}", pos)
        name = m.group(1)
        pos = self.skip(m.end() + text.startswith(":", m.end()))
        if text.startswith("(", pos):  # the signature: checked by XLA, implied by the parameters here
            pos = self.skip(self.close(pos))
            pos = self.expect(pos, "->", f"after the parameter list of computation {name}")
            _, pos = self.shape(pos)
            pos = self.skip(pos)
        if not text.startswith("{", pos):
            raise self.error(f"expected '{{' to open computation {name}, found {self.found(pos)}", pos)
        comp = Computation(name=name, is_entry=is_entry, line=self.line(start))
        pos = self.body(comp, pos + 1)
        comp.attrs, pos = self.single_value_attributes(pos)
        return comp, pos

    def body(self, comp: Computation, pos: int) -> int:
        """Instructions up to the closing brace; returns the position after it and registers ``comp``.

        An inline computation in an attribute (``to_apply={ p = f32[] parameter(0) ... }``) is read here too,
        without recursion: the instruction that holds it stops (_InlineBody), what it had added is taken back,
        the body is read as a computation of its own, and the instruction is read again from its start, finding
        the body read. So inline bodies nest as deep as XLA's parser reads them (MAX_NESTING), whatever Python's
        recursion limit.
        """
        waiting: list[tuple[Computation, int, int]] = []  # (computation, its instruction's start, body's '{')
        while True:
            try:
                end = self.instructions(comp, pos)
            except _InlineBody as inline:
                if len(waiting) >= MAX_NESTING:
                    raise self.error(f"inline computations nested deeper than {MAX_NESTING} levels (XLA's parser "
                                     f"reads at most {MAX_NESTING} levels of nesting)", inline.at) from None
                self.take_back(comp)
                waiting.append((comp, self.resume[0], inline.at))
                name = inline.name
                while name in self.computations or name in self.open_names:
                    name += "_"
                self.open_names.add(name)
                comp, pos = Computation(name=name, is_entry=False, line=self.line(inline.at)), inline.at + 1
                continue
            self.open_names.discard(comp.name)
            if not waiting:
                return end
            outer, resume, at = waiting.pop()
            self.inline_read[at] = (comp.name, end)
            comp, pos = outer, resume

    def take_back(self, comp: Computation) -> None:
        """Undo what the instruction being read added before it stopped for an inline body (nested operands,
        tuple elements, asynchronous wrappers, anonymous-name counts): it is read again from its start."""
        _, instructions, calling, computations, anonymous = self.resume
        for instr in comp.instructions[instructions:]:
            del comp.by_name[instr.name]
        del comp.instructions[instructions:]
        del self.calling[calling:]
        if len(self.computations) > computations:
            for name in list(self.computations)[computations:]:
                del self.computations[name]
        while len(self.anonymous_log) > anonymous:
            self.anonymous[self.anonymous_log.pop()] -= 1

    def instructions(self, comp: Computation, pos: int) -> int:
        """The instructions of ``comp`` up to its closing brace; returns the position after it."""
        text = self.text
        # A fast-path instruction waits here until the next token shows that no `, attribute=...` continues
        # it on the following lines; if one does, the general parser reads it again from its start.
        pending: Instruction | None = None
        pending_start = 0
        skip, simple, end = _SKIP.match, _SIMPLE_INSTRUCTION.match, self.end
        while True:
            gap = skip(text, pos)
            if gap is not None:
                pos = gap.end()
            c = text[pos] if pos < end else ""
            if pending is not None:
                if c == ",":
                    pos, pending = pending_start, None
                    c = text[pos]
                else:
                    self.add(comp, pending)
                    pending = None
            if not c:
                raise HloParseError(f"truncated module: computation {comp.name} (opened at line {comp.line}) is "
                                    "not closed", self.source, self.line(len(self.text.rstrip())))
            if c == "}":
                break
            eol = text.find("\n", pos)
            if eol < 0:
                eol = end
            fast = simple(text, pos, eol)
            if fast is not None:
                try:
                    pending, pending_start = self.simple_instruction(fast, pos), pos
                    pos = eol
                    continue
                except _Declined:
                    pass
            self.resume = (pos, len(comp.instructions), len(self.calling), len(self.computations),
                           len(self.anonymous_log))
            pos = self.instruction(comp, pos)
        self.finish(comp, pos)
        return pos + 1

    def finish(self, comp: Computation, pos: int) -> None:
        if not comp.instructions:
            raise self.error(f"computation {comp.name} has no instructions", pos)
        roots = [i for i in comp.instructions if i.is_root]
        if len(roots) > 1:
            raise HloParseError(f"computation {comp.name} has two ROOT instructions ({roots[0].name}, "
                                f"{roots[1].name})", self.source, roots[1].line)
        if not roots:  # as XLA: the last instruction is the root
            comp.instructions[-1].is_root = True
        self.number_parameters(comp)
        if comp.name in self.computations:
            raise HloParseError(f"computation {comp.name!r} defined twice", self.source, comp.line)
        self.computations[comp.name] = comp

    def number_parameters(self, comp: Computation) -> None:
        """Canonical text writes entry parameters as ``parameter()``: their order is their number."""
        params = [i for i in comp.instructions if i.opcode == "parameter"]
        unnumbered = [i for i in params if i.literal == ""]
        if not unnumbered:
            return
        if len(unnumbered) != len(params):
            raise HloParseError("parameter number must be a non-negative integer, got ''", self.source,
                                unnumbered[0].line)
        for n, instr in enumerate(params):
            instr.literal = str(n)
        self.unnumbered.update(map(id, params))

    # -- instructions: the fast path ----------------------------------------------------------------------

    def simple_instruction(self, m: re.Match, start: int) -> Instruction:
        """One-line instruction of the common kind; _Declined if the line is anything else."""
        root, name, shape_text, opcode, operand_text, rest = m.groups()
        opcode = sys.intern(opcode)  # one string per opcode, not one per instruction (22 MB in 400,000)
        attrs = self.seen_attrs.get(rest)
        if attrs is None:
            # A module repeats few distinct attribute lists (", dimensions={0,1}", ", direction=EQ", ...):
            # parse each once per module; instructions share the dict (nothing changes one in place).
            attrs = self.seen_attrs[rest] = _simple_attributes(rest)
            self.check_numbers(attrs, name, self.line(start))
        if opcode == "parameter" or opcode == "constant":
            literal = operand_text.strip()
            operands: tuple[str, ...] = ()
            if opcode == "parameter" and not (literal.isdigit() and len(literal) < 19):
                raise _Declined  # the general parser says what is wrong with it
        else:
            literal = ""
            operands = _simple_operands(operand_text)
        try:
            shape = parse_shape(shape_text)
        except ValueError:
            raise _Declined from None
        # Positional: a keyword call costs measurably on 100k instructions.
        return Instruction(name, opcode, shape, operands, literal, attrs, bool(root), self.line(start))

    # -- instructions: the general parser -------------------------------------------------------------------

    def instruction(self, comp: Computation, pos: int) -> int:
        """``[ROOT] name = [shape] opcode(operands) [, attribute=value]*`` from ``pos``; returns its end."""
        text = self.text
        start = pos = self.skip(pos)
        is_root = bool(_ROOT.match(text, pos))
        if is_root:
            pos = self.skip(pos + 4)
        m = _NAME.match(text, pos)
        if not m:
            raise self.error(f"expected 'name = shape opcode(operands)' in computation {comp.name}, found "
                             f"{self.found(pos)}", pos)
        pos = self.skip(m.end())
        if not text.startswith("=", pos):
            raise self.error(f"expected 'name = shape opcode(operands)' in computation {comp.name}, found "
                             f"{self.found(pos)} after {m.group(1)!r}", pos)
        instr, pos = self.right_hand_side(comp, m.group(1), is_root, self.skip(pos + 1), self.line(start), True)
        self.add(comp, instr)
        return pos

    def right_hand_side(self, comp: Computation, name: str, is_root: bool, pos: int, line: int,
                        with_attributes: bool) -> tuple[Instruction, int]:
        """``[shape] opcode(operands) [attributes]``.

        An operand may be an instruction itself (``add(f32[] negate(x), y)``, as XLA allows); those are read with
        a stack of the instructions whose operand lists are open, not by recursion, so they nest as deep as XLA's
        parser reads them (MAX_NESTING). As in XLA's parser, an operand that is only a shape (``fusion(f32[2])``)
        or nothing at all (``(a, , b)``, ``(a, )``) is no operand: XLA tries it as a name, then as a nested
        instruction, and moves on to the ',' or ')' where both attempts stopped.
        """
        waiting: list[_OpenInstruction] = []  # instructions whose operand lists hold the one being read
        current, pos = self.open_instruction(comp, name, is_root, pos, line, None)
        while True:
            if current.refs is not None and not current.done:  # reading the operands of `current`
                current, pos = self.operand(comp, current, waiting, pos)
                if current.refs is not None and not current.done:
                    continue
            # `current` is read to its ')' (or is a parameter or constant): attributes, shape, the instruction.
            attrs: dict[str, str] = {}
            if with_attributes and not waiting:
                attrs, pos = self.attributes(comp, pos, name)
            operands = tuple(current.refs or ())
            shape = current.shape
            if shape is None:
                shape = self.inferred_shape(comp, current.opcode, operands, attrs, pos)
            instr = Instruction(name=current.name, opcode=current.opcode, shape=shape, operands=operands,
                                literal=current.literal, attrs=attrs, is_root=current.is_root, line=current.line)
            if not waiting:
                return instr, pos
            self.add(comp, instr)
            current = waiting.pop()
            current.refs.append(instr.name)
            pos = self.after_operand(current, pos)

    def operand(self, comp: Computation, current: "_OpenInstruction", waiting: list["_OpenInstruction"],
                pos: int) -> tuple["_OpenInstruction", int]:
        """The next operand of ``current``, or its ')': a name (with its tuple indices), no operand at all, or a
        nested instruction, opened, with ``current`` left waiting on it. The instruction whose operands are read
        next, and where."""
        text = self.text
        if self.peek(pos) == ")":
            current.done = True
            return current, pos + 1
        shape = None
        if self.starts_shape(pos):
            shape, pos = self.shape(pos)
            pos = self.skip(pos)
        if self.peek(pos) not in (",", ")"):
            m = _NAME.match(text, pos)
            if not m:
                raise self.error(f"expected an operand in computation {comp.name}, found {self.found(pos)}", pos)
            if text[pos] != "%" and text.startswith("(", self.skip(m.end())):  # a nested instruction
                if len(waiting) + 1 >= MAX_NESTING:
                    raise self.error(f"operands nested deeper than {MAX_NESTING} levels (XLA's parser "
                                     f"reads at most {MAX_NESTING} levels of nesting)", pos)
                waiting.append(current)
                return self.open_instruction(comp, self.anonymous_name(m.group(1)), False, pos, self.line(pos), shape)
            ref, pos = m.group(1), m.end()
            while text.startswith("#", pos):  # %t#1#0: element 0 of element 1 of t
                index = _DIGITS.match(text, pos + 1)
                if not index:
                    raise self.error(f"expected a tuple index after '#', found {self.found(pos + 1)}", pos)
                ref = self.tuple_element(comp, ref, hlo_int(index.group(), f"{ref}#: index", self.source,
                                                                self.line(pos)), pos)
                pos = index.end()
            current.refs.append(ref)
        return current, self.after_operand(current, pos)

    def open_instruction(self, comp: Computation, name: str, is_root: bool, pos: int, line: int,
                         shape: Shape | None) -> tuple["_OpenInstruction", int]:
        """``[shape] opcode(``: the instruction with its operand list open; a parameter's or constant's literal
        is read to its ')'. ``shape`` when the caller has read it already."""
        text = self.text
        if shape is None and self.starts_shape(pos):
            shape, pos = self.shape(pos)
            pos = self.skip(pos)
        m = _OPCODE.match(text, pos)
        if not m:
            word = _SHAPE_START.match(text, pos)
            if shape is None and word and text.startswith("[", word.end()):
                raise self.error(f"not an HLO shape: unknown element type {word.group(1)!r}", pos)
            what = "an opcode followed by '('" if shape is not None else "a shape or an opcode after '='"
            raise self.error(f"expected {what} in computation {comp.name}, found {self.found(pos)}", pos)
        opcode = m.group()
        pos = self.skip(m.end())
        current = _OpenInstruction(name, is_root, line, shape, opcode)
        if opcode in ("parameter", "constant"):
            end = self.close(pos)
            current.literal = tidy(text[pos + 1:end - 1])
            if opcode == "parameter" and current.literal and not current.literal.isdigit():
                raise self.error(f"parameter number must be a non-negative integer, got {current.literal[:20]!r}",
                                 pos)
            if opcode == "parameter" and current.literal:
                current.literal = str(hlo_int(current.literal, f"{name}: parameter number", self.source, line))
            current.done = True
            return current, end
        current.refs = []
        return current, self.skip(pos + 1)

    def after_operand(self, current: "_OpenInstruction", pos: int) -> int:
        """Past the ',' or ')' that follows an operand."""
        pos = self.skip(pos)
        c = self.peek(pos)
        if c == ",":
            return self.skip(pos + 1)
        if c == ")":
            current.done = True
            return pos + 1
        raise self.error(f"expected ',' or ')' in the operands, found {self.found(pos)}", pos)

    def starts_shape(self, pos: int) -> bool:
        """As XLA: a shape starts with '(' or an element type (``b(...)`` for a buffer)."""
        c = self.peek(pos)
        if c == "(":
            return True
        m = _SHAPE_START.match(self.text, pos)
        if not m:
            return False
        word = m.group(1)
        return is_element_type(word) or (word == "b" and self.text.startswith("(", self.skip(m.end())))

    def shape(self, pos: int) -> tuple[Shape, int]:
        text = self.text
        if text.startswith("(", pos):
            end = self.close(pos)
        elif text.startswith("b", pos) and text.startswith("(", self.skip(pos + 1)):
            end = self.close(self.skip(pos + 1))
        else:
            m = _ARRAY_SHAPE.match(text, pos)
            if not m:
                raise self.error(f"expected a shape, found {self.found(pos)}", pos)
            end = m.end()
        try:
            return parse_shape(text[pos:end]), end
        except ValueError as exc:
            raise self.error(str(exc), pos) from None

    def anonymous_name(self, opcode: str) -> str:
        n = self.anonymous.get(opcode, 0)
        self.anonymous[opcode] = n + 1
        self.anonymous_log.append(opcode)
        return f"{opcode}.anon" + (f".{n}" if n else "")

    def tuple_element(self, comp: Computation, base: str, index: int, pos: int) -> str:
        """The get-tuple-element XLA builds for ``base#index``, made once and shared by later uses."""
        name = f"{base}_{index}"
        existing = comp.by_name.get(name)
        if existing is not None and existing.operands == (base,) and existing.attrs.get("index") == str(index):
            return name
        tup = comp.by_name.get(base)
        if tup is None:
            raise self.error(f"uses undefined operand {base!r}", pos)
        if not tup.shape.is_tuple or index >= len(tup.shape.elements):
            arity = f"{len(tup.shape.elements)} elements" if tup.shape.is_tuple else "no tuple shape"
            raise self.error(f"reads element {index} of {base!r}, which has {arity}", pos)
        while name in comp.by_name:
            name += "_"
        self.add(comp, Instruction(name=name, opcode="get-tuple-element", shape=tup.shape.elements[index],
                                   operands=(base,), literal="", attrs={"index": str(index)}, is_root=False,
                                   line=self.line(pos)))
        return name

    def attributes(self, comp: Computation, pos: int, owner: str) -> tuple[dict[str, str], int]:
        """``, key=value`` pairs; a value runs to the next top-level ',' or the instruction's end."""
        attrs: dict[str, str] = {}
        while (found := self.next_attribute(pos, f" in computation {comp.name}")) is not None:
            key, value_start = found
            if key in COMPUTATION_ATTRS and self.inline_body_follows(value_start):
                attrs[key], pos = self.inline_computations(value_start, f"{owner}.{key}")
            else:
                pos = self.value_end(value_start, key, comp)
                attrs[key] = self.numbers_checked(key, tidy(self.text[value_start:pos]), owner,
                                                  self.line(value_start))
        return attrs, pos

    def check_numbers(self, attrs: dict[str, str], owner: str, line: int) -> None:
        """``numbers_checked`` of each attribute, in place (before the dict is shared)."""
        for key, value in attrs.items():
            attrs[key] = self.numbers_checked(key, value, owner, line)

    def numbers_checked(self, key: str, value: str, owner: str, line: int) -> str:
        """An attribute's value with every integer within int64 (``hlo_int``; metadata's within int32), as XLA
        reads them, and kept without leading zeros: what reads one later (an index, a dimension, a sharding's
        tiles, the header's aliases) takes it as read. Only runs of digits long enough to pass the bound are
        looked at; strings (op_name, backend_config's JSON) are no numbers of the attribute."""
        if key == "metadata" and _METADATA_LONG.search(value):
            for m in _METADATA_NUMBER_OR_STRING.finditer(value):
                if m.group("n") is not None:
                    hlo_int(m.group("n"), f"{owner}: {m.group('field')}", self.source, line, INT32_MAX)
        if key in _FREE_TEXT_ATTRS or len(value) < 19 or not _LONG_DIGITS.search(value):
            return value

        def number(m: re.Match) -> str:
            digits = m.group("long")
            return m.group() if digits is None else str(hlo_int(digits, f"{owner}: {key}", self.source, line))

        return _LONG_INTEGER_OR_STRING.sub(number, value)

    def value_end(self, pos: int, key: str, comp: Computation) -> int:
        """End of an attribute value: atoms (``[1,8]<=[8]`` is three) up to ',' or the instruction's end."""
        text = self.text
        if self.peek(pos) in (",", "}", ")", ""):
            raise self.error(f"attribute {key} has no value in computation {comp.name}", pos)
        while True:
            pos = self.atom(pos, f"attribute {key}")
            nxt = self.skip(pos)
            c = self.peek(nxt)
            if c in (",", "}", ")", "") or _INSTRUCTION_START.match(text, nxt):
                return pos
            pos = nxt

    def inline_body_follows(self, pos: int) -> bool:
        """``{ p = f32[] parameter(0) ... }`` (or a list of them) rather than ``{%a, %b}``."""
        while self.text.startswith("{", pos):
            pos = self.skip(pos + 1)
            if _INSTRUCTION_START.match(self.text, pos):
                return True
        return False

    def inline_computations(self, pos: int, name: str) -> tuple[str, int]:
        """An inline body (or a ``{{...}, {...}}`` list of them), read before as computations of their own (see
        body()): their names, and where the value ends. _InlineBody for the first one not read yet."""
        text = self.text
        inner = self.skip(pos + 1)
        if not text.startswith("{", inner):
            body_name, end = self.inline_body(pos, name)
            return "%" + body_name, end
        names = []
        while True:
            body_name, end = self.inline_body(inner, f"{name}.{len(names)}")
            names.append("%" + body_name)
            inner = self.skip(end)
            if text.startswith(",", inner):
                inner = self.skip(inner + 1)
            elif text.startswith("}", inner):
                return "{" + ", ".join(names) + "}", inner + 1
            else:
                raise self.error(f"expected ',' or '}}' between inline computations, found {self.found(inner)}",
                                 inner)

    def inline_body(self, pos: int, name: str) -> tuple[str, int]:
        read = self.inline_read.get(pos)
        if read is None:
            raise _InlineBody(pos, name)
        return read

    def inferred_shape(self, comp: Computation, opcode: str, operands: tuple[str, ...], attrs: dict[str, str],
                       pos: int) -> Shape:
        def program_shape(name: str) -> ProgramShape:
            callee = self.computations.get(name)
            if callee is None:
                raise ShapeInferenceError(f"{opcode} calls {name}, which is not defined before it")
            return ProgramShape(tuple(p.shape for p in callee.parameters), callee.root.shape)

        shapes = []
        for ref in operands:
            target = comp.by_name.get(ref)
            if target is None:
                raise self.error(f"uses undefined operand {ref!r}", pos)
            shapes.append(target.shape)
        try:
            return infer_shape(opcode, shapes, attrs, program_shape)
        except ShapeInferenceError as exc:
            raise self.error(f"cannot infer a result shape: {exc} (in computation {comp.name})", pos) from None

    # -- linking --------------------------------------------------------------------------------------------

    def add(self, comp: Computation, instr: Instruction) -> None:
        """Append ``instr``: its operands must be defined (as XLA: before it), its name new."""
        by_name = comp.by_name
        name = instr.name
        if name in by_name:
            raise HloParseError(f"instruction {name!r} defined twice in computation {comp.name}", self.source,
                                instr.line)
        for ref in instr.operands:
            if ref not in by_name:
                raise HloParseError(f"{name} uses undefined operand {ref!r}", self.source, instr.line)
        opcode = instr.opcode
        if opcode == "get-tuple-element":
            self.check_tuple_access(instr, by_name)
        elif "-" in opcode and opcode.endswith(("-start", "-update", "-done")) and opcode not in NATIVE_ASYNC_OPCODES:
            self.unfold_async(comp, instr)
        attrs = instr.attrs
        if attrs and not COMPUTATION_ATTRS.isdisjoint(attrs):
            self.calling.append((comp.name, instr))
        comp.instructions.append(instr)
        by_name[name] = instr

    def check_tuple_access(self, instr: Instruction, by_name: dict[str, Instruction]) -> None:
        """Element indices must be integers within the tuple: later passes index with them."""
        index = instr.attrs.get("index", "")
        target = by_name.get(instr.operands[0]) if len(instr.operands) == 1 else None
        arity = len(target.shape.elements) if target is not None and target.shape.is_tuple else None
        if not index.isdigit() or arity is None or hlo_int(index, f"{instr.name}: index", self.source,
                                                            instr.line) >= arity:
            base = instr.operands[0] if instr.operands else ""
            raise HloParseError(f"{instr.name} reads element {index!r} of {base!r}, which has "
                                f"{'no tuple shape' if arity is None else f'{arity} elements'}", self.source,
                                instr.line)

    def unfold_async(self, comp: Computation, instr: Instruction) -> None:
        """``custom-call-start(x), custom_call_target=...`` is XLA's shorthand for an ``async-start`` that calls
        a computation wrapping the custom call; ``-update`` and ``-done`` become ``async-update/-done``."""
        kind = instr.opcode.rsplit("-", 1)[1]
        wrapped_opcode = instr.opcode[:-len(kind) - 1]
        instr.opcode = f"async-{kind}"
        if kind != "start":
            return
        shape = instr.shape
        if not shape.is_tuple or len(shape.elements) < 2:
            raise HloParseError(f"{instr.name}: {wrapped_opcode}-start must have a tuple shape "
                                "((operands), result, context)", self.source, instr.line)
        name = f"{instr.name}.wrapped"
        while name in self.computations:
            name += "_"
        wrapped = Computation(name=name, is_entry=False, line=instr.line)
        # One parameter per operand; an operand-less call or fusion takes its callee's parameters (as XLA).
        shapes = [comp.by_name[ref].shape for ref in instr.operands]
        callee = self.computations.get(next(iter(instr.called_computations()), ""))
        if not shapes and callee is not None:
            shapes = [p.shape for p in callee.parameters]
        params = []
        for n, param_shape in enumerate(shapes):
            param = Instruction(name=f"async_param.{n}", opcode="parameter", shape=param_shape,
                                operands=(), literal=str(n), attrs={}, is_root=False, line=instr.line)
            params.append(param.name)
            wrapped.instructions.append(param)
            wrapped.by_name[param.name] = param
        op = Instruction(name=wrapped_opcode, opcode=wrapped_opcode, shape=shape.elements[1],
                         operands=tuple(params), literal="",
                         attrs={k: v for k, v in instr.attrs.items() if k != "async_execution_thread"},
                         is_root=True, line=instr.line)
        self.add(wrapped, op)
        self.computations[name] = wrapped
        instr.attrs = {k: v for k, v in instr.attrs.items() if k in _ASYNC_ATTRS}
        instr.attrs["calls"] = "%" + name

    def check_calls(self, module: HloModule) -> None:
        """Every named computation exists, and none calls itself (HLO has no recursion; a cycle from a garbled
        or hand-edited module would loop every later pass)."""
        calls: dict[str, list[tuple[str, Instruction]]] = {}
        for caller, instr in self.calling:
            for callee in instr.called_computations():
                if callee not in module.computations:
                    raise HloParseError(f"{instr.name} calls undefined computation {callee!r}", self.source,
                                        instr.line)
                calls.setdefault(caller, []).append((callee, instr))
        # Depth first with an explicit stack (a chain of calls is as long as the module is, XLA reads any).
        state: dict[str, int] = {}  # 1: on the current path, 2: done
        for root in calls:
            if root in state:
                continue
            state[root] = 1
            path = [root]
            stack = [iter(calls.get(root, ()))]
            while stack:
                step = next(stack[-1], None)
                if step is None:
                    state[path.pop()] = 2
                    stack.pop()
                    continue
                callee, instr = step
                if state.get(callee) == 1:
                    cycle = " -> ".join([*path[path.index(callee):], callee])
                    raise HloParseError(f"call cycle {cycle}", module.source, instr.line)
                if callee not in state:
                    state[callee] = 1
                    path.append(callee)
                    stack.append(iter(calls.get(callee, ())))


def _simple_attributes(rest: str) -> dict[str, str]:
    """``, a={0,1}, b=x`` (the rest of a one-line instruction) -> {"a": "{0,1}", "b": "x"}; _Declined unless
    the list is complete on this line and holds no comment."""
    rest = rest.strip()
    if not rest:
        return {}
    if _SIMPLE_ATTRIBUTES.fullmatch(rest):
        return dict(_SIMPLE_ATTRIBUTE.findall(rest))
    if not rest.startswith(","):
        raise _Declined
    attrs: dict[str, str] = {}
    depth = 0
    start = 1
    for m in TOKEN.finditer(rest, 1):
        tok = m.group()
        if tok in "{([":
            depth += 1
        elif tok in "})]":
            depth -= 1
            if depth < 0:
                raise _Declined
        elif tok == ",":
            if depth == 0:
                _add_attribute(attrs, rest[start:m.start()])
                start = m.end()
        elif tok in ("//", "/*", '"', "'"):  # a comment, or a string that does not end on this line
            raise _Declined
    if depth:
        raise _Declined
    _add_attribute(attrs, rest[start:])
    return attrs


def _add_attribute(attrs: dict[str, str], part: str) -> None:
    key, eq, value = part.partition("=")
    key, value = key.strip(), value.strip()
    if not eq or not value or not re.fullmatch(r"[A-Za-z_][\w.\-]*", key) or key in COMPUTATION_ATTRS and \
            value.startswith("{") and "=" in value:
        raise _Declined  # no '=', no value, or an inline computation body: the general parser's job
    attrs[key] = value


def _simple_operands(text: str) -> tuple[str, ...]:
    if "%" in text:  # XLA dump: "f32[8]{0} %a, (s32[], f32[]) %t" -- every name has a %
        if "#" in text or "/" in strip_index_comments(text):
            raise _Declined
        return tuple(_PERCENT_NAME.findall(text))
    if not text:
        return ()
    # jax: "a, b" (names only). An operand is the last word of its comma-separated piece; blank pieces
    # are skipped. The common line has no brackets, strings or comments, and one regex does that.
    if _OPERAND_SYNTAX.search(text) is None:
        return tuple(_LAST_WORD_OF_PIECE.findall(text))
    if "#" in text or "//" in text or "\"" in text:
        raise _Declined
    text = strip_index_comments(text)
    if "/" in text:
        raise _Declined
    names = [words[-1] for words in map(str.split, split_top_level(text)) if words]
    if not all(map(_OPERAND_NAME.fullmatch, names)):
        raise _Declined  # a piece that is only a shape (no operand, as XLA reads it): the general parser's job
    return tuple(names)


# What a path names when it is not a regular file, as the error says it.
_FILE_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
               (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
_HEAD = 4096  # what the binary check reads before the rest of the file


def read_text(path: Path | str) -> str:
    """Read an HLO file as text; anything else becomes an HloParseError naming the path.

    Only a regular file is read: its type is checked (os.stat) before it is opened, and again on the open
    descriptor (opened without blocking, so a FIFO put there meanwhile cannot hang the read), so a named pipe
    with no writer, /dev/zero or a socket is one line, never a hang or a MemoryError. The first 4 KiB are
    checked for binary data before the rest is read.
    """
    p = Path(path)
    source = str(p)
    try:
        info = os.stat(p)
    except (FileNotFoundError, NotADirectoryError):
        raise HloParseError("no such file", source) from None
    except OSError as exc:
        raise HloParseError(f"cannot read: {exc.strerror or exc}", source) from None
    _check_regular(info.st_mode, source)
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except IsADirectoryError:
        raise HloParseError("is a directory, not an HLO file", source) from None
    except OSError as exc:
        raise HloParseError(f"cannot read: {exc.strerror or exc}", source) from None
    try:
        with os.fdopen(fd, "rb") as f:
            info = os.fstat(f.fileno())
            _check_regular(info.st_mode, source)
            if b"\x00" in f.read(_HEAD):
                raise HloParseError("binary data, not HLO text", source)
            f.seek(0)
            data = f.read()
    except MemoryError:
        raise HloParseError(f"too large to read into memory ({info.st_size:,} bytes)", source) from None
    except OSError as exc:
        raise HloParseError(f"cannot read: {exc.strerror or exc}", source) from None
    return decode_text(data, source)


def read_stream(stream, source: str) -> str:
    """HLO text from a binary stream (standard input): the first 4 KiB checked for binary data before the rest
    is read, so ``hlo-audit count - < /dev/zero`` is one line at once, not a read until memory runs out."""
    try:
        head = stream.read(_HEAD)
        if b"\x00" in head:
            raise HloParseError("binary data, not HLO text", source)
        data = head + stream.read()
    except MemoryError:
        raise HloParseError("too large to read into memory", source) from None
    except OSError as exc:
        raise HloParseError(f"cannot read: {exc.strerror or exc}", source) from None
    return decode_text(data, source)


def _check_regular(mode: int, source: str) -> None:
    if stat.S_ISREG(mode):
        return
    if stat.S_ISDIR(mode):
        raise HloParseError("is a directory, not an HLO file", source)
    kind = next((name for test, name in _FILE_KINDS if test(mode)), "not a regular file")
    raise HloParseError(f"is {kind}, not an HLO file: hlo-audit reads regular files, '-' (standard input) and "
                        "dump folders", source)


def parse_file(path: Path | str) -> HloModule:
    return parse_module(read_text(path), str(path))


def decode_text(data: bytes, source: str) -> str:
    """HLO bytes as text; binary or non-UTF-8 input becomes an HloParseError naming ``source``."""
    if b"\x00" in data[:_HEAD]:
        raise HloParseError("binary data, not HLO text", source)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HloParseError(f"not UTF-8 text (byte {exc.start})", source) from None
    except MemoryError:
        raise HloParseError(f"too large to decode in memory ({len(data):,} bytes)", source) from None
