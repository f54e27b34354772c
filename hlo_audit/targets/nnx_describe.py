"""What ``hlo-audit init --nnx`` reads off a model library's model: the description the stock NNX target lowers
(``targets.nnx``'s ``[nnx]`` table), from the model's signatures and a forward pass from shapes.

The depth field and the layer-scan switch (by the names libraries give them: ``DEPTH_NAMES``, ``SCAN_NAMES``), the
config fields ``init --set`` gives, the call's arguments (given, or guessed from their names), the labels, and which
part of what the call returns is the prediction. What it cannot tell raises SpecError naming the ``init`` option that
settles it. Lowering the description is ``targets.nnx``'s.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping

from hlo_audit.matrix import Cell
from hlo_audit.targets import nnx_spec
from hlo_audit.targets.nnx import (
    _accepts,
    _call,
    _config_object,
    _constructor_arguments,
    _has_field,
    _parameters,
    import_attribute,
)
from hlo_audit.targets.nnx_spec import Array, SpecError, parse_input

# Names a library gives the depth and the layer-scan switch (tunix: num_layers; MaxText: num_decoder_layers,
# scan_layers; Hugging Face configs: num_hidden_layers).
DEPTH_NAMES = ("num_layers", "num_hidden_layers", "num_decoder_layers", "n_layers", "n_layer", "num_blocks",
               "depth", "layers")
SCAN_NAMES = ("scan_layers", "scan", "use_scan", "scan_blocks")


def _guess_input(name: str) -> str | None:
    """An argument's 'DTYPE[DIMS]' from its name, for the arguments language models take."""
    lowered = name.lower()
    if "token" in lowered or lowered in ("ids", "input_ids", "inputs_ids") or lowered.endswith("_ids"):
        return "int32[batch,seq]"
    if "position" in lowered or lowered in ("pos", "segment_pos"):
        return "int32[batch,seq]"
    if "mask" in lowered:
        return "bool[batch,seq,seq]"
    if "cache" in lowered:
        return "none"
    return None


def describe(model: str, config: str | None = None, inputs: Mapping[str, str] | None = None,
             layers: str | None = None, scan: str | None = None, labels: str | None = None,
             args: Mapping[str, object] | None = None, fields: Mapping[str, object] | None = None) -> dict:
    """A model's description for the [nnx] table, from what its signatures say and a forward pass from shapes
    confirms: the depth field, the scan switch, the config ``fields`` set (``init --set``; the forward pass runs
    with them), the call's arguments (``inputs`` given win over names guessed from the call's signature), the
    labels, and which part of the output is the prediction. Raises SpecError naming the ``hlo-audit init`` option
    that would settle what it cannot tell."""
    factory = import_attribute(model, "--nnx")
    spec: dict = {"model": model}
    constructor = _parameters(factory) or {}
    if config:
        spec["config"] = config
    spec["layers"], scan_field = _depth_and_scan(model, config, constructor, layers, scan)
    if scan_field:
        spec["scan"] = scan_field
    if fields:
        spec["fields"] = _set_fields(config, fields, (spec["layers"], scan_field))
    if _accepts(factory, "rngs"):
        spec["rngs"] = "rngs"
    if args:
        spec["args"] = dict(args)
    taken = {"rngs", *(() if config else (spec["layers"], scan_field)), *(args or {})}
    skipped = 1 if config else 0  # the config object is the first argument
    for name, parameter in list(constructor.items())[skipped:]:
        if parameter.default is inspect.Parameter.empty and name not in taken and parameter.kind in (
                inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY):
            raise SpecError("--arg", f"{model} needs {name!r}: give --arg {name}=VALUE")
    spec["inputs"] = described = _call_inputs(factory, model, inputs)
    token_inputs = [n for n, v in described.items() if isinstance(parse_input(v, n), Array)
                    and parse_input(v, n).dtype in nnx_spec.INTEGER_DTYPES and _guess_input(n) == "int32[batch,seq]"
                    and "position" not in n.lower()]
    chosen_labels = labels or (token_inputs[0] if token_inputs else None)
    output, logits_like = _forward_output(spec, chosen_labels)
    if output is not None:
        spec["output"] = output
    if chosen_labels and logits_like:
        spec["labels"] = chosen_labels
    return spec


