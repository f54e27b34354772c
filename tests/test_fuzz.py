"""Fuzz the parser, analysis and normalization with hypothesis over mutations of real modules.

The corpus is real: jax's printer (names without ``%``, no signatures) for an unrolled and a scanned step, and
XLA's own ``--xla_dump_to`` files (``%`` names, signatures, metadata, the FileNames/StackFrames tables;
after optimization: fusions, ``calls=``, backend configs). Mutations: truncate anywhere, delete / duplicate /
swap / move lines, replace a slice with HLO-ish junk, overwrite characters, insert raw bytes (file route only).

Property: every input either parses or fails with ``HloParseError`` whose message is one line naming the
source; through the file route (``read_input`` -> ``analyze`` -> ``normalize``) the same; whatever parses
normalizes, deterministically; the CLI exits 0 or 2, never with a traceback.

Examples are derandomized so CI is reproducible. Explore more with, e.g.,
``HLO_AUDIT_FUZZ_RANDOM=1 HLO_AUDIT_FUZZ_SCALE=20 pytest tests/test_fuzz.py``.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import nnx_models
from hlo_audit.cli import app
from hlo_audit.hlo.analysis import analyze
from hlo_audit.hlo.normalize import normalize
from hlo_audit.hlo.source import pick_dump_module, read_input
from hlo_audit.hlo.text import HloModule, HloParseError, parse_module
from nnx_models import ModelSpec

_SCALE = float(os.environ.get("HLO_AUDIT_FUZZ_SCALE", "1"))


def fuzz_settings(examples: int):
    return settings(
        max_examples=max(1, int(examples * _SCALE)),
        deadline=None,
        derandomize="HLO_AUDIT_FUZZ_RANDOM" not in os.environ,
        database=None,  # nothing written into the work tree
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                               HealthCheck.function_scoped_fixture],
    )


class Corpus(list):
    """(name, text) pairs; printed by name only when hypothesis reports a failing example."""

    def __repr__(self) -> str:
        return f"Corpus({[name for name, _ in self]})"


class Mutated:
    """A mutated module; its repr shows what changed (a short diff), not the whole text."""

    def __init__(self, kind: str, source: str, original: str, payload: str | bytes):
        self.kind, self.source, self.original, self.payload = kind, source, original, payload

    def _repr_pretty_(self, printer, cycle) -> None:  # hypothesis's pretty printer
        printer.text(repr(self))

    def __repr__(self) -> str:
        new = self.payload if isinstance(self.payload, str) else self.payload.decode("utf-8", "backslashreplace")
        hunks = difflib.unified_diff(self.original.splitlines(), new.splitlines(), lineterm="", n=0)
        shown = [repr(line)[1:-1][:160] for line in list(hunks)[2:14]]
        return f"Mutated({self.kind} of {self.source}:\n    " + "\n    ".join(shown) + ")"


@pytest.fixture(scope="session")
def corpus(dump_folder) -> Corpus:
    """(name, text) of real modules: two from jax's printer, the dump before and after optimization."""
    texts = [
        ("jax-L2_drop0.hlo", nnx_models.hlo_text(ModelSpec(dropout_rate=0.0))),
        ("jax-L2_scan_drop0.5.hlo", nnx_models.hlo_text(ModelSpec(scan=True, dropout_rate=0.5))),
    ]
    for stage in ("before", "after"):
        path = pick_dump_module(dump_folder, stage=stage)
        texts.append((f"dump-{stage}.txt", path.read_text()))
    for name, text in texts:  # the unmutated corpus parses
        assert parse_module(text, name).entry.parameters, name
    return Corpus(texts)


@pytest.fixture(scope="session")
def fuzz_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


# --------------------------------------------------------------------------------------------------------------
# mutations
# --------------------------------------------------------------------------------------------------------------

# Pieces of HLO syntax, so that junk often looks almost right to the parser.
HLO_PIECES = list('{}()[]"%=,.#:/*\\-_<>?! \n\t') + [
    "ROOT ", "ENTRY ", "HloModule ", "parameter(", "constant(", "tuple(", "get-tuple-element(", "->", "/*index=5*/",
    "u32[]", "f32[2,2]{1,0}", "(s32[], u32[2]{0})", "%p.1", "metadata={op_name=\"a\"}", "sharding={replicated}",
    ", to_apply=%", "\\\"", "\r", "\x0c", "\u2028", "\x00", "ÿ", "FileNames\n", "StackFrames\n", "}\n", "{\n",
]
junk = st.lists(st.one_of(st.sampled_from(HLO_PIECES), st.characters(codec="utf-8")), max_size=12).map("".join)

TEXT_MUTATIONS = ("truncate", "delete_line", "duplicate_line", "swap_lines", "move_line", "replace_slice",
                  "flip_chars")


