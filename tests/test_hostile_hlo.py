"""Deep HLO through the real CLI: tuple shapes, operand chains, nested operands, call chains, inline bodies.

Each input is valid HLO of one kind of depth. Where XLA's parser (jaxlib) reads it, ``hlo-audit count/diff/rng/explain``
must read it too, with XLA's counts; past what XLA's own parser reads (500 levels of nesting: HloParserOptions'
kDefaultMaxRecursionDepth; jaxlib 0.12.0.1 has no limit and crashes further on), one line naming the line and exit 2.
Never a traceback: the parser and every walk over the module (normalize, rng, diff, constants) use explicit stacks.
Measured with jaxlib 0.12.0.1: it reads 7000 nested tuples (SIGSEGV at 8000), 1000 nested operands (SIGSEGV at 1100),
1000 nested inline computations (SIGSEGV at 1500), and call chains of any length (20000 tried).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from in_process import Ran, hlo_audit_here
from xla_oracle import xla_counts

ROOT = Path(__file__).resolve().parents[1]
CLI = Path(sys.executable).with_name("hlo-audit")  # the 60 MB line runs the console script under a shell's ulimit
COMMANDS = ("count", "diff", "rng", "explain")


def tuple_shape(depth: int, leaf: str = "f32[2]") -> str:
    return "(" * depth + leaf + ")" * depth


def deep_tuple(depth: int) -> str:
    """A parameter whose shape is a tuple nested ``depth`` deep, and a root that hands it back with a key."""
    return (f"HloModule m\nENTRY e {{\n  p = {tuple_shape(depth)} parameter(0)\n  k = u32[2] parameter(1)\n"
            f"  ROOT t = ({tuple_shape(depth - 1)}, u32[2]) tuple(p, k)\n}}\n")


def operand_chain(length: int) -> str:
    """``length`` instructions, each using the one before (flat text, as every real module is)."""
    lines = ["  v0 = f32[] parameter(0)", "  k = u32[2] parameter(1)"]
    lines += [f"  v{i} = f32[] negate(v{i - 1})" for i in range(1, length)]
    lines.append(f"  ROOT r = (f32[], u32[2]) tuple(v{length - 1}, k)")
    return "HloModule m\nENTRY e {\n" + "\n".join(lines) + "\n}\n"


def nested_operands(depth: int) -> str:
    """``negate(negate(...(x)))`` written as one nested expression ``depth`` deep."""
    expression = "x"
    for _ in range(depth):
        expression = f"f32[] negate({expression})"
    return f"HloModule m\nENTRY e {{\n  x = f32[] parameter(0)\n  ROOT r = f32[] negate({expression})\n}}\n"


# An NNX stream's state as jax names its entry parameters (state['rngs']['default']['key'].value).
KEY, COUNT = "state__rngs____default____key___value", "state__rngs____default____count___value"


def call_chain(length: int) -> str:
    """Computation i calls computation i-1, the first draws random bits from the key it is passed; the entry
    passes an NNX stream's key down the chain and increments its count."""
    comps = [("comp0 {\n  p = u32[2] parameter(0)\n"
              "  ROOT r = (u32[2], u32[4]) rng-bit-generator(p), algorithm=rng_default\n}")]
    comps += [f"comp{i} {{\n  p = u32[2] parameter(0)\n  ROOT r = (u32[2], u32[4]) call(p), to_apply=comp{i - 1}\n}}"
              for i in range(1, length)]
    comps.append(f"ENTRY e {{\n  {KEY} = u32[2] parameter(0)\n  {COUNT} = u32[] parameter(1)\n"
                 f"  one = u32[] constant(1)\n  next = u32[] add({COUNT}, one)\n"
                 f"  c = (u32[2], u32[4]) call({KEY}), to_apply=comp{length - 1}\n"
                 "  bits = u32[4] get-tuple-element(c), index=1\n  ROOT t = (u32[4], u32[]) tuple(bits, next)\n}")
    return "HloModule m\n" + "\n".join(comps) + "\n"


