"""Constants in a module, and the state a step captured as constants.

Entry parameters are what the host marshals into a step on every call. A step can also hold state without
taking it: an array its jitted function closes over is staged into the program as a constant (a literal, or
a broadcast of one scalar when every element is equal). Counting entry parameters alone calls such a step
small. MaxEngine's decode steps are the case in point: in AQT serve mode they capture the quantized weights
(9 entry parameters instead of 23 at prefill, with 417 MiB baked in), and in every mode their RNG keys are
literals, which never advance.

Three views of one module:

* every ``constant`` instruction, counted with its bytes by dtype;
* *large* constants, the size of model state: literals, and broadcasts of a scalar constant, of at least
  ``LARGE_CONSTANT_BYTES``, wherever jax staged them (the entry computation, or the loop body of a scan
  that reads them). A scalar broadcast that only feeds elementwise arithmetic or a buffer the step writes
  into is the step's own computation (Adam's hyperparameters, a zero-filled gradient, a scan's accumulator,
  the shifts of random bits) and is left out, also where an optimized module fused that use into a kernel. So
  is what XLA itself makes of a program: a broadcast or constant inside a fused computation is computed in
  its kernel, never held (a TPU v5e compile of a 16-layer decoder holds dozens of bf16 broadcasts of 0 and 1
  there, measured 2026-12-05), and a literal printed with one value throughout is a splat, not weights. This is
  the view of an HLO file, and a heuristic;
* *captured* arrays, exact, when the tool lowered the step itself: the jaxpr's constants that survive jit's
  dead-code elimination, with the state path of each (``hlo_audit.capture``). Equal placeholder arrays (a
  freshly initialized model's zero weights) may share one HLO constant, so the two views can count
  differently; a captured array is one the step reads, whatever its values.

RNG keys that are literals reaching random-bit generation are found in the module itself
(``rng_flow.literal_keys``), so an HLO file shows them too.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from hlo_audit.hlo.params import classify, group_pattern
from hlo_audit.hlo.rng_flow import literal_keys
from hlo_audit.hlo.shapes import Shape
from hlo_audit.hlo.text import Computation, HloModule, Instruction

LARGE_CONSTANT_BYTES = 1 << 20  # a layer's weights in any real model are megabytes
# A scalar broadcast is computation, not state, when all it feeds is elementwise arithmetic (jax broadcasts a
# scalar operand to its partner's shape: an optimizer's hyperparameters, epsilons) or a buffer the step fills in.
_COMPUTING_USERS = frozenset({
    "add", "subtract", "multiply", "divide", "maximum", "minimum", "power", "remainder", "atan2", "compare",
    "select", "clamp", "and", "or", "xor", "shift-left", "shift-right-logical", "shift-right-arithmetic",
    "scatter", "dynamic-update-slice", "pad",
})


@dataclass(frozen=True)
class CapturedArray:
    """One array a step closes over, as the HLO holds it (a typed PRNG key as its ``u32`` data)."""

    path: str | None  # state path in a tree the target named (model.decoder.layers_0...qvalue); None if none holds it
    dtype: str  # HLO dtype name: s8, bf16, u32...
    dims: tuple[int, ...]

    @property
    def shape(self) -> Shape:
        return Shape(text=f"{self.dtype}[{','.join(map(str, self.dims))}]", dtype=self.dtype, dims=self.dims)

    @property
    def bytes(self) -> int:
        return self.shape.bytes

    @property
    def role(self) -> str:
        """The role it would have as an entry parameter (rng_key, weight...); ``other`` without a path."""
        return classify(self.path, self.shape) if self.path else "other"

    @property
    def pattern(self) -> str:
        return group_pattern(self.path) if self.path else "<unnamed>"

    def to_record(self) -> dict:
        return {"path": self.path, "dtype": self.dtype, "dims": list(self.dims), "bytes": self.bytes,
                "role": self.role, "pattern": self.pattern}

    @classmethod
    def from_record(cls, record: dict) -> "CapturedArray":
        return cls(path=record["path"], dtype=record["dtype"], dims=tuple(record["dims"]))


@dataclass(frozen=True)
class LargeConstant:
    """A constant the size of model state: a literal, or a broadcast of one scalar constant."""

    name: str
    form: str  # "literal" | "broadcast"
    shape: Shape
    value: str  # the broadcast scalar's literal; "" for a literal (printed elided when large)
    paths: tuple[str, ...] = ()  # captured arrays of this dtype and shape, when known

    def to_record(self) -> dict:
        return {"name": self.name, "form": self.form, "dtype": self.shape.dtype, "dims": list(self.shape.dims),
                "bytes": self.shape.bytes, "value": self.value, "paths": list(self.paths)}


@dataclass(frozen=True)
class ConstantReport:
    by_dtype: dict[str, tuple[int, int]]  # every constant instruction: dtype -> (count, bytes)
    large: list[LargeConstant]
    literal_keys: list[dict]  # rng_flow.literal_keys records: name, dims, site
    captured: tuple[CapturedArray, ...] | None = None  # None: not known (an HLO file)

    @property
    def constants(self) -> int:
        return sum(n for n, _ in self.by_dtype.values())

    @property
    def constant_bytes(self) -> int:
        return sum(b for _, b in self.by_dtype.values())

    def to_record(self, with_arrays: bool = True) -> dict:
        """What results, the cache and JSON keep; ``captured`` is null when unknown."""
        record = {
            "constants": self.constants, "constant_bytes": self.constant_bytes,
            "by_dtype": {k: {"count": n, "bytes": b} for k, (n, b) in self.by_dtype.items()},
            "large": [c.to_record() for c in self.large],
            "large_bytes": sum(c.shape.bytes for c in self.large),
            "literal_keys": list(self.literal_keys),
            "captured": None if self.captured is None else captured_summary(self.captured),
        }
        if with_arrays and self.captured is not None:
            record["captured"]["arrays_list"] = [a.to_record() for a in self.captured]
        return record


def captured_summary(arrays: Sequence[CapturedArray]) -> dict:
    """Counts and bytes of captured arrays, overall, by dtype, by role and by path pattern (what the gate ratchets)."""
    by_dtype: dict[str, int] = {}
    bytes_by_dtype: dict[str, int] = {}
    by_role: dict[str, int] = {}
    groups: dict[str, int] = {}
    for a in arrays:
        by_dtype[a.dtype] = by_dtype.get(a.dtype, 0) + 1
        bytes_by_dtype[a.dtype] = bytes_by_dtype.get(a.dtype, 0) + a.bytes
        by_role[a.role] = by_role.get(a.role, 0) + 1
        groups[a.pattern] = groups.get(a.pattern, 0) + 1
    return {"arrays": len(arrays), "bytes": sum(bytes_by_dtype.values()), "by_dtype": _largest_first(by_dtype),
            "bytes_by_dtype": dict(sorted(bytes_by_dtype.items())), "by_role": _largest_first(by_role),
            "groups": _largest_first(groups)}


def _largest_first(counts: dict[str, int]) -> dict[str, int]:
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def constant_report(module: HloModule, captured: Sequence[CapturedArray] | None = None) -> ConstantReport:
    """Every constant of ``module``, its large ones, its literal RNG keys and (when known) what the step captured."""
    by_dtype: dict[str, tuple[int, int]] = {}
    for instr in module.instructions():
        if instr.opcode == "constant":
            dtype = instr.shape.dtype or "tuple"
            n, size = by_dtype.get(dtype, (0, 0))
            by_dtype[dtype] = (n + 1, size + instr.shape.bytes)
    return ConstantReport(
        by_dtype=dict(sorted(by_dtype.items(), key=lambda kv: (-kv[1][1], kv[0]))),
        large=large_constants(module, captured or ()), literal_keys=literal_keys(module),
        captured=None if captured is None else tuple(captured))


def large_constants(module: HloModule, captured: Sequence[CapturedArray] = ()) -> list[LargeConstant]:
    """Literals and scalar broadcasts of at least LARGE_CONSTANT_BYTES anywhere in the module, largest first."""
    by_shape: dict[tuple[str, tuple[int, ...]], list[str]] = {}
    for a in captured:
        if a.path:
            by_shape.setdefault((a.dtype, a.dims), []).append(a.path)
    found = []
    users = _UsersIndex()
    fused = _fused_computations(module)
    for comp in module.computations.values():
        if comp.name in fused:  # a fusion's kernel computes what its computation holds
            continue
        for instr in comp.instructions:
            if instr.opcode not in ("constant", "broadcast") or instr.shape.bytes < LARGE_CONSTANT_BYTES:
                continue
            if instr.opcode == "constant":
                if _one_value(instr.literal):
                    continue
                form, value = "literal", ""
            elif len(instr.operands) == 1:
                source = comp.by_name[instr.operands[0]]
                if source.opcode != "constant" or source.shape.dims or _computes(instr, comp, module, users):
                    continue
                form, value = "broadcast", source.literal
            else:
                continue
            paths = tuple(by_shape.get((instr.shape.dtype, instr.shape.dims), ()))
            found.append(LargeConstant(instr.name, form, instr.shape, value, paths))
    return sorted(found, key=lambda c: (-c.shape.bytes, c.name))


def _fused_computations(module: HloModule) -> frozenset[str]:
    """The computations fusions call: XLA's kernels, made by its optimizations, not staged by jax."""
    return frozenset(c for instr in module.instructions() if instr.opcode == "fusion"
                     for c in instr.called_computations())


