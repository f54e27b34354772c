"""The stock NNX target: ``target = "nnx"`` lowers a Flax NNX model library's model in a standard train step.

A user describes the model in the config (``[nnx]``, read by ``targets.nnx_spec``), never in Python: the
factory (the ``nnx.Module`` class or a function that builds one), optionally a config object (a callable such as
``tunix.models.qwen3.model:ModelConfig.qwen3_0p6b``) whose ``layers`` field the cell's depth sets and whose
``scan`` field, where the model has one, turns layer scan on; the call's arguments; the loss; the optax optimizer.
The step it builds is the one such libraries train with:

* the model and an ``nnx.Optimizer(model, tx, wrt=nnx.Param)`` built inside ``nnx.eval_shape``: only shapes, no
  weights allocated, so a 1B model's full depth lowers on a small CPU box;
* ``train_step(state, batch)``, jitted with the state donated: merge, call the model on the batch, take the
  prediction (``output``: an index or key into what the call returns), the loss (next-token cross entropy against
  the ``labels`` input, or the mean square of the prediction), gradients with respect to ``nnx.Param`` only,
  ``optimizer.update(model, grads)``, and the new state out. The state is ``{"model": ..., "optimizer": ...}``,
  so entry parameters are named ``state.model.layers.3...`` and ``state.optimizer.opt_state...``, and the
  batch's ``batch.input_tokens``.

Everything the lowering reads about the model is in the cell (``nnx_spec.SPEC_KEY`` in its overrides), with a
digest of the source of the library's top-level packages added when the plan resolves it (``resolve``): so the
cell's cache key changes when the description or the library's code does, and a worker lowers from the cell alone.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import functools
import hashlib
import importlib
import inspect
import sys
from collections.abc import Mapping
from pathlib import Path

from hlo_audit import host, platforms
from hlo_audit.files import current_directory
from hlo_audit.lowering import Lowering, TargetError, import_failure
from hlo_audit.matrix import Cell
from hlo_audit.targets import nnx_spec
from hlo_audit.targets.nnx_spec import Array, Constant, SpecError, parse_input


def import_attribute(path: str, key: str):
    """``package.module:Name.attr``: the object it names; a SpecError naming ``key`` when it does not resolve."""
    module_name, _, attribute = path.partition(":")
    if "" not in sys.path and (here := current_directory()) is not None and str(here) not in sys.path:
        sys.path.insert(0, str(here))  # a project's own package, run from its root
    try:
        module = importlib.import_module(module_name)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 (the library's own import failing: one line naming it)
        raise SpecError(key, f"{path!r}: {import_failure(module_name, exc)}") from None
    found = module
    for i, part in enumerate(attribute.split(".")):
        if not hasattr(found, part):
            where = ".".join([module_name, *attribute.split(".")[:i]])
            raise SpecError(key, f"{path!r}: {where} has no attribute {part!r}")
        found = getattr(found, part)
    if not callable(found):
        raise SpecError(key, f"{path!r} is a {type(found).__name__}, not a class or function")
    return found


def _where(spec: Mapping, key: str) -> str:
    return spec.get("where", {}).get(key, f"nnx.{key}")


def _parameters(function) -> Mapping[str, inspect.Parameter] | None:
    """The parameters ``function`` takes (a class: its ``__init__``'s, less ``self``: an NNX module's metaclass
    shows only ``*args, **kwargs``); None when Python cannot say (a builtin)."""
    try:
        if isinstance(function, type):
            return dict(list(inspect.signature(function.__init__).parameters.items())[1:])
        return dict(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return None


def _accepts(function, name: str) -> bool:
    """Whether ``function`` takes keyword argument ``name``."""
    parameters = _parameters(function)
    if parameters is None:
        return True  # let the call say
    return name in parameters or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())


def _default_of(function, name: str):
    parameter = (_parameters(function) or {}).get(name)
    return None if parameter is None or parameter.default is inspect.Parameter.empty else parameter.default


def _has_field(config, name: str) -> bool:
    if dataclasses.is_dataclass(config):
        return name in {f.name for f in dataclasses.fields(config)}
    return hasattr(config, name)


def resolve(spec: Mapping) -> dict:
    """What only importing the library can tell, checked at plan time: the factory and the config callable exist,
    the config has the fields the spec names (or the factory takes them as keywords), optax has the optimizer.
    Returns the spec with ``full_depth`` (the config's own depth, when the spec does not give it) and ``source``
    (a digest of the library's source) added. Raises SpecError naming the key."""
    import optax  # noqa: PLC0415 (what lowers imports jax)

    resolved = dict(spec)
    variants = [nnx_spec.for_variant(spec, q) for q in ("none", *spec.get("variants", {}))]
    packages = set()
    depth = None
    for variant in variants:
        factory = import_attribute(variant["model"], _where(variant, "model"))
        packages.add(_top_package(variant["model"]))
        if variant.get("config"):
            packages.add(_top_package(variant["config"]))
            config = _config_object({**variant, "fields": {}})
            for key, name in (("layers", variant["layers"]), ("scan", variant.get("scan")),
                              *(("fields", f) for f in variant.get("fields", {}))):
                if name is not None and not _has_field(config, name):
                    raise SpecError(_where(variant, key), f"{name!r}: the object {variant['config']!r} returns "
                                                          f"({type(config).__name__}) has no field {name!r}")
            _config_object(variant)  # the fields' values, coerced
            own = getattr(config, variant["layers"])
        else:
            if variant.get("fields"):
                raise SpecError(_where(variant, "fields"), "fields set a config object's fields: give `config` "
                                                          "(the callable that returns it), or use args")
            for key in ("layers", "scan"):
                if variant.get(key) and not _accepts(factory, variant[key]):
                    raise SpecError(_where(variant, key), f"{variant[key]!r}: {variant['model']!r} takes no keyword "
                                                          f"argument {variant[key]!r}")
            own = _default_of(factory, variant["layers"])
        rngs = variant.get("rngs", "rngs")
        if rngs and not _accepts(factory, rngs):
            raise SpecError(_where(variant, "rngs"), f"{variant['model']!r} takes no keyword argument {rngs!r}: name "
                                                     "the one it takes its nnx.Rngs by (rngs = '...'), or '' for none")
        optimizer = variant.get("optimizer", nnx_spec.DEFAULT_OPTIMIZER)
        if not callable(getattr(optax, optimizer, None)):
            raise SpecError(_where(variant, "optimizer"), f"optax has no optimizer {optimizer!r} "
                                                          "(e.g. 'adamw', 'adam', 'sgd', 'lion')")
        if variant is variants[0] and isinstance(own, int) and not isinstance(own, bool):
            depth = own
    resolved.setdefault("full_depth", depth)
    resolved["source"] = source_digest(sorted(packages))
    return resolved


def _top_package(path: str) -> str:
    return path.partition(":")[0].split(".")[0]


def _config_object(spec: Mapping):
    """The config object for one variant: the config callable's, with ``fields`` replaced (coerced to the kind of
    value each field holds: a dtype field takes 'bfloat16', an enum field a member's name)."""
    make = import_attribute(spec["config"], _where(spec, "config"))
    try:
        config = make(**spec.get("config_args", {}))
        return with_fields(config, spec.get("fields", {}))
    except Exception as exc:  # noqa: BLE001 (the library's own error: one line)
        fields = spec.get("fields")
        raise SpecError(_where(spec, "fields" if fields else "config"),
                        f"{spec['config']}(...){f' with fields {fields}' if fields else ''}: {type(exc).__name__}: "
                        f"{' '.join(str(exc).split())}") from None


def with_fields(config, values: Mapping):
    """``config`` with ``values`` for its fields: ``dataclasses.replace`` for a dataclass, else a copy."""
    if not values:
        return config
    coerced = {name: _coerce(getattr(config, name, None), value) for name, value in values.items()}
    if dataclasses.is_dataclass(config):
        return dataclasses.replace(config, **coerced)
    config = copy.copy(config)
    for name, value in coerced.items():
        setattr(config, name, value)
    return config


def _coerce(current, value):
    """A TOML value as the field's kind of value: dtype names become dtypes, member names enum members, arrays
    tuples where the field holds a tuple."""
    import numpy as np  # noqa: PLC0415

    if isinstance(value, str):
        if isinstance(current, np.dtype) or (isinstance(current, type) and issubclass(current, np.generic)):
            import jax.numpy as jnp  # noqa: PLC0415

            return jnp.dtype(value)
        if isinstance(current, enum.Enum):
            return type(current)[value]
    if isinstance(current, tuple) and isinstance(value, list):
        return tuple(value)
    return value


def source_digest(packages: list[str]) -> str:
    """sha256 over the ``.py`` files of each top-level package (a module's own file when it is one module)."""
    digest = hashlib.sha256()
    for name in packages:
        module = sys.modules.get(name) or importlib.import_module(name)
        roots = [Path(p) for p in getattr(module, "__path__", [])] or (
            [Path(module.__file__)] if getattr(module, "__file__", None) else [])  # a built-in module has none
        for root in roots:
            files = sorted(root.rglob("*.py")) if root.is_dir() else [root]
            for path in files:
                digest.update(f"{name}/{path.relative_to(root) if root.is_dir() else path.name}\0".encode())
                digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


@functools.cache
def _distributions() -> Mapping[str, list[str]]:
    from importlib import metadata  # noqa: PLC0415

    return metadata.packages_distributions()


def library_versions(spec: Mapping) -> dict[str, str]:
    """The installed distributions the model's and config's top-level packages come from, with their versions."""
    versions = {}
    for key in ("model", "config"):
        if spec.get(key):
            top = _top_package(spec[key])
            for dist in _distributions().get(top, []):
                versions[dist] = host.installed_version(dist)
    return versions


class NnxTarget:
    """``target = "nnx"``. ``models`` (the config's resolved specs) answers full_depth; lowering reads the cell."""

    name = nnx_spec.TARGET

    def __init__(self, models: Mapping[str, Mapping] | None = None):
        self.models = dict(models or {})

    def check_available(self, cell: Cell) -> None:
        platforms.of(cell).check_available(cell)

    def lower(self, cell: Cell) -> Lowering:
        from hlo_audit.capture import captured_arrays  # noqa: PLC0415 (jax)
        from hlo_audit.stages import to_stage  # noqa: PLC0415

        with platforms.default_device(cell):
            traced = self.trace(cell)
            lowered = traced.lower(lowering_platforms=(cell.platform,))
            return to_stage(lowered, cell, captured_arrays(traced))

    def trace(self, cell: Cell):
        """The cell's train step, traced (``jax.stages.Traced``): what ``lower`` lowers and ``measure`` runs."""
        try:
            return trace_train_step(cell_spec(cell), cell)
        except SpecError as exc:  # the library changed since the plan resolved it: one line, like a config's
            raise TargetError(f"nnx: {exc.key}: {' '.join(str(exc).split())}") from None

    def full_depth(self, model: str) -> int:
        depth = self.models.get(model, {}).get("full_depth")
        if depth is None:
            raise TargetError(f"nnx: model {model!r}: its config gives no integer depth; set full_depth = N in "
                              f"[nnx.models.{model}]")
        return int(depth)

    def versions(self, cell: Cell) -> dict[str, str]:
        spec = cell_spec(cell)
        return {"optax": host.installed_version("optax"), **library_versions(spec)}


def cell_spec(cell: Cell) -> dict:
    spec = nnx_spec.from_overrides(cell.overrides)
    if spec is None:
        raise TargetError(f"nnx: cell {cell.id} carries no model description (cells of target 'nnx' come from a "
                          "config's [nnx] table)")
    return nnx_spec.for_variant(spec, cell.quant)


def trace_train_step(spec: Mapping, cell: Cell):
    """The cell's train step, traced from abstract shapes (``jax.stages.Traced``)."""
    import jax  # noqa: PLC0415
    import optax  # noqa: PLC0415
    from flax import nnx  # noqa: PLC0415

    factory = import_attribute(spec["model"], _where(spec, "model"))
    args, kwargs = _constructor_arguments(spec, cell)
    rngs_keyword = spec.get("rngs", "rngs")
    streams = spec.get("rng_streams", ["default"])
    optimizer = getattr(optax, spec.get("optimizer", nnx_spec.DEFAULT_OPTIMIZER))
    tx = optimizer(spec.get("learning_rate", nnx_spec.DEFAULT_LEARNING_RATE), **spec.get("optimizer_args", {}))

    def build():
        extra = {rngs_keyword: nnx.Rngs(**{s: i for i, s in enumerate(streams)})} if rngs_keyword else {}
        model = factory(*args, **kwargs, **extra)
        if not isinstance(model, nnx.Module):
            raise TargetError(f"nnx: {spec['model']} built a {type(model).__name__}, not an nnx.Module")
        return model, nnx.Optimizer(model, tx, wrt=nnx.Param)

    model, opt = nnx.eval_shape(build)
    model_def, model_state = nnx.split(model)
    opt_def, opt_state = nnx.split(opt)
    call, batch = _call(spec, cell)
    loss = _loss(spec)

    def train_step(state, batch):
        model = nnx.merge(model_def, state["model"])
        opt = nnx.merge(opt_def, state["optimizer"])

        def loss_fn(m):
            return loss(_prediction(spec, call(m, batch)), batch)

        value, grads = nnx.value_and_grad(loss_fn, argnums=nnx.DiffState(0, nnx.Param))(model)
        opt.update(model, grads)
        return {"model": nnx.state(model), "optimizer": nnx.state(opt)}, value

    return jax.jit(train_step, donate_argnums=0).trace({"model": model_state, "optimizer": opt_state}, batch)


def _constructor_arguments(spec: Mapping, cell: Cell) -> tuple[tuple, dict]:
    """(positional, keyword) arguments of the factory for the cell: the config object first when there is one
    (its depth and scan fields set), else the depth and scan as keywords."""
    kwargs = dict(spec.get("args", {}))
    if spec.get("config"):
        fields = {**spec.get("fields", {}), spec["layers"]: cell.layers}
        if spec.get("scan"):
            fields[spec["scan"]] = cell.scan
        return (with_fields(_config_object({**spec, "fields": {}}), fields),), kwargs
    kwargs[spec["layers"]] = cell.layers
    if spec.get("scan"):
        kwargs[spec["scan"]] = cell.scan
    elif cell.scan:
        raise TargetError(f"nnx: model {cell.model!r} has no scan setting (scan = 'field' in its [nnx] table)")
    return (), kwargs


def _call(spec: Mapping, cell: Cell):
    """``call(model, batch)`` and the batch's abstract arrays: arrays are traced (entry parameters), constants
    and None are passed as they are."""
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415

    inputs = spec["inputs"]
    items = list(inputs.items()) if isinstance(inputs, dict) else list(enumerate(inputs))
    parsed = [(name, parse_input(value, str(name))) for name, value in items]
    arrays = {name: jax.ShapeDtypeStruct(p.shape(cell.batch, cell.seq), jnp.dtype(p.dtype))
              for name, p in parsed if isinstance(p, Array)}
    constants = {name: p.value for name, p in parsed if isinstance(p, Constant)}
    if isinstance(inputs, dict):
        def call(model, batch):
            return model(**constants, **batch)
        return call, arrays

    order = [name for name, _ in parsed]
    positions = [name for name in order if name in arrays]

    def call_positional(model, batch):
        by_position = dict(zip(positions, batch))
        return model(*(by_position[i] if i in by_position else constants[i] for i in order))
    return call_positional, [arrays[i] for i in positions]


def _prediction(spec: Mapping, produced):
    """What ``output`` names in what the model returned (the whole of it when the spec names nothing)."""
    import jax  # noqa: PLC0415

    where = spec.get("output")
    if where is not None:
        try:
            produced = produced[where]
        except (KeyError, IndexError, TypeError):
            raise TargetError(f"nnx: {spec['model']} returned {type(produced).__name__}: it has no {where!r} "
                              f"(output = {where!r})") from None
    if not isinstance(produced, jax.Array):
        hint = " (say which part is the prediction: output = 0)" if where is None else ""
        raise TargetError(f"nnx: {spec['model']}'s prediction is a {type(produced).__name__}, not an array{hint}")
    return produced


def _loss(spec: Mapping):
    """loss(prediction, batch) -> scalar: next-token cross entropy against the labels, or the mean square."""
    import jax.numpy as jnp  # noqa: PLC0415
    import optax  # noqa: PLC0415

    if nnx_spec.loss_of(spec) == "mean_square":
        return lambda prediction, batch: jnp.mean(jnp.square(prediction.astype(jnp.float32)))
    labels = spec["labels"]

    def cross_entropy(logits, batch):
        tokens = batch[labels] if isinstance(batch, dict) else batch[_position(spec, labels)]
        if logits.ndim != tokens.ndim + 1 or logits.shape[:-1] != tokens.shape:
            raise TargetError(f"nnx: cross_entropy needs logits shaped like the labels plus a vocabulary axis; "
                              f"got {tuple(logits.shape)} for labels {tuple(tokens.shape)}")
        return optax.softmax_cross_entropy_with_integer_labels(
            logits[:, :-1].astype(jnp.float32), tokens[:, 1:]).mean()
    return cross_entropy


def _position(spec: Mapping, index: int) -> int:
    """A positional input's index among the array inputs (the batch holds arrays only)."""
    return sum(1 for v in spec["inputs"][:index] if isinstance(parse_input(v, ""), Array))
