"""The pipeline in one call per step, as the CLI, the pytest plugin and library users run it:
``plan`` (config -> cells), ``execute`` (cells -> results), then ``check`` (an ``Outcome`` judged by the gate),
``update_goldens``, ``report`` (the matrix view) or ``scaling``.

Each step is its module's (``plan``, ``run``, ``outcome``, ``gate``, ``golden.update``, ``report.matrix``); this one
only chains them, so the CLI parses options and formats, and a library user gets the same behaviour.
"""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hlo_audit import scaffold
from hlo_audit.config import DEFAULT_CONFIG_FILE, ConfigError, resolve, validate
from hlo_audit.gate import Gate, regenerate_command
from hlo_audit.golden.update import GoldenUpdate, update
from hlo_audit.inputs import (CellNotLowered, Program, Unreadable, analyze_each, analyze_input, cell_result, cell_text,
                              diff, dump_launches, explain_source, explain_trees, launches_diff, load_program)
from hlo_audit.matrix import id_part_problem
from hlo_audit.outcome import Outcome
from hlo_audit.plan import Plan, is_cell_id, parse_layers, plan, plan_cell
from hlo_audit.report.frame import tidy_frame
from hlo_audit.report.matrix import MatrixView, matrix_view
from hlo_audit.results import CellResult
from hlo_audit.run import canonical_text, execute
from hlo_audit.scaling import Series
from hlo_audit.usage import InputError

__all__ = ["CellNotLowered", "Plan", "Program", "Unreadable", "analyze_each", "analyze_input", "canonical_text",
           "cell_result", "cell_text", "check", "diff", "dump_launches", "execute", "explain_source", "explain_trees",
           "is_cell_id", "launches_diff", "load_program", "normalized_text", "params_frame", "plan", "plan_cell",
           "report", "scaling", "slopes_by_cell", "update_goldens"]

normalized_text = canonical_text


def check(p: Plan, results: Sequence[CellResult], config_path: str | None = None,
          report_stale: bool = True) -> Outcome:
    """The plan's outcome judged by the gate under the config's policy (``report_stale``: say which goldens have no
    cell; one shard of a sharded run does)."""
    gate = Gate(p.config.gate_policy, regenerate_command(config_path))
    return gate.judge(Outcome.of(p, results), report_stale)


def update_goldens(p: Plan, results: Sequence[CellResult], prune: bool = False) -> GoldenUpdate:
    """Write the goldens of ``results``; with ``prune``, remove hlo-audit's goldens of cells no longer in the matrix."""
    return update(p, results, prune)


def report(p: Plan, results: Sequence[CellResult]) -> MatrixView:
    """The matrix against its goldens, scan pairs and depth scaling, for ``report`` and ``params_frame``."""
    return matrix_view(Outcome.of(p, results))


def scaling(p: Plan, results: Sequence[CellResult]) -> list[Series]:
    return Outcome.of(p, results).series


def slopes_by_cell(p: Plan, results: Sequence[CellResult]) -> dict[str, float]:
    """Each cell's series' entry parameters per layer (cells of a series of one depth have none)."""
    return Outcome.of(p, results).slopes_by_cell


def params_frame(config: str | None = None, only: str | None = None, layers: str | None = None, jobs: int = 1,
                 use_cache: bool = True, refresh: bool = False):
    """The tidy DataFrame of the configured matrix: one row per cell x dtype x role.

    Columns: id, model, scan, quant, layers, platform, stage, dtype, role, count, bytes, golden_count,
    golden_delta (nullable integers: <NA> where there is no golden to compare with). Cells are read from the
    results cache where they are, lowered otherwise; ``only`` and ``layers`` are the CLI's ``--only`` and
    ``--layers``, ``use_cache=False`` and ``refresh`` its ``--no-cache`` and ``--refresh``.
    """
    p = plan(config, only, None, layers)
    return tidy_frame(report(p, list(execute(p, jobs=jobs, use_cache=use_cache, refresh=refresh))))



@dataclass(frozen=True)
class InitRequest:
    """What `hlo-audit init` was asked for: one target kind and its options."""

    kind: str  # "maxtext", "callable" or "nnx"
    models: tuple[str, ...] = ()
    layers: tuple[int, ...] = (2, 4)
    quants: tuple[str, ...] = ()  # maxtext: its quantizations
    function: str = ""  # callable: package.module:function
    factory: str = ""  # nnx: package.module:Factory
    factory_config: str | None = None  # nnx: package.module:callable returning the model's config object
    inputs: tuple[tuple[str, str], ...] = ()  # nnx: argument -> DTYPE[DIMS]
    args: tuple[tuple[str, object], ...] = ()  # nnx: constructor keyword arguments
    labels: str | None = None
    layers_field: str | None = None
    scan_field: str | None = None
    optimizer: str = "adamw"
    learning_rate: float = 1e-4
    shards: int = 2