_LITERAL_ELEMENT = re.compile(r"[^\s{}(),]+")


def _one_value(literal: str) -> bool:
    """Whether a literal printed in full holds one value throughout (a splat); an elided one (``{...}``) says not."""
    elements = _LITERAL_ELEMENT.findall(literal)
    return len(elements) > 1 and "..." not in elements and len(set(elements)) == 1


class _UsersIndex:
    """Each instruction's users, indexed per computation the first time one of its instructions is asked about:
    the parser keeps no users lists (nothing else needs them), and only computations with a large broadcast ask."""

    def __init__(self):
        self._by_computation: dict[str, dict[str, list[Instruction]]] = {}

    def __call__(self, comp: Computation, name: str) -> list[Instruction]:
        index = self._by_computation.get(comp.name)
        if index is None:
            index = self._by_computation[comp.name] = {}
            for instr in comp.instructions:
                for operand in dict.fromkeys(instr.operands):
                    index.setdefault(operand, []).append(instr)
        return index.get(name, [])


def _computes(broadcast: Instruction, comp: Computation, module: HloModule, users: _UsersIndex) -> bool:
    of_broadcast = users(comp, broadcast.name)
    return bool(of_broadcast) and all(
        u.opcode in _COMPUTING_USERS or _filled_by_loop(broadcast, u, comp, module, users)
        or _computed_in_fusion(broadcast, u, module, users) for u in of_broadcast)


