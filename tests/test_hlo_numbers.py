"""Every number read from HLO text bounded (issue 48, item 4): a 5,000-digit ``source_line``, ``stack_frame_id`` or
debug-table line made ``diff``, ``rng`` and ``explain`` raise ValueError from ``int()`` (Python 3.12 refuses strings
of more than 4,300 digits): a traceback, exit 1. Now one line naming the file, the line and what the number is, exit
2, from every command, wherever the number is (``hlo.numbers``, read through ``text.hlo_int``).

XLA's own parser is the judge of what is valid: each hostile text here is one it refuses, and at its bounds (int32
for metadata's and the debug tables' numbers, int64 for the rest) what it reads, hlo-audit reads; numbers written
with thousands of leading zeros, which XLA reads, are read too.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from jax._src.lib import hlo

from hlo_audit.hlo.thunks import ThunkParseError, parse_thunk_sequence
from in_process import hlo_audit_here
from xla_oracle import xla_counts

BIG = "9" * 5000
COMMANDS = ("count", "diff", "rng", "explain")
TABLES = ('FileNames\n1 "/x/model.py"\n\nFunctionNames\n1 "f"\n\nFileLocations\n1 {{file_name_id=1 '
          'function_name_id=1 line={line} end_line=1 column=1 end_column=2}}\n\nStackFrames\n1 {{file_location_id=1 '
          'parent_frame_id={parent}}}\n\n')


def module(param: str = "p = f32[2] parameter(0)", root: str = "ROOT r = f32[2] negate(p)", header: str = "",
           tables: str = "") -> str:
    return f"HloModule m{header}\n\n{tables}ENTRY e {{\n  {param}\n  {root}\n}}\n"


def with_tables(line: str = "4", parent: str = "0") -> str:
    return module('p = f32[2] parameter(0), metadata={op_name="a" stack_frame_id=1}',
                  'ROOT r = f32[2] negate(p), metadata={op_name="b" stack_frame_id=1}',
                  tables=TABLES.format(line=line, parent=parent))


def source_line(value: str) -> str:
    return module(f'p = f32[2] parameter(0), metadata={{op_name="a" source_file="/x/model.py" source_line={value}}}',
                  'ROOT r = f32[2] negate(p), metadata={op_name="b" source_file="/x/model.py" source_line=3}')


def stack_frame(value: str) -> str:
    return module(f'p = f32[2] parameter(0), metadata={{op_name="a" stack_frame_id={value}}}',
                  'ROOT r = f32[2] negate(p), metadata={op_name="b" stack_frame_id=1}',
                  tables=TABLES.format(line="4", parent="0"))


# name -> (text, what the error names); the line it names is the first holding the number
HOSTILE = {
    "source_line": (source_line(BIG), "p: source_line 999999999999... (5,000 digits) is out of range"),
    "stack_frame_id": (stack_frame(BIG), "p: stack_frame_id 999999999999..."),
    "a debug table's line": (with_tables(line=BIG), "FileLocations 1: line 999999999999..."),
    "a debug table's parent frame": (with_tables(parent=BIG), "StackFrames 1: parent_frame_id 999999999999..."),
    "a debug table's entry number": (module(tables=f'FileNames\n{BIG} "/x/model.py"\n\n'),
                                     "FileNames: entry number 999999999999..."),
    "a dimension": (module(f"p = f32[{BIG}] parameter(0)", f"ROOT r = f32[{BIG}] negate(p)"), "dimension 9999"),
    "a parameter number": (module(f"p = f32[2] parameter({BIG})"), "p: parameter number 9999"),
    "a tuple index": (module("p = (f32[2], f32[2]) parameter(0)", f"ROOT r = f32[2] get-tuple-element(p), "
                             f"index={BIG}"), "r: index 9999"),
    "an alias": (module(header=f", input_output_alias={{ {{}}: ({BIG}, {{}}, may-alias) }}"),
                 "HloModule: input_output_alias 9999"),
    "a donor": (module(header=f", buffer_donor={{ ({BIG}, {{}}) }}"), "HloModule: buffer_donor 9999"),
    "num_partitions": (module(header=f", num_partitions={BIG}"), "HloModule: num_partitions 9999"),
    "a slice": (module(root=f"ROOT r = f32[1] slice(p), slice={{[0:{BIG}]}}"), "r: slice 9999"),
    "contracting dims": (module("p = f32[2,2] parameter(0)", f"ROOT r = f32[2,2] dot(p, p), lhs_contracting_dims="
                                f"{{{BIG}}}, rhs_contracting_dims={{0}}"), "r: lhs_contracting_dims 9999"),
    "a sharding": (module(f"p = f32[2] parameter(0), sharding={{devices=[{BIG}]0}}"), "p: sharding 9999"),
    "a layout": (module(f"p = f32[2]{{{BIG}}} parameter(0)"), "layout 9999"),
}


def run(command: str, path: Path):
    args = [path, path.with_name("b_" + path.name)] if command == "diff" else [path]
    return hlo_audit_here(path.parent, command, *args)


def written(tmp_path: Path, text: str) -> Path:
    """The text, and beside it the same with its root changed (``diff`` compares them: a change to place)."""
    path = tmp_path / "m.hlo"
    path.write_text(text)
    (tmp_path / "b_m.hlo").write_text(text.replace("negate", "abs"))
    return path


def xla_reads(text: str) -> bool:
    try:
        hlo.hlo_module_from_text(text)
    except Exception:  # noqa: BLE001 (jaxlib's error type differs across versions)
        return False
    return True


@pytest.mark.parametrize("name", HOSTILE)
def test_a_number_past_xlas_bound_is_one_line_naming_file_line_and_what(tmp_path, name):
    text, what = HOSTILE[name]
    line = text[:text.index(BIG)].count("\n") + 1
    assert not xla_reads(text)
    path = written(tmp_path, text)
    for command in COMMANDS:
        result = run(command, path)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1 and "Traceback" not in result.stderr, (
            command, result.returncode, result.stderr[-2000:])
        assert lines[0].startswith(f"hlo-audit: error: {path}:{line}: ") and what in lines[0], (command, lines[0])


INT32_MAX = 2**31 - 1
AT_THE_BOUND = {
    "source_line": source_line,
    "stack_frame_id": stack_frame,
    "a debug table's line": lambda value: with_tables(line=value),
}


@pytest.mark.parametrize("name", AT_THE_BOUND)
def test_metadata_numbers_are_read_up_to_int32_as_xla_reads_them(tmp_path, name):
    make = AT_THE_BOUND[name]
    for value, valid in ((str(INT32_MAX), True), (str(INT32_MAX + 1), False), ("0" * 5000 + "7", True)):
        text = make(value)
        assert xla_reads(text) == valid, value[:20]
        path = written(tmp_path, text)
        for command in COMMANDS:
            result = run(command, path)
            assert "Traceback" not in result.stderr, (command, result.stderr[-2000:])
            # diff's 1 is its verdict (the roots differ), rng's none here: read, not refused.
            assert result.returncode == ((1 if command == "diff" else 0) if valid else 2), (
                command, value[:20], result.stderr[-500:])


def test_leading_zeros_xla_reads_are_read_with_its_counts(tmp_path):
    """A tuple index and a parameter number written with 5,000 leading zeros: XLA reads them (as 1 and 0), and
    hlo-audit reads the same module: its counts are XLA's."""
    zeros = "0" * 5000
    text = module(f"p = (f32[2], f32[3]) parameter({zeros}0)", f"ROOT r = f32[3] get-tuple-element(p), "
                  f"index={zeros}1")
    assert xla_reads(text)
    path = written(tmp_path, text)
    for command in COMMANDS:
        result = run(command, path)
        assert result.returncode == 0 and "Traceback" not in result.stderr, (command, result.stderr[-2000:])
    expected = xla_counts(text)
    counted = hlo_audit_here(tmp_path, "count", path, "--format", "json")
    got = json.loads(counted.stdout)["modules"][0]
    assert (got["entry_params"], got["by_dtype"]) == (expected["entry_params"], expected["by_dtype"])


def test_a_thunk_sequences_numbers_are_bounded_too():
    """A GPU dump's thunk sequence (``count``/``diff`` of a dump folder read it beside the module): its ids and launch
    dimensions go through the same bound, one line naming the file and line."""
    line = "000: kKernel fusion.1 grid: [2, 1, 1] threads: [128, 1, 1]"
    (thunk,) = parse_thunk_sequence(line, "seq.txt")
    assert (thunk.id, thunk.grid, thunk.threads) == (0, (2, 1, 1), (128, 1, 1))
    for hostile, what in ((f"{BIG}: kKernel fusion.1", "thunk id"),
                          (f"0: kKernel fusion.1 grid: [{BIG}, 1, 1] threads: [1, 1, 1]", "grid")):
        with pytest.raises(ThunkParseError) as error:
            parse_thunk_sequence("1: kKernel fusion.0\n" + hostile, "seq.txt")
        assert str(error.value).startswith(f"seq.txt:2: {what} 999999999999... (5,000 digits) is out of range")
