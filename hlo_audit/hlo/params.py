"""Entry parameters: what the host marshals into the jitted step on every call.

Each parameter gets a state path, a role and a group pattern. The path comes, best first, from jax's own
``args_info`` (when the tool lowered the function itself), from the ``op_name`` metadata that XLA dumps
carry (``state['model']['decoder']...['key'].value``), or from decoding the instruction name, which jax
derives from the same key string by replacing every character outside ``[A-Za-z0-9_]`` with ``_``.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from hlo_audit.hlo.shapes import Shape
from hlo_audit.hlo.text import HloModule, Instruction, strip_number_suffix

ROLES = ("rng_key", "rng_count", "weight", "optimizer_state", "step", "input", "other")

_KEYSTR_TOKEN = re.compile(r"\[\\?'([^'\\]*)\\?'\]|\[(\d+)\]|\.?([A-Za-z_][\w]*)")
_MANGLED_SEPARATOR = re.compile(r"_{3,}")
_LAYER_INDEX = re.compile(r"^(layers?|blocks?|h)_\d+$")
_FLOAT = re.compile(r"^(f|bf|c)\d")
_OPTIMIZER_WORDS = frozenset({"opt_state", "optimizer", "mu", "nu", "momentum", "trace", "inner_state"})
_STATE_ROOTS = frozenset({"state", "params", "model", "train_state", "variables"})
DUPLICATE_PATH = re.compile(r"-\d+$")  # canonical text's second parameter of one path: `<path>-<number>`


@dataclass(frozen=True, slots=True)
class EntryParam:
    index: int
    name: str
    shape: Shape
    sharding: str | None
    path: str
    role: str
    pattern: str  # path with layer indices collapsed; RNG streams folded to `<owner>.rngs.*`

    @property
    def dtype(self) -> str:
        return self.shape.dtype or "tuple"

    @property
    def bytes(self) -> int:
        return self.shape.bytes

    @property
    def is_rng(self) -> bool:
        return self.role in ("rng_key", "rng_count")

    def to_record(self) -> dict:
        """What results and the cache keep of a parameter (``count --params`` adds name, layout, sharding)."""
        return {"index": self.index, "path": self.path, "role": self.role, "dtype": self.dtype,
                "dims": list(self.shape.dims), "bytes": self.bytes, "pattern": self.pattern}


def path_from_keystr(keystr: str) -> str | None:
    """``state['model']['layers_0']['rngs']['key'].value`` -> ``state.model.layers_0.rngs.key``."""
    keystr = keystr.replace("\\'", "'")
    parts: list[str] = []
    pos = 0
    while pos < len(keystr):
        m = _KEYSTR_TOKEN.match(keystr, pos)
        if not m or m.end() == pos:
            return None
        parts.append(next(g for g in m.groups() if g is not None))
        pos = m.end()
    if parts and parts[-1] == "value" and len(parts) > 1:
        parts.pop()  # NNX Variable's .value is not part of the state path
    return ".".join(parts) if parts else None


def path_from_mangled_name(name: str) -> str:
    """Invert jax's name mangling as far as it can be inverted.

    jax replaces every character of the key string outside ``[A-Za-z0-9_]`` with ``_``, so
    ``state['model']['to_nnx__rngs']['key'].value`` arrives as ``state__model____to_nnx__rngs____key___value``:
    ``']['`` is ``____``, ``'][`` and ``]['`` and ``'].`` are ``___``, and only the first ``['`` is a two-
    underscore separator, which is why names that contain ``__`` themselves (``to_nnx__rngs``) survive.
    """
    base = strip_number_suffix(name)
    components = [c for c in _MANGLED_SEPARATOR.split(base) if c]
    if not components:
        return base
    head, sep, first_key = components[0].partition("__")
    parts = [head] + ([first_key] if sep and first_key else []) + components[1:]
    parts[-1] = parts[-1].removesuffix("__")
    if len(parts) > 1 and parts[-1] == "value":
        parts.pop()  # NNX Variable's .value
    return ".".join(parts)


def collapse_layers(path: str) -> str:
    """``decoder.layers_3.mlp`` -> ``decoder.layers_*.mlp``; also integer indices after a layer list."""
    parts = path.split(".")
    out = []
    for i, part in enumerate(parts):
        m = _LAYER_INDEX.match(part)
        if m:
            out.append(f"{m.group(1)}_*")
        elif part.isdigit() and i > 0 and _LAYER_INDEX.match(parts[i - 1] + "_0"):
            out.append("*")
        else:
            out.append(part)
    return ".".join(out)


def _rng_owner(parts: list[str]) -> int | None:
    """Index of the component that holds an Rngs object (``rngs``, ``to_nnx__rngs``...), if any."""
    for i, part in enumerate(parts):
        if part == "rngs" or part.endswith("_rngs"):  # also `to_nnx__rngs`
            return i
    return None


def classify(path: str, shape: Shape) -> str:
    parts = path.split(".")
    last = parts[-1]
    owner = _rng_owner(parts)
    if owner is not None and last in ("key", "count") and shape.dtype == "u32":
        return "rng_key" if last == "key" else "rng_count"
    if last == "step" and len(shape.dims) == 0:
        return "step"
    if any(p in _OPTIMIZER_WORDS for p in parts):
        return "optimizer_state"
    if parts[0] in _STATE_ROOTS:
        if shape.dtype and _FLOAT.match(shape.dtype) or last == "qvalue":  # qvalue: AQT's integer-quantized kernel
            return "weight"
        return "other"
    return "input"


def group_pattern(path: str) -> str:
    """The group an entry parameter is counted under.

    RNG state folds to its owner (``...to_nnx__rngs.*``): what matters is which module holds an Rngs,
    not the stream and key/count under it.
    """
    parts = collapse_layers(path).split(".")
    owner = _rng_owner(parts)
    if owner is not None and parts[-1] in ("key", "count"):
        return ".".join(parts[: owner + 1] + ["*"])
    return ".".join(parts)


def _param_path(instr: Instruction, named_by_path: bool) -> str:
    if named_by_path:  # canonical text: the name is the path (a second one of a path: `<path>-<number>`)
        return DUPLICATE_PATH.sub("", instr.name)
    return (instr.op_name and path_from_keystr(instr.op_name)) or path_from_mangled_name(instr.name)


def entry_params(module: HloModule, arg_keys: Sequence[Sequence[str]] | None = None) -> list[EntryParam]:
    """The entry computation's parameters in order, each with path, role and pattern.

    ``arg_keys`` (from jax's args_info: the pytree keys below the argument, one entry per kept argument)
    give the exact path below the argument's name when there is one per parameter.
    """
    params = module.entry.parameters
    use_args = arg_keys is not None and len(arg_keys) == len(params)
    result = []
    for i, instr in enumerate(params):
        path = _param_path(instr, module.params_named_by_path)
        if use_args:
            path = ".".join([path.split(".", 1)[0], *arg_keys[i]])
        result.append(EntryParam(
            index=instr.parameter_number, name=instr.name, shape=instr.shape,
            sharding=instr.attrs.get("sharding"), path=path, role=classify(path, instr.shape),
            pattern=group_pattern(path),
        ))
    return result


@dataclass(frozen=True)
class ParamSummary:
    """Counts of one module's entry parameters, the numbers `count` reports."""

    entry_params: int
    by_dtype: dict[str, int]
    by_role: dict[str, int]
    groups: dict[str, int]
    bytes_by_role: dict[str, int]

    @classmethod
    def of(cls, params: Sequence[EntryParam]) -> "ParamSummary":
        bytes_by_role: Counter[str] = Counter()
        for p in params:
            bytes_by_role[p.role] += p.bytes
        return cls(
            entry_params=len(params),
            by_dtype=_sorted_counts(Counter(p.dtype for p in params)),
            by_role=_sorted_counts(Counter(p.role for p in params)),
            groups=_sorted_counts(Counter(p.pattern for p in params)),
            bytes_by_role=dict(sorted(bytes_by_role.items())),
        )

    @property
    def rng_params(self) -> int:
        return self.by_role.get("rng_key", 0) + self.by_role.get("rng_count", 0)


def _sorted_counts(counter: Counter[str]) -> dict[str, int]:
    """Largest first, then by name: stable across runs and readable."""
    return dict(sorted(counter.items(), key=lambda kv: (-kv[1], kv[0])))