def _computed_in_fusion(value: Instruction, fusion: Instruction, module: HloModule, users: _UsersIndex) -> bool:
    """``value`` reaches a fusion whose kernel only computes with it (an optimized module's zero-filled gradient
    read by a scatter fusion): the parameters it becomes inside have computing users alone."""
    if fusion.opcode != "fusion":
        return False
    fused = module.computations.get(fusion.attrs.get("calls", "").strip().lstrip("%"))
    if fused is None:
        return False
    numbers = {i for i, ref in enumerate(fusion.operands) if ref == value.name}
    inside = [p for p in fused.parameters if p.parameter_number in numbers]
    return bool(inside) and all(
        users(fused, p.name) and all(u.opcode in _COMPUTING_USERS for u in users(fused, p.name)) for p in inside)


def _filled_by_loop(value: Instruction, tup: Instruction, comp: Computation, module: HloModule,
                    users: _UsersIndex) -> bool:
    """``value`` starts a while loop's state that the loop writes: an accumulator (a scanned train step's
    zero-filled gradients), not a constant it reads. An element the body hands back unchanged is read only."""
    loops = users(comp, tup.name) if tup.opcode == "tuple" else []
    if not loops or any(loop.opcode != "while" for loop in loops):
        return False
    indices = [i for i, ref in enumerate(tup.operands) if ref == value.name]
    for loop in loops:
        body = module.computations[loop.attrs["body"].strip().lstrip("%")]
        if body.root.opcode != "tuple":
            return False
        for i in indices:
            out = body.by_name[body.root.operands[i]]
            if out.opcode == "get-tuple-element" and out.attrs.get("index") == str(i) and \
                    body.by_name[out.operands[0]].opcode == "parameter":
                return False
    return True