def while_chain(length: int) -> str:
    """Loops in loops: body i is a while loop over body i-1, the state carrying a counter and a key."""
    comps = [("cond0 {\n  p = (s32[], u32[2]) parameter(0)\n  i = s32[] get-tuple-element(p), index=0\n"
              "  c = s32[] constant(3)\n  ROOT lt = pred[] compare(i, c), direction=LT\n}"),
             ("body0 {\n  p = (s32[], u32[2]) parameter(0)\n  i = s32[] get-tuple-element(p), index=0\n"
              "  one = s32[] constant(1)\n  j = s32[] add(i, one)\n  k = u32[2] get-tuple-element(p), index=1\n"
              "  ROOT t = (s32[], u32[2]) tuple(j, k)\n}")]
    comps += [f"body{i} {{\n  p = (s32[], u32[2]) parameter(0)\n"
              f"  ROOT w = (s32[], u32[2]) while(p), condition=cond0, body=body{i - 1}\n}}" for i in range(1, length)]
    comps.append(f"ENTRY e {{\n  p = (s32[], u32[2]) parameter(0)\n"
                 f"  ROOT w = (s32[], u32[2]) while(p), condition=cond0, body=body{length - 1}\n}}")
    return "HloModule m\n" + "\n".join(comps) + "\n"


def inline_bodies(depth: int) -> str:
    """``to_apply={ ... call(p), to_apply={ ... } }`` nested ``depth`` deep, every level naming its root alike."""
    body = "{ p = f32[] parameter(0)\n ROOT r = f32[] negate(p) }"
    for _ in range(depth):
        body = "{ p = f32[] parameter(0)\n ROOT r = f32[] call(p), to_apply=" + body + " }"
    return f"HloModule m\nENTRY e {{\n  p = f32[] parameter(0)\n  ROOT r = f32[] call(p), to_apply={body}\n}}\n"


def hlo_audit(*args: str) -> Ran:
    """The CLI in this process (tests/in_process.py), below pytest's own frames: a walk that recursed would hit
    Python's limit sooner here than in a process of its own. (The console script: tests/test_cli.py.)"""
    return hlo_audit_here(ROOT, *args)


def run_command(command: str, path: Path) -> Ran:
    args = [str(path), str(path)] if command == "diff" else [str(path)]
    if command == "count":
        args += ["--format", "json"]
    return hlo_audit(command, *args)


# Valid inputs XLA's parser reads: every command works, and count gives XLA's numbers.
READ = {
    "tuple shapes 300 deep": (deep_tuple, 300),
    "tuple shapes 499 deep": (deep_tuple, 499),
    "an operand chain 500 long": (operand_chain, 500),
    "an operand chain 20000 long": (operand_chain, 20000),
    "operands nested 400 deep": (nested_operands, 400),
    "computations calling 1000 deep": (call_chain, 1000),
    # rng's key-hazard analysis reaches a nested loop on each of the outer loop's passes: it ends here only
    # because it evaluates a loop once per initial state (hlo/rng_keys.py, _Keys.while_loop).
    "while loops nested 300 deep": (while_chain, 300),
    "inline computations nested 300 deep": (inline_bodies, 300),
}
# Past 500 levels of nesting: XLA's parser refuses them (and jaxlib's crashes not much further on).
REFUSED = {
    "tuple shapes 501 deep": (deep_tuple, 502, 3, "shape nested deeper than 500 levels"),
    "operands nested 600 deep": (nested_operands, 600, 4, "operands nested deeper than 500 levels"),
    "inline computations nested 600 deep": (inline_bodies, 600, 504, "inline computations nested deeper than 500"),
}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("deep")
    paths = {}
    for name, (make, depth, *_) in {**READ, **REFUSED}.items():
        paths[name] = folder / (name.replace(" ", "_") + ".hlo")
        paths[name].write_text(make(depth))
    return paths


@pytest.mark.parametrize("name", READ)
def test_deep_valid_hlo_is_read_by_every_command(inputs, name):
    path = inputs[name]
    expected = xla_counts(path.read_text())
    for command in COMMANDS:
        proc = run_command(command, path)
        assert "Traceback" not in proc.stderr, (command, proc.stderr[-2000:])
        # rng's exit 1 is its verdict (dead RNG state: a key-shaped u32[2] the module carries through unread, issue
        # 39), not a failure to read.
        assert proc.returncode == 0 or command == "rng" and proc.returncode == 1, (command, proc.stderr[-2000:])
        if command == "count":
            module = json.loads(proc.stdout)["modules"][0]
            assert (module["entry_params"], module["by_dtype"]) == (expected["entry_params"], expected["by_dtype"])