def init_request(*, nnx: str | None, nnx_config: str | None, function: str | None, maxtext: bool,
                 models: Sequence[str], quant: str | None, layers: str, inputs: Sequence[str], args: Sequence[str],
                 labels: str | None, layers_field: str | None, scan_field: str | None, optimizer: str,
                 learning_rate: float, shards: int) -> InitRequest:
    """`hlo-audit init`'s options as a request: exactly one target kind, depths (no 'full': a scaffold names its
    series), ``NAME=VALUE`` pairs; a bad option is an InputError naming it."""
    kinds = [k for k, given in (("nnx", nnx), ("callable", function), ("maxtext", maxtext)) if given]
    if len(kinds) != 1:
        raise InputError("init: name the target: one of --nnx package.module:Factory, --callable "
                         "package.module:function, --maxtext")
    depths = parse_layers(layers) or []
    if not depths or "full" in depths:
        raise InputError(f"init --layers: give depths such as 2,4, got {layers!r}")
    return InitRequest(
        kind=kinds[0], models=tuple(models), layers=tuple(int(d) for d in depths),
        quants=tuple(q.strip() for q in quant.split(",")) if quant else (), function=function or "",
        factory=nnx or "", factory_config=nnx_config, inputs=tuple(_pairs(inputs, "--input")),
        args=tuple((k, _toml_value(v)) for k, v in _pairs(args, "--arg")), labels=labels,
        layers_field=layers_field, scan_field=scan_field, optimizer=optimizer, learning_rate=learning_rate,
        shards=shards)


def _pairs(values: Sequence[str], option: str) -> list[tuple[str, str]]:
    """``NAME=VALUE`` options as pairs; anything else is a usage error naming the option."""
    pairs = []
    for value in values:
        name, sep, rest = value.partition("=")
        if not sep or not name.strip() or not rest.strip():
            raise InputError(f"{option} expects NAME=VALUE, got {value!r}")
        pairs.append((name.strip(), rest.strip()))
    return pairs


def _toml_value(text: str):
    """``--arg width=16`` gives 16, ``rate=0.1`` 0.1, ``flag=true`` True; anything else stays a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def init_scaffold(folder: Path, request: InitRequest) -> scaffold.Scaffold:
    """The config and workflow for ``request``, the config read back and resolved as any config is (a bad option
    is a ConfigError or InputError naming it, before anything is written). Nothing is overwritten: a file init
    would write that exists already is an InputError naming it."""
    found = scaffold.existing(folder)
    if found:
        raise InputError(f"init: {', '.join(found)} already there in {folder}: init writes only what is not "
                         "(edit the config by hand, or remove them first)")
    library = None
    if request.kind == "maxtext":
        text = scaffold.maxtext_config(request.models or DEFAULTS_MODELS, request.quants or DEFAULTS_QUANTS,
                                       request.layers)
    elif request.kind == "callable":
        if not request.models:
            raise InputError("init --callable: name the models the function lowers (--model NAME, repeatable)")
        text = scaffold.callable_config(request.function, request.models, request.layers)
    else:
        from hlo_audit.targets import nnx  # noqa: PLC0415 (imports jax and the model's library)
        from hlo_audit.targets.nnx_spec import SpecError  # noqa: PLC0415

        try:
            spec = nnx.describe(request.factory, request.factory_config, dict(request.inputs), request.layers_field,
                                request.scan_field, request.labels, dict(request.args) or None)
        except SpecError as exc:
            raise InputError(f"init {exc.key}: {' '.join(str(exc).split())}") from None
        name = request.models[0] if request.models else _model_name(request)
        if len(request.models) > 1:
            raise InputError("init --nnx describes one model (--model NAME); add more to [nnx.models] by hand")
        text = scaffold.nnx_config(name, spec, request.layers, request.optimizer, request.learning_rate)
        library = nnx.library_versions(spec)
    try:
        resolve(validate(tomllib.loads(text), DEFAULT_CONFIG_FILE, folder))
    except ConfigError as exc:
        raise InputError(f"init: the config it would write is refused: {exc}") from None
    return scaffold.Scaffold(config=text, workflow=scaffold.workflow(
        scaffold.install_lines(request.kind, folder, library), request.shards))


DEFAULTS_MODELS = ("llama3-8b", "qwen3-1.7b", "deepseek3-test")
DEFAULTS_QUANTS = ("none", "int8", "fp8", "nanoo_fp8")


def _model_name(request: InitRequest) -> str:
    """A model's name from where it comes from: the config preset (``ModelConfig.qwen3_0p6b`` -> qwen3_0p6b), else
    the factory (``TinyLM`` -> tinylm)."""
    path = request.factory_config or request.factory
    name = path.rpartition(":")[2].rpartition(".")[2].lower()
    if problem := id_part_problem(name):
        raise InputError(f"init: model name {name!r} {problem}: give --model NAME")
    return name