def _depth_and_scan(model: str, config: str | None, constructor: Mapping[str, inspect.Parameter],
                    layers: str | None, scan: str | None) -> tuple[str, str | None]:
    """The field that sets the depth (given, or one of DEPTH_NAMES the config object or the constructor has) and
    the layer-scan switch's (None: the model has none)."""
    if config:
        made = _config_object({"config": config, "where": {"config": "--nnx-config"}})
        values = ({f.name: getattr(made, f.name) for f in dataclasses.fields(made)} if dataclasses.is_dataclass(made)
                  else dict(vars(made)) if hasattr(made, "__dict__") else {})
        depth_ok = lambda n: isinstance(values.get(n), int) and not isinstance(values.get(n), bool)  # noqa: E731
        scan_ok = lambda n: isinstance(values.get(n), bool)  # noqa: E731
        where = f"the fields of the object {config} returns ({type(made).__name__})"
    else:
        values = dict(constructor)
        depth_ok = scan_ok = values.__contains__
        where = f"{model}'s arguments"
    depth = layers or next((n for n in DEPTH_NAMES if depth_ok(n)), None)
    if not depth:
        raise SpecError("--layers-field", f"cannot tell which of {where} sets the depth (none is one of "
                                          f"{', '.join(DEPTH_NAMES)}; there are: {', '.join(values) or 'none'})")
    return depth, scan or next((n for n in SCAN_NAMES if scan_ok(n)), None)


def _set_fields(config: str | None, fields: Mapping[str, object], per_cell: tuple) -> dict:
    """``init --set``'s values for the config object's fields, each checked against the field's present value: a
    field the object has, not one each cell sets (depth, scan), a value of the field's kind (TOML's int for an int;
    a name for a dtype or an enum, coerced as a cell would)."""
    if not config:
        raise SpecError("--set", "sets fields of the model's config object: give --nnx-config (the callable that "
                                 "returns it), or --arg for the factory's keyword arguments")
    made = _config_object({"config": config, "where": {"config": "--nnx-config"}})
    for name, value in fields.items():
        if name in per_cell:
            raise SpecError("--set", f"{name}: each cell sets it (--layers, scan): leave it out")
        if not _has_field(made, name):
            known = [f.name for f in dataclasses.fields(made)] if dataclasses.is_dataclass(made) else []
            raise SpecError("--set", f"{name}: the object {config} returns ({type(made).__name__}) has no field "
                                     f"{name!r}" + (f" (its fields: {', '.join(known)})" if known else ""))
        current = getattr(made, name)
        if not _same_kind(current, value):
            raise SpecError("--set", f"{name}={nnx_spec.to_json(value)}: {name} holds {type(current).__name__} "
                                     f"({current!r}), not {type(value).__name__}")
        if isinstance(value, str) and _holds_dtype(current) and not _holds_dtype(value):
            raise SpecError("--set", f"{name}={value}: {name} holds a dtype: give one's name (bfloat16, float32)")
    _config_object({"config": config, "fields": dict(fields), "where": {"config": "--nnx-config", "fields": "--set"}})
    return dict(fields)


def _holds_dtype(value) -> bool:
    """Whether ``value`` names a dtype (``jnp.float32``, ``np.dtype('bf16')``, 'bfloat16'): a field holding one takes
    any dtype's name, which the model's layers read (a wrong one fails only inside the model's call)."""
    import jax.numpy as jnp  # noqa: PLC0415

    if value is None or isinstance(value, (bool, int, float)):
        return False
    try:
        jnp.dtype(value)
    except TypeError:
        return False
    return True