@pytest.mark.parametrize("name", REFUSED)
def test_nesting_past_xlas_limit_is_one_line_naming_the_line(inputs, name):
    path = inputs[name]
    _, _, line, message = REFUSED[name]
    for command in COMMANDS:
        proc = run_command(command, path)
        assert "Traceback" not in proc.stderr
        assert proc.returncode == 2, (command, proc.stderr[-2000:])
        error = proc.stderr.strip()
        assert "\n" not in error and f"{path}:{line}: " in error and message in error, error


def test_rng_follows_a_key_through_a_long_call_chain(inputs):
    """The RNG dataflow defers runs nested 64 deep and comes back to them: the key passed down 1000 calls is
    drawn at the bottom, as in a 3-call chain, and the count's one increment is counted."""
    deep = hlo_audit("rng", str(inputs["computations calling 1000 deep"]), "--format", "json")
    assert deep.returncode == 0, deep.stderr[-2000:]
    shallow_path = inputs["computations calling 1000 deep"].with_name("chain3.hlo")
    shallow_path.write_text(call_chain(3))
    shallow = hlo_audit("rng", str(shallow_path), "--format", "json")
    deep_doc, shallow_doc = json.loads(deep.stdout), json.loads(shallow.stdout)
    assert (deep_doc["streams"], deep_doc["drawn"], deep_doc["carried"]) == (1, 1, 0)
    deep_doc.pop("source"), shallow_doc.pop("source")
    assert deep_doc == shallow_doc


# A generated op_name 60 MB long (issue 27: 10 MB of it took 1.7 GB and 17 s, 60 MB under a 4 GB limit was a
# MemoryError traceback from the attribute regex), on the one-line fast path, and 20 MB more on the general parser's
# (a comment in the attribute list declines the fast path), with escaped quotes in the strings.
LONG_LINE_BYTES = 60_000_000


def long_attribute_module(size: int) -> str:
    piece = 'jit(train_step)/decoder/layers_0/mlp/wi_0/dot_general[\\"x\\"]/'
    name, general = piece * max(1, size // len(piece)), piece * max(1, size // 3 // len(piece))
    return (f"HloModule m\nENTRY e {{\n  p = f32[2] parameter(0), metadata={{op_name=\"{name}\"}}\n"
            f"  q = f32[2] parameter(1), /* why */ metadata={{op_name=\"{general}\" source_line=1}}\n"
            f"  ROOT r = f32[2] add(p, q), metadata={{op_name=\"add\"}}\n}}\n")


def peak_rss(*args: str, limit: int = 4 << 30) -> tuple[int, str, int]:
    """(exit code, stdout, peak resident bytes) of ``hlo-audit ARGS`` run under an address-space limit (set by the
    shell, as a user's ``ulimit -v`` does: no fork of this process, which may hold jax's threads)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = ["bash", "-c", f'ulimit -v {limit >> 10} && exec "$0" "$@"', str(CLI), *args]
    with open(os.devnull, "wb") as sink, subprocess.Popen(command, stdout=subprocess.PIPE, stderr=sink,
                                                          env=env) as proc:
        out = proc.stdout.read().decode()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, out, usage.ru_maxrss * 1024


def test_a_60_mb_attribute_line_reads_in_a_small_multiple_of_its_size(tmp_path):
    path, small = tmp_path / "long.hlo", tmp_path / "small.hlo"
    path.write_text(long_attribute_module(LONG_LINE_BYTES))
    small.write_text(long_attribute_module(0))
    code, out, peak = peak_rss("count", str(path), "--format", "json")
    assert code == 0, out
    module = json.loads(out)["modules"][0]
    assert (module["entry_params"], module["by_dtype"]) == (2, {"f32": 2})
    _, _, baseline = peak_rss("count", str(small), "--format", "json")
    size = path.stat().st_size
    assert peak - baseline <= 4 * size, f"{(peak - baseline) / size:.1f}x the file's {size:,} bytes"
