"""A config with its target imported and checked (``resolve``), in a lowering process (``hlo_audit.workers``), never in
this one: what only an import can tell, found when a command plans its cells, so a misspelled function or factory
is one line naming the file and the key, and exit 2, before any cell runs."""

from __future__ import annotations

from dataclasses import replace

from hlo_audit.config import Config, ConfigError
from hlo_audit.matrix import id_part_problem
from hlo_audit.targets import missing_stack, nnx_spec


def resolve(config: Config) -> Config:
    """The config with its target imported and checked: what only an import can tell, found when a command plans
    its cells (``list`` too), so a misspelled function or factory is one line naming the file and the key, and
    exit 2, before any cell runs.

    * A callable target (``package.module:function``): the function is imported. Its ``scan`` and ``quant``
      attributes, where it has them, say which values of those axes it lowers: they are the defaults of every
      series that leaves the axis out, and a series naming another value is an error.
    * The nnx target: each model's factory, config callable, fields and optimizer are checked, its full depth read
      off its config, and the digest of its library's source added to the description its cells carry, so an
      edit of the library is a cache miss (``targets.nnx.resolve``).
    * MaxText's target: nothing to import here; MaxText's config system judges its models when a cell lowers.

    A built-in target whose stack is not installed (flax, for nnx and MaxText: ``targets.STACKS``) is a
    ConfigError naming the extra that brings it.
    """
    if config.resolved:
        return config
    if problem := missing_stack(config.target):  # flax for nnx and MaxText: an extra, not hlo-audit's core
        raise ConfigError(f"{config.source}: {problem}")
    if config.target == "maxtext":
        return config
    if config.target == nnx_spec.TARGET:
        return _resolve_nnx(config)
    return _resolve_callable(config)


def _resolve_callable(config: Config) -> Config:
    """The function's declared axes, as a lowering process reads them (``workers.describe``): its module is
    imported there, never here."""
    from hlo_audit import workers  # noqa: PLC0415

    answer = workers.describe(config.target, [])
    if isinstance(answer, str):
        raise ConfigError(f"{config.source}: target: {' '.join(answer.split())}")
    series = list(config.series)
    for axis, values_of in (("scan", _declared_scans), ("quant", _declared_quants)):
        declared = values_of(answer, config)
        if declared is None:
            continue
        for i, (axes, defaulted) in enumerate(zip(series, config.defaulted or [frozenset()] * len(series))):
            field_name = "scans" if axis == "scan" else "quants"
            if axis in defaulted:
                series[i] = replace(axes, **{field_name: declared})
                continue
            for j, value in enumerate(getattr(axes, field_name)):
                if value not in declared:
                    shown = (("on" if value else "off") if axis == "scan" else value)
                    names = ", ".join(("on" if v else "off") if axis == "scan" else v for v in declared)
                    prefix = "" if i == 0 else f"matrix[{i - 1}]."
                    raise ConfigError(f"{config.source}: {prefix}{axis}[{j}]: {config.target} lowers {axis} "
                                      f"{names} only (its function's {axis} attribute), got {shown!r}")
    return replace(config, series=tuple(series), resolved=True)


def _declared(answer: dict, config: Config, axis: str) -> list[str] | None:
    declared = answer.get(axis)
    if declared is None:
        return None
    declared = [declared] if isinstance(declared, str) else declared
    if not isinstance(declared, (list, tuple)) or not declared or not all(isinstance(v, str) for v in declared):
        raise ConfigError(f"{config.source}: target: {config.target}'s {axis} attribute: expected a list of "
                          f"strings, got {declared!r}")
    for value in declared:
        if axis == "scan" and value not in ("on", "off"):
            raise ConfigError(f"{config.source}: target: {config.target}'s scan attribute: expected 'on' and/or "
                              f"'off', got {value!r}")
        if problem := id_part_problem(value):
            raise ConfigError(f"{config.source}: target: {config.target}'s {axis} attribute: {value!r} {problem}")
    return list(dict.fromkeys(declared))


def _declared_scans(answer: dict, config: Config) -> tuple[bool, ...] | None:
    declared = _declared(answer, config, "scan")
    return None if declared is None else tuple(v == "on" for v in declared)


def _declared_quants(answer: dict, config: Config) -> tuple[str, ...] | None:
    declared = _declared(answer, config, "quant")
    return None if declared is None else tuple(declared)


def _resolve_nnx(config: Config) -> Config:
    """Each model's description checked against its library in a lowering process (``workers.describe``): the
    library is imported there, never here."""
    from hlo_audit import workers  # noqa: PLC0415

    answer = workers.describe(config.target, [], resolve_nnx=dict(config.nnx))
    if isinstance(answer, str):
        raise ConfigError(f"{config.source}: target: {' '.join(answer.split())}")
    resolved = {}
    for model in config.nnx:
        said = (answer.get("nnx") or {}).get(model)
        if not isinstance(said, dict) or not isinstance(said.get("resolved", said.get("error")), (dict, str)):
            raise ConfigError(f"{config.source}: nnx.models.{model}: its library could not be checked")
        if "error" in said:
            key = str(said.get("key", f"nnx.models.{model}"))
            whose = "" if f".{model}." in f"{key}." else f" (model {model!r})"
            raise ConfigError(f"{config.source}: {key}: {' '.join(str(said['error']).split())}{whose}")
        resolved[model] = said["resolved"]
    series = tuple(replace(axes, overrides={m: {nnx_spec.SPEC_KEY: nnx_spec.to_json(resolved[m])}
                                            for m in axes.models}) for axes in config.series)
    return replace(config, series=series, nnx=resolved, resolved=True)