def _same_kind(current, value) -> bool:
    """Whether a TOML value fits a field holding ``current`` (a bool only for a bool, an int for an int, a number for
    a float, a string for a string); other fields (dtypes, enums, tuples, None) are left to the coercion."""
    for kind, takes in ((bool, bool), (int, int), (float, (int, float)), (str, str)):
        if isinstance(current, kind):
            return isinstance(value, takes) and (kind is bool) == isinstance(value, bool)
    return current is None or not isinstance(value, bool)


def _call_inputs(factory, model: str, inputs: Mapping[str, str] | None) -> dict[str, str]:
    """The module's call's arguments as 'DTYPE[DIMS]': ``inputs`` given, else guessed from their names."""
    if isinstance(factory, type):  # the module's class: its call's signature names the batch
        call = list((_parameters(factory.__call__) or {}).items())[1:]
    elif inputs:  # a function that builds the module: the call is only what --input says
        call = []
    else:
        raise SpecError("--input", f"{model} is a function, so its module's call is unknown until it runs: give "
                                   "--input NAME=DTYPE[DIMS] for each argument of the call")
    required = [n for n, p in call if p.default is inspect.Parameter.empty
                and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
    described = {}
    for name in required:
        guess = (inputs or {}).get(name) or _guess_input(name)
        if guess is None:
            raise SpecError("--input", f"cannot tell what {model}'s call takes as {name!r}: give --input "
                                       f"{name}=DTYPE[DIMS] (e.g. float32[batch,16] or int32[batch,seq])")
        described[name] = guess
    for name, value in (inputs or {}).items():
        described.setdefault(name, value)
    for name, value in described.items():
        parse_input(value, f"--input {name}")
    return described


def _forward_output(spec: Mapping, labels: str | None) -> tuple[int | str | None, bool]:
    """(where the prediction is in what the call returns, whether it is logits over the labels): one forward pass
    at depth 2 from shapes (``jax.eval_shape``: nothing computed, nothing allocated)."""
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415
    from flax import nnx  # noqa: PLC0415

    cell = Cell(model="describe", scan=False, quant="none", layers=2, target=nnx_spec.TARGET)
    factory = import_attribute(spec["model"], "--nnx")
    args, kwargs = _constructor_arguments(spec, cell)
    call, batch = _call(spec, cell)

    def forward():
        extra = {spec["rngs"]: nnx.Rngs(0)} if spec.get("rngs") else {}
        real = {k: jnp.zeros(v.shape, v.dtype) for k, v in batch.items()}
        return call(factory(*args, **kwargs, **extra), real)

    try:
        produced = jax.eval_shape(forward)
    except Exception as exc:  # noqa: BLE001 (the model's own error on the guessed call: one line)
        raise SpecError("--input", f"a forward pass of {spec['model']} with {nnx_spec.to_json(spec['inputs'])} "
                                   f"failed: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}") from None
    token_shape = batch[labels].shape if labels in batch else None

    def logits(leaf) -> bool:
        return token_shape is not None and len(leaf.shape) == len(token_shape) + 1 and \
            tuple(leaf.shape[:-1]) == tuple(token_shape)

    if isinstance(produced, jax.ShapeDtypeStruct):
        return None, logits(produced)
    candidates = (list(produced.items()) if isinstance(produced, dict) else
                  list(enumerate(produced)) if isinstance(produced, (tuple, list)) else [])
    arrays = [(k, v) for k, v in candidates if isinstance(v, jax.ShapeDtypeStruct)]
    if not arrays:
        raise SpecError("--nnx", f"{spec['model']}'s call returns {type(produced).__name__} with no array in it")
    preferred = next(((k, v) for k, v in arrays if k == "logits"), None) or \
        next(((k, v) for k, v in arrays if logits(v)), arrays[0])
    return preferred[0], logits(preferred[1])