@st.composite
def text_mutation(draw, source: str, original: str) -> Mutated:
    """One to three mutations of ``original``, as text."""
    text = original
    kinds = draw(st.lists(st.sampled_from(TEXT_MUTATIONS), min_size=1, max_size=3))
    for kind in kinds:
        lines = text.splitlines(keepends=True) or [""]

        def line_index() -> int:
            return draw(st.integers(0, len(lines) - 1))

        def offset() -> int:
            return draw(st.integers(0, len(text)))

        if kind == "truncate":
            text = text[: offset()]
        elif kind == "delete_line":
            i = line_index()
            text = "".join(lines[:i] + lines[i + 1:])
        elif kind == "duplicate_line":
            i = line_index()
            text = "".join(lines[: i + 1] + lines[i:])
        elif kind == "swap_lines":
            i, j = line_index(), line_index()
            lines[i], lines[j] = lines[j], lines[i]
            text = "".join(lines)
        elif kind == "move_line":
            i, j = line_index(), line_index()
            lines.insert(j, lines.pop(i))
            text = "".join(lines)
        elif kind == "replace_slice":
            start = offset()
            text = text[:start] + draw(junk) + text[start + draw(st.integers(0, 80)):]
        else:  # flip_chars
            chars = list(text) or [""]
            for _ in range(draw(st.integers(1, 4))):
                chars[draw(st.integers(0, len(chars) - 1))] = draw(
                    st.one_of(st.sampled_from(list('{}()[]"%=,.#: \n')), st.characters(codec="utf-8")))
            text = "".join(chars)
    return Mutated("+".join(kinds), source, original, text)


@st.composite
def byte_mutation(draw, source: str, original: str) -> Mutated:
    """A text mutation encoded, or raw bytes (NUL, invalid UTF-8, ...) inserted into the real module."""
    if draw(st.booleans()):
        m = draw(text_mutation(source, original))
        return Mutated(m.kind, source, original, m.payload.encode("utf-8"))
    data = original.encode("utf-8")
    at = draw(st.integers(0, len(data)))
    return Mutated("insert_bytes", source, original, data[:at] + draw(st.binary(min_size=1, max_size=16)) + data[at:])


def draw_mutation(data, corpus: Corpus, strategy) -> Mutated:
    name, text = corpus[data.draw(st.integers(0, len(corpus) - 1), label="module")]
    return data.draw(strategy(name, text), label="mutation")


# --------------------------------------------------------------------------------------------------------------
# properties
# --------------------------------------------------------------------------------------------------------------


def assert_clean_error(exc: HloParseError, source: str, text: str | None = None) -> None:
    message = str(exc)
    assert len(message.splitlines()) == 1, repr(message)
    assert message.startswith(f"{source}:"), (source, message)
    assert "Traceback" not in message
    if exc.line is not None and text is not None:
        assert 1 <= exc.line <= max(1, len(text.splitlines())), (exc.line, message)


def check_parse(text: str, source: str) -> HloModule | None:
    try:
        module = parse_module(text, source)
    except HloParseError as exc:
        assert_clean_error(exc, source, text)
        return None
    assert isinstance(module, HloModule)
    assert module.entry.is_entry and module.entry.instructions
    return module


def check_file_route(path: Path) -> str:
    source = str(path)
    try:
        text, label = read_input(source)
        assert label == source
        analysis = analyze(text, label)
        canonical = analysis.normalized
    except HloParseError as exc:
        assert_clean_error(exc, source)
        return "HloParseError"
    assert canonical.endswith("\n") and canonical.startswith("HloModule ")
    assert normalize(analysis.module, analysis.params) == canonical  # same output twice
    assert analyze(text, label).normalized == canonical  # and from a fresh parse
    assert analysis.summary.entry_params == len(analysis.module.entry.parameters)
    return "normalized"


@fuzz_settings(500)
@given(data=st.data())
def test_parse_module_returns_module_or_one_line_error(corpus, data):
    m = draw_mutation(data, corpus, text_mutation)
    event("parsed" if check_parse(m.payload, m.source) is not None else "HloParseError")


@fuzz_settings(250)
@given(data=st.data())
def test_file_route_read_analyze_normalize(corpus, fuzz_dir, data):
    m = draw_mutation(data, corpus, byte_mutation)
    path = fuzz_dir / f"route-{m.source}"
    path.write_bytes(m.payload)
    event(check_file_route(path))


@fuzz_settings(100)
@given(data=st.data())
def test_cli_count_and_diff_exit_cleanly(corpus, fuzz_dir, data):
    m = draw_mutation(data, corpus, byte_mutation)
    original, path = fuzz_dir / f"orig-{m.source}", fuzz_dir / f"cli-{m.source}"
    original.write_text(m.original)
    path.write_bytes(m.payload)
    runner = CliRunner()

    count = runner.invoke(app, ["count", str(path), "--format", "json"])
    assert count.exception is None or isinstance(count.exception, SystemExit), repr(count.exception)
    assert count.exit_code in (0, 2), (count.exit_code, count.stderr)
    assert "Traceback" not in count.stdout + count.stderr
    event(f"count exit {count.exit_code}")
    if count.exit_code == 0:
        (module,) = json.loads(count.stdout)["modules"]
        assert isinstance(module["entry_params"], int)
        assert sum(module["by_dtype"].values()) == sum(module["groups"].values()) == module["entry_params"]
    else:
        (module,) = json.loads(count.stdout)["modules"]  # the input's error in place of its numbers
        assert set(module) == {"source", "error"} and module["error"].startswith(str(path))
        lines = count.stderr.splitlines()
        assert len(lines) == 1 and lines[0] == f"hlo-audit: error: {module['error']}", count.stderr

    diff = runner.invoke(app, ["diff", str(original), str(path), "--format", "json"])
    assert diff.exception is None or isinstance(diff.exception, SystemExit), repr(diff.exception)
    assert diff.exit_code == 2 if count.exit_code == 2 else diff.exit_code in (0, 1), (diff.exit_code, diff.stderr)
    assert "Traceback" not in diff.stdout + diff.stderr
    if diff.exit_code != 2:
        verdict = json.loads(diff.stdout)["verdict"]
        assert (diff.exit_code == 0) == (verdict in ("identical", "identical-after-normalization"))


