"""``hlo-audit init --nnx package.module:Factory``: the stock NNX target for one model of a library, described
from its signatures and a forward pass (``targets.nnx_describe.describe``)."""

from __future__ import annotations

from collections.abc import Mapping

from hlo_audit import preflight
from hlo_audit.matrix import id_part_problem
from hlo_audit.scaffold.base import HEADER, InitRequest, KindConfig, TargetScaffold, assignments, toml_key, toml_value
from hlo_audit.targets import missing_stack
from hlo_audit.targets.nnx_spec import TARGET
from hlo_audit.usage import InputError


class NnxScaffold(TargetScaffold):
    kind = "nnx"
    option = "--nnx package.module:Factory"
    pinned = ("jax", "jaxlib", "flax", "optax")

    def config(self, request: InitRequest) -> KindConfig:
        if problem := missing_stack(self.kind):  # describing the model runs flax
            raise InputError(f"init --nnx: {problem}")
        preflight.check_jax_variables()
        from hlo_audit.targets import nnx, nnx_describe  # noqa: PLC0415 (imports jax and the model's library)
        from hlo_audit.targets.nnx_spec import SpecError  # noqa: PLC0415

        try:
            spec = nnx_describe.describe(request.factory, request.factory_config, dict(request.inputs),
                                         request.layers_field, request.scan_field, request.labels,
                                         dict(request.args) or None, dict(request.fields) or None)
        except SpecError as exc:
            raise InputError(f"init {exc.key}: {' '.join(str(exc).split())}") from None
        name = request.models[0] if request.models else model_name(request)
        if len(request.models) > 1:
            raise InputError("init --nnx describes one model (--model NAME); add more to [nnx.models] by hand")
        return KindConfig(config_text(name, spec, request.layers, request.optimizer, request.learning_rate),
                          nnx.library_versions(spec))


def config_text(name: str, spec: Mapping, layers, optimizer: str, learning_rate: float) -> str:
    """The stock NNX target for one model of a library (``spec``: ``targets.nnx_describe.describe``'s)."""
    scan = ("# scan: on and off (the model's config has the switch below)" if "scan" in spec
            else "# scan: off only (the model names no layer-scan switch)")
    lines = [HEADER, f'target = "{TARGET}"  # a Flax NNX model in a standard train step: docs/nnx.md',
             f"models = {toml_value([name])}", f"layers = {toml_value(list(layers))}", scan, "",
             "[nnx]  # shared by every model", f"optimizer = {toml_value(optimizer)}",
             f"learning_rate = {toml_value(learning_rate)}", "", f"[nnx.models.{toml_key(name)}]"]
    lines += assignments({k: v for k, v in spec.items()})
    return "\n".join(lines) + "\n"


def model_name(request: InitRequest) -> str:
    """A model's name from where it comes from: the config preset (``ModelConfig.qwen3_0p6b`` -> qwen3_0p6b), else
    the factory (``TinyLM`` -> tinylm)."""
    path = request.factory_config or request.factory
    name = path.rpartition(":")[2].rpartition(".")[2].lower()
    if problem := id_part_problem(name):
        raise InputError(f"init: model name {name!r} {problem}: give --model NAME")
    return name
