"""The stock NNX target's description of a model, as a config gives it: read and checked without importing jax.

``target = "nnx"`` audits a Flax NNX model library's model with no Python: the ``[nnx]`` table says how to build
the model (a factory, optionally a config object and the field that sets the depth), how to call it (the batch:
each argument's dtype and shape from the cell's batch and seq), the loss and the optax optimizer. The config
validates this module's reading of it at load time, so a mistake is one line naming the file and the key; what
only an import can tell (does ``pkg.mod:Factory`` exist, does its config have a ``num_layers`` field) is checked
when a command plans its cells (``targets.nnx.resolve``).

The spec of one model is a plain JSON object (``ModelSpec.to_json``): it travels inside the cell (its overrides,
under ``SPEC_KEY``), so a worker process lowers from the cell alone and every part of the description, and the
source digest of the library the plan adds, is part of the cell's cache key.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

TARGET = "nnx"
# The cell's overrides entry holding the model's spec (JSON): not a name a config's own overrides may use.
SPEC_KEY = "nnx:spec"

# What a model's table (and the shared [nnx] table, and a variant's [nnx.quant.NAME]) may set.
MODEL_KEYS = ("model", "config", "config_args", "fields", "args", "layers", "scan", "rngs", "rng_streams", "inputs",
              "labels", "output", "loss", "optimizer", "learning_rate", "optimizer_args", "full_depth")
# Tables merged key by key when a model's table or a variant sets them over the shared ones; every other key is
# replaced whole (``inputs`` too: a call's arguments are one list).
MERGED_KEYS = ("config_args", "fields", "args", "optimizer_args")
LOSSES = ("cross_entropy", "mean_square")
DEFAULT_OPTIMIZER = "adamw"
DEFAULT_LEARNING_RATE = 1e-4
# jax.numpy's dtype names an argument may have.
DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "bfloat16",
          "float32", "float64")
INTEGER_DTYPES = frozenset(d for d in DTYPES if "int" in d)
# A dimension of an argument: an integer, or the cell's batch or seq.
DIM_NAMES = ("batch", "seq")
# `package.module:attribute.path`: where a factory, a config callable lives.
_CALLABLE_PATH = re.compile(r"^[A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*$")
_IDENTIFIER = re.compile(r"^[A-Za-z_]\w*$")
_ARRAY = re.compile(r"^\s*([a-z0-9]+)\s*\[([^\]]*)\]\s*$")


class SpecError(ValueError):
    """A mistake in the [nnx] table: ``key`` (dotted, from the table's root) and what is wrong with it."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key


@dataclass(frozen=True)
class Array:
    """One array argument of the model's call: ``int32[batch,seq]``."""

    dtype: str
    dims: tuple[int | str, ...]

    def shape(self, batch: int, seq: int) -> tuple[int, ...]:
        sizes = {"batch": batch, "seq": seq}
        return tuple(sizes[d] if isinstance(d, str) else d for d in self.dims)

    @property
    def text(self) -> str:
        return f"{self.dtype}[{','.join(map(str, self.dims))}]"


@dataclass(frozen=True)
class Constant:
    """An argument passed as a Python value, not traced: ``"none"`` (None) or ``{value = true}``."""

    value: object


def parse_input(value, key: str) -> Array | Constant:
    """One argument: ``"DTYPE[DIM,...]"`` (dims: integers, ``batch``, ``seq``), ``"none"``, or ``{value = X}``."""
    if value == "none":
        return Constant(None)
    if isinstance(value, dict):
        if set(value) != {"value"}:
            raise SpecError(key, f"expected 'DTYPE[DIMS]', 'none' or {{value = ...}}, got a table with keys "
                                 f"{', '.join(sorted(value))}")
        return Constant(_plain(value["value"], key + ".value"))
    if not isinstance(value, str):
        raise SpecError(key, f"expected 'DTYPE[DIMS]' (e.g. 'int32[batch,seq]'), 'none' or {{value = ...}}, "
                             f"got {type(value).__name__} {value!r}")
    m = _ARRAY.match(value)
    if not m:
        raise SpecError(key, f"expected 'DTYPE[DIMS]' such as 'int32[batch,seq]' or 'float32[batch,16]', or 'none', "
                             f"got {value!r}")
    dtype, dims_text = m.group(1), m.group(2).strip()
    if dtype not in DTYPES:
        raise SpecError(key, f"unknown dtype {dtype!r} (known: {', '.join(DTYPES)})")
    dims: list[int | str] = []
    for item in (d.strip() for d in dims_text.split(",")) if dims_text else ():
        if item in DIM_NAMES:
            dims.append(item)
        elif item.isdigit() and item.isascii() and int(item) >= 1:
            dims.append(int(item))
        else:
            raise SpecError(key, f"dimension {item!r} of {value!r}: expected an integer >= 1, 'batch' or 'seq'")
    return Array(dtype, tuple(dims))


def _plain(value, key: str):
    """A TOML value as JSON holds it (dates and times have no place in a model's arguments)."""
    if isinstance(value, dict):
        return {k: _plain(v, f"{key}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v, f"{key}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, (str, int, float, bool)):
        return value
    raise SpecError(key, f"expected a string, number, boolean, array or table, got {type(value).__name__}")


def _callable_path(value, key: str) -> str:
    if not isinstance(value, str) or not _CALLABLE_PATH.match(value):
        raise SpecError(key, f"expected 'package.module:Name' (e.g. 'tunix.models.qwen3.model:Qwen3'), got {value!r}")
    return value


def _identifier(value, key: str, what: str) -> str:
    if not isinstance(value, str) or not _IDENTIFIER.match(value):
        raise SpecError(key, f"expected {what} (a Python identifier), got {value!r}")
    return value


def _table(value, key: str) -> dict:
    if not isinstance(value, dict):
        raise SpecError(key, f"expected a table of name = value, got {type(value).__name__} {value!r}")
    for name in value:
        _identifier(name, f"{key}.{name}", "an argument or field name")
    return _plain(value, key)


def _check_keys(table: dict, key: str) -> dict:
    """The model keys of one table, each checked on its own (cross-key rules wait for the merge)."""
    checked = {}
    for name, value in table.items():
        where = f"{key}.{name}" if key else name
        if name not in MODEL_KEYS:
            raise SpecError(where, f"unknown key (a model's table sets: {', '.join(MODEL_KEYS)})")
        if name in ("model", "config"):
            checked[name] = _callable_path(value, where)
        elif name in MERGED_KEYS:
            checked[name] = _table(value, where)
        elif name in ("layers", "scan", "rngs"):
            what = {"layers": "the config field or keyword argument that sets the depth",
                    "scan": "the config field or keyword argument that turns layer scan on",
                    "rngs": "the keyword argument the model takes its nnx.Rngs by"}[name]
            checked[name] = "" if name == "rngs" and value == "" else _identifier(value, where, what)
        elif name == "rng_streams":
            if not isinstance(value, list) or not value:
                raise SpecError(where, "expected a non-empty list of stream names, e.g. ['params', 'dropout']")
            checked[name] = [_identifier(v, f"{where}[{i}]", "a stream name") for i, v in enumerate(value)]
            if len(set(checked[name])) != len(checked[name]):
                raise SpecError(where, "has duplicates")
        elif name == "inputs":
            checked[name] = _inputs(value, where)
        elif name == "labels":
            if isinstance(value, bool) or not isinstance(value, (str, int)):
                raise SpecError(where, f"expected the name (or, for a list of inputs, the index) of the input "
                                       f"holding the token ids, got {value!r}")
            checked[name] = value
        elif name == "output":
            if isinstance(value, bool) or not isinstance(value, (str, int)):
                raise SpecError(where, f"expected the index (or key) of the prediction in what the model returns, "
                                       f"got {value!r}")
            checked[name] = value
        elif name == "loss":
            if value not in LOSSES:
                raise SpecError(where, f"expected one of {', '.join(LOSSES)}, got {value!r}")
            checked[name] = value
        elif name == "optimizer":
            checked[name] = _identifier(value, where, "an optax optimizer's name, e.g. 'adamw' or 'sgd'")
        elif name == "learning_rate":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise SpecError(where, f"expected a finite number > 0, got {value!r}")
            checked[name] = float(value)
        elif name == "full_depth":
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1024:
                raise SpecError(where, f"expected an integer depth in 1..1024, got {value!r}")
            checked[name] = value
    return checked


def _inputs(value, key: str):
    """A table (keyword arguments, in the call's order) or an array (positional arguments); the JSON form keeps
    each as written, checked."""
    if isinstance(value, dict):
        if not value:
            raise SpecError(key, "expected at least one argument")
        for name, item in value.items():
            _identifier(name, f"{key}.{name}", "an argument name")
            parse_input(item, f"{key}.{name}")
        return _plain(value, key)
    if isinstance(value, list):
        if not value:
            raise SpecError(key, "expected at least one argument")
        for i, item in enumerate(value):
            parse_input(item, f"{key}[{i}]")
        return _plain(value, key)
    raise SpecError(key, "expected a table of argument = 'DTYPE[DIMS]' (keyword arguments) or an array of them "
                         "(positional), e.g. {input_tokens = 'int32[batch,seq]'}")


def merge(*tables: Mapping) -> dict:
    """Later tables over earlier ones: ``MERGED_KEYS`` key by key, every other key replaced."""
    merged: dict = {}
    for table in tables:
        for name, value in table.items():
            merged[name] = {**merged.get(name, {}), **value} if name in MERGED_KEYS else value
    return merged


def _check_model(spec: Mapping, key: str) -> None:
    """The rules across keys, on a model's merged spec (``key`` names its table)."""
    for required, why in (("model", "the NNX module class or the function that builds it"),
                          ("layers", "the config field (or the model's keyword argument) the cell's depth sets"),
                          ("inputs", "the model's call: each argument's 'DTYPE[DIMS]'")):
        if required not in spec:
            raise SpecError(f"{key}.{required}", f"missing: {why}")
    inputs = spec["inputs"]
    arrays = _arrays(inputs)
    if not arrays:
        raise SpecError(f"{key}.inputs", "no array among the inputs: the step would take no batch")
    loss = loss_of(spec)
    if loss == "cross_entropy":
        if "labels" not in spec:
            raise SpecError(f"{key}.labels", "loss 'cross_entropy' needs the input holding the token ids "
                                             "(labels = 'input_tokens'), or set loss = 'mean_square'")
        labels = spec["labels"]
        if labels not in arrays:
            names = ", ".join(map(str, arrays))
            raise SpecError(f"{key}.labels", f"{labels!r} is not an array input (inputs: {names})")
        if arrays[labels].dtype not in INTEGER_DTYPES:
            raise SpecError(f"{key}.labels", f"{labels!r} is {arrays[labels].text}: token ids are integers")
    elif "labels" in spec:
        raise SpecError(f"{key}.labels", "only loss 'cross_entropy' reads labels")
    if "scan" in spec and spec["scan"] == spec["layers"]:
        raise SpecError(f"{key}.scan", f"{spec['scan']!r} is also `layers`")


def _arrays(inputs) -> dict:
    items = inputs.items() if isinstance(inputs, dict) else enumerate(inputs)
    parsed = {k: parse_input(v, str(k)) for k, v in items}
    return {k: v for k, v in parsed.items() if isinstance(v, Array)}


def loss_of(spec: Mapping) -> str:
    """The spec's loss: as given, else ``cross_entropy`` when it names labels, ``mean_square`` when not."""
    return spec.get("loss", "cross_entropy" if "labels" in spec else "mean_square")


def validate(table, models: list[str], quants: list[str]) -> dict[str, dict]:
    """The [nnx] table read for ``models`` and the variants ``quants`` name: model -> its spec (JSON-able), with
    ``variants`` (quant -> the table it applies; "none" is the model as described)."""
    if not isinstance(table, dict):
        raise SpecError("nnx", "expected a table: [nnx] model = 'package.module:Factory', ...")
    shared = _check_keys({k: v for k, v in table.items() if k not in ("models", "quant")}, "nnx")
    per_model = table.get("models", {})
    if not isinstance(per_model, dict) or not all(isinstance(t, dict) for t in per_model.values()):
        raise SpecError("nnx.models", "expected a table of tables: [nnx.models.NAME] model = '...'")
    for name in per_model:
        if name not in models:
            raise SpecError(f"nnx.models.{name}", f"model {name!r} is in no series' models "
                                                  f"({', '.join(models)})")
    variants = table.get("quant", {})
    if not isinstance(variants, dict) or not all(isinstance(t, dict) for t in variants.values()):
        raise SpecError("nnx.quant", "expected a table of tables: [nnx.quant.NAME] fields = {...}")
    checked_variants = {name: _check_keys(t, f"nnx.quant.{name}") for name, t in variants.items()}
    if "none" in checked_variants:
        raise SpecError("nnx.quant.none", "'none' is the model as its table describes it: name the variant")
    for name in checked_variants:
        if name not in quants:
            raise SpecError(f"nnx.quant.{name}", f"variant {name!r} is in no series' quant ({', '.join(quants)})")
    for quant in quants:
        if quant != "none" and quant not in checked_variants:
            raise SpecError("quant", f"{quant!r}: the nnx target builds 'none' as each model's table describes it; "
                                     f"any other value of quant names a variant: add [nnx.quant.{quant}] "
                                     f"(e.g. fields = {{dtype = 'bfloat16'}})")
    specs = {}
    for model in models:
        key = f"nnx.models.{model}" if model in per_model else "nnx"
        own = _check_keys(per_model.get(model, {}), f"nnx.models.{model}")
        spec = merge(shared, own)
        _check_model(spec, key)
        for name, variant in checked_variants.items():
            _check_model(merge(spec, variant), f"nnx.quant.{name}")
        # Where each key was set, for the errors only an import finds (targets.nnx.resolve).
        where = {**{k: f"nnx.{k}" for k in shared}, **{k: f"nnx.models.{model}.{k}" for k in own}}
        specs[model] = {**spec, "variants": checked_variants, "where": where}
    return specs


def to_json(spec: Mapping) -> str:
    """The spec as the cell carries it: canonical JSON (sorted keys), so equal specs give equal cells."""
    return json.dumps(spec, sort_keys=True, separators=(",", ":"))


def from_overrides(overrides: tuple[tuple[str, str], ...]) -> dict | None:
    """The spec a cell of the nnx target carries, None when it has none."""
    for key, value in overrides:
        if key == SPEC_KEY:
            return json.loads(value)
    return None


def for_variant(spec: Mapping, quant: str) -> dict:
    """The model's spec with the cell's variant applied (``quant`` "none": as described)."""
    base = {k: v for k, v in spec.items() if k != "variants"}
    if quant == "none":
        return base
    variant = spec.get("variants", {}).get(quant, {})
    where = {**base.get("where", {}), **{k: f"nnx.quant.{quant}.{k}" for k in variant}}
    return {**merge(base, variant), "where": where}


def supports_scan(spec: Mapping) -> bool:
    """Whether the model (in every variant) says how to turn layer scan on."""
    return "scan" in spec and all("scan" in for_variant(spec, q) for q in spec.get("variants", {}))