@pytest.mark.parametrize("stage", ["before", "after"])
def test_every_line_deleted_in_turn(corpus, stage):
    """Systematic rather than random: the real dump with one line removed, for ~150 evenly spread lines."""
    name, text = next((n, t) for n, t in corpus if n == f"dump-{stage}.txt")
    lines = text.splitlines(keepends=True)
    step = max(1, len(lines) // 150)
    for i in range(0, len(lines), step):
        check_parse("".join(lines[:i] + lines[i + 1:]), name)


# Found by this fuzzer (reduced by hand), fixed in the parser, pinned here: each is now one clean error.

@pytest.mark.parametrize("literal", ["x", "", "1.5", "0name"])
def test_garbage_parameter_number_is_a_parse_error(corpus, literal):
    name, text = corpus[0]
    start = text.index("parameter(", text.index("\nENTRY"))  # an entry parameter
    mutated = text[:start] + f"parameter({literal})" + text[text.index(")", start) + 1:]
    assert check_parse(mutated, name) is None


def test_recursive_call_is_a_parse_error(corpus):
    name, text = corpus[0]
    head = next(line for line in text.splitlines() if line and not line.startswith(("HloModule", " ", "ENTRY", "}")))
    callee = head.split()[0]  # first non-entry computation, e.g. relu.1
    lines = text.splitlines(keepends=True)
    at = lines.index(head + "\n")
    body_param = lines[at + 1].split("=")[0].strip()
    lines.insert(at + 2, f"  self_call.99 = f32[] call({body_param}), to_apply={callee}\n")
    with pytest.raises(HloParseError, match=f"call cycle {re.escape(callee)} -> {re.escape(callee)}"):
        parse_module("".join(lines), name)


@pytest.mark.parametrize("index", ["7", "x"])
def test_bad_tuple_index_is_a_parse_error(index):
    text = ("HloModule m\n\nENTRY e {\n  state__rngs____key___value.1 = u32[2] parameter(0)\n"
            "  t = (u32[2]) tuple(state__rngs____key___value.1)\n"
            f"  ROOT g = u32[2] get-tuple-element(t), index={index}\n}}\n")
    with pytest.raises(HloParseError, match=f"g reads element '{index}' of 't', which has 1 elements"):
        parse_module(text, "gte.hlo")


@st.composite
def deep_module(draw) -> tuple[str, int]:
    """A valid module nesting a tuple shape, an operand expression and inline computations, each of a drawn depth
    up to past XLA's limit of 500; returns (text, deepest nesting)."""
    tuple_depth, operand_depth, inline_depth = (draw(st.integers(0, 620)) for _ in range(3))
    shape = "(" * tuple_depth + "f32[]" + ")" * tuple_depth
    expression = "x"
    for _ in range(operand_depth):
        expression = f"f32[] negate({expression})"
    body = "{ a = f32[] parameter(0)\n ROOT n = f32[] negate(a) }"
    for _ in range(inline_depth):
        body = "{ a = f32[] parameter(0)\n ROOT n = f32[] call(a), to_apply=" + body + " }"
    text = (f"HloModule deep\nENTRY e {{\n  p = {shape} parameter(0)\n  x = f32[] parameter(1)\n"
            f"  y = f32[] negate({expression})\n  z = f32[] call(y), to_apply={body}\n"
            f"  ROOT t = ({shape}, f32[]) tuple(p, z)\n}}\n")
    return text, max(tuple_depth + 1, operand_depth + 1, inline_depth + 1)


@fuzz_settings(40)
@given(drawn=deep_module())
def test_deep_modules_parse_or_fail_in_one_line(drawn):
    """Never a RecursionError: within XLA's 500 levels a module parses, analyses and normalizes; past them, one
    line naming the line."""
    text, depth = drawn
    try:
        analysis = analyze(text, "deep.hlo")
    except HloParseError as exc:
        assert depth > 500, str(exc)
        assert "\n" not in str(exc) and "nested deeper than 500 levels" in str(exc)
        event("refused past 500 levels")
        return
    assert depth <= 500
    assert analysis.summary.entry_params == 2 and analysis.normalized and analysis.rng.streams == []
    event("read")