# ---------------------------------------------------------------------------------------------------------
# What goldens keep (and the gate and diff compare), and the RNG finding: all from ConstantReport records
# ---------------------------------------------------------------------------------------------------------


# The frontend attribute a large constant's literal digest is kept under in the canonical text.
LITERAL_DIGEST_KEY = "literal_sha256"


# The digest's hex digits in the attribute, behind the algorithm's name the stages write (``"sha256:2f3f..."``).
_LITERAL_DIGEST = re.compile(LITERAL_DIGEST_KEY + r'="?(?:[a-z0-9]+:)?([0-9a-fA-F]+)')


def literal_digest(instr: Instruction) -> str:
    """The digest ``add_literal_digests`` gave a constant (its hex digits), or "" where it has none."""
    m = _LITERAL_DIGEST.search(instr.attrs.get("frontend_attributes", ""))
    return m.group(1) if m else ""


def add_literal_digests(module: HloModule, digests: Sequence[tuple[str, str, str]]) -> None:
    """Give each named constant ``(computation, instruction, digest)`` its literal's digest as a frontend
    attribute, so the canonical text of a constant printed as ``{...}`` still changes when its values do (a 16x16
    Hadamard matrix, an RNG key baked in). XLA's parser reads the attribute back; normalization keeps it."""
    for computation, name, digest in digests:
        comp = module.computations.get(computation)
        instr = comp.by_name.get(name) if comp is not None else None
        if instr is None or instr.opcode != "constant":
            continue
        entry = f'{LITERAL_DIGEST_KEY}="{digest}"'
        existing = instr.attrs.get("frontend_attributes", "").strip()
        if LITERAL_DIGEST_KEY in existing:
            continue  # a canonical text read back already has it
        attribute = f"{{{existing[1:-1]},{entry}}}" if len(existing) > 2 else f"{{{entry}}}"
        instr.attrs = {**instr.attrs, "frontend_attributes": attribute}  # the parser shares equal attribute dicts


def golden_summary(record: dict) -> dict:
    """A result's constants record as a golden keeps it: captured arrays by dtype, role and pattern (no list),
    large constants and their bytes by dtype, and the number of literal RNG keys."""
    large: dict[str, int] = {}
    large_bytes: dict[str, int] = {}
    for c in record["large"]:
        large[c["dtype"]] = large.get(c["dtype"], 0) + 1
        large_bytes[c["dtype"]] = large_bytes.get(c["dtype"], 0) + c["bytes"]
    captured = record["captured"]
    return {"captured": None if captured is None else {k: v for k, v in captured.items() if k != "arrays_list"},
            "large": {"by_dtype": dict(sorted(large.items())), "bytes_by_dtype": dict(sorted(large_bytes.items()))},
            "literal_keys": frozen_rng(record)["literal_keys"]}


def frozen_rng(record: dict) -> dict:
    """RNG state written into the program: keys that are literals (a literal key never advances: every call draws
    the same bits), how many of them feed an output (``used``; the rest only feed random bits no output reads),
    and, when known, the captured RNG streams by pattern."""
    keys = record["literal_keys"]
    streams: dict[str, int] = {}
    for a in (record.get("captured") or {}).get("arrays_list", []):
        if a["role"] == "rng_key":
            streams[a["pattern"]] = streams.get(a["pattern"], 0) + _leading(a["dims"])
    return {"literal_keys": sum(_leading(k["dims"]) for k in keys), "literal_key_constants": len(keys),
            "used": sum(_leading(k["dims"]) for k in keys if k["used"]),
            "sites": sorted({k["site"] for k in keys}), "captured_streams": _largest_first(streams)}


def _leading(dims: Sequence[int]) -> int:
    """Keys in a raw key array: its elements over the key's own last dimension (a scanned model stacks layers)."""
    n = 1
    for d in dims[:-1]:
        n *= d
    return n
