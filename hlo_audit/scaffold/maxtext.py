"""``hlo-audit init --maxtext``: MaxText's train step for the user's models (the MaxText installed: in a
contributor's checkout, their branch)."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from hlo_audit.config import DEFAULTS
from hlo_audit.scaffold.base import (
    HEADER,
    InitRequest,
    KindConfig,
    TargetScaffold,
    imported_lines,
    owns_package,
    pins,
    toml_key,
    toml_value,
    tool_pin,
)
from hlo_audit.scaffold.imports import Requirement
from hlo_audit.usage import InputError

DEFAULT_MODELS = ("llama3-8b", "qwen3-1.7b", "deepseek3-test")
DEFAULT_QUANTS = ("none", "int8", "fp8", "nanoo_fp8")


class MaxTextScaffold(TargetScaffold):
    kind = "maxtext"
    option = "--maxtext"

    def config(self, request: InitRequest) -> KindConfig:
        """The default matrix's CPU series, with the user's models and quants."""
        lines = [HEADER, 'target = "maxtext"  # the MaxText installed: in a contributor\'s checkout, their branch',
                 f"models = {toml_value(list(request.models or DEFAULT_MODELS))}",
                 f"quant = {toml_value(list(request.quants or DEFAULT_QUANTS))}",
                 f"layers = {toml_value(list(request.layers))}", 'scan = ["on", "off"]']
        if request.fields:  # --set: MaxText config keys for every model, over the defaults the table would drop
            _known_keys(name for name, _ in request.fields)
            lines += ["", "[overrides]  # MaxText config keys per model (init --set)"]
            lines += [f"{toml_key(m)} = {toml_value({**DEFAULTS['overrides'].get(m, {}), **dict(request.fields)})}"
                      for m in request.models or DEFAULT_MODELS]
        return KindConfig("\n".join(lines) + "\n")

    def install(self, folder: Path, library: Mapping[str, str] | None,
                imported: Sequence[Requirement] = ()) -> list[str]:
        pinned = ["jax", "jaxlib", "flax", "maxtext"]
        lines = [f'pip install {tool_pin("[maxtext]")} {pins(pinned)}'.rstrip()]
        if owns_package(folder):
            # A MaxText checkout over the release: the gate lowers this branch's MaxText, the release brings what its
            # train step imports.
            lines.append("pip install --no-deps -e .  # this checkout's MaxText over the release")
        return lines + imported_lines(folder, imported, leave_out=pinned)


def _known_keys(names: Iterable[str]) -> None:
    """Every ``--set`` key is one of MaxText's base.yml (every key MaxText's config takes is there); an InputError
    naming the first that is not. Without MaxText installed there is nothing to check against: lowering says."""
    spec = importlib.util.find_spec("maxtext")
    base = Path(spec.submodule_search_locations[0]) / "configs" / "base.yml" if spec and \
        spec.submodule_search_locations else None
    if base is None or not base.is_file():
        return
    import yaml  # noqa: PLC0415 (PyYAML comes with MaxText, not with hlo-audit's core)

    known = yaml.safe_load(base.read_text()) or {}
    for name in names:
        if name not in known:
            raise InputError(f"init --set {name}: MaxText's config has no key {name!r} (its keys are in {base})")
