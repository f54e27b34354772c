"""``hlo-audit init --callable package.module:function``: a function that lowers each cell."""

from __future__ import annotations

from hlo_audit.lowering import TargetError
from hlo_audit.scaffold.base import HEADER, InitRequest, KindConfig, TargetScaffold, toml_value
from hlo_audit.usage import InputError


class CallableScaffold(TargetScaffold):
    kind = "callable"
    option = "--callable package.module:function"
    # A function's goldens are made with jax and jaxlib; flax only where it imports flax, and then the workflow
    # installs it with what else it imports (``imported_lines``): a plain-JAX target's runner needs no flax.
    pinned = ("jax", "jaxlib")

    def config(self, request: InitRequest) -> KindConfig:
        if not request.models:
            raise InputError("init --callable: name the models the function lowers (--model NAME, repeatable)")
        if request.fields:
            raise InputError("init --set: a callable target's function builds its model's config itself (--set is "
                             "for --nnx and --maxtext)")
        declared = _declared_quant(request.function)
        quant = (["# quant: the values the function declares (its quant attribute): the cells it lowers",
                  f"quant = {toml_value(declared)}"] if declared else
                 ['# quant: a free variant axis here: the function reads cell.quant ("none" unless you name others)',
                  'quant = ["none"]'])
        lines = [HEADER, f"target = {toml_value(request.function)}  # called with each cell: see docs/configuration.md",
                 f"models = {toml_value(list(request.models))}", f"layers = {toml_value(list(request.layers))}",
                 *quant]
        return KindConfig("\n".join(lines) + "\n")


def _declared_quant(spec: str) -> list[str] | None:
    """The quant values a function declares (``lower.quant = ["base"]``), for init to write the config it accepts:
    ``quant = ["none"]`` beside such a function was refused by its own validation (``resolve``). None where the
    function declares none, or none that reads as a list of names: the config's validation says what is wrong."""
    from hlo_audit.targets import get_target  # noqa: PLC0415 (imports the user's module, as resolving it does)

    try:
        declared = getattr(getattr(get_target(spec), "function", None), "quant", None)
    except TargetError:
        return None  # the config's validation names it
    declared = [declared] if isinstance(declared, str) else declared
    if not isinstance(declared, (list, tuple)) or not declared or not all(isinstance(v, str) for v in declared):
        return None
    return list(dict.fromkeys(declared))
