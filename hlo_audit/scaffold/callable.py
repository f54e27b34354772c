"""``hlo-audit init --callable package.module:function``: a function that lowers each cell."""

from __future__ import annotations

from hlo_audit.scaffold.base import HEADER, InitRequest, KindConfig, TargetScaffold, toml_value
from hlo_audit.usage import InputError


class CallableScaffold(TargetScaffold):
    kind = "callable"
    option = "--callable package.module:function"

    def config(self, request: InitRequest) -> KindConfig:
        if not request.models:
            raise InputError("init --callable: name the models the function lowers (--model NAME, repeatable)")
        if request.fields:
            raise InputError("init --set: a callable target's function builds its model's config itself (--set is "
                             "for --nnx and --maxtext)")
        lines = [HEADER, f"target = {toml_value(request.function)}  # called with each cell: see docs/configuration.md",
                 f"models = {toml_value(list(request.models))}", f"layers = {toml_value(list(request.layers))}",
                 '# quant: a free variant axis here: the function reads cell.quant ("none" unless you name others)',
                 'quant = ["none"]']
        return KindConfig("\n".join(lines) + "\n")
