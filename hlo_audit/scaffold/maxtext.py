"""``hlo-audit init --maxtext``: MaxText's train step for the user's models (the MaxText installed: in a
contributor's checkout, their branch)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from hlo_audit.scaffold.base import HEADER, InitRequest, KindConfig, TargetScaffold, owns_package, pins, toml_value

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
        return KindConfig("\n".join(lines) + "\n")

    def install(self, folder: Path, library: Mapping[str, str] | None) -> list[str]:
        lines = [f'pip install "hlo-audit[maxtext]" {pins(["jax", "jaxlib", "flax", "maxtext"])}'.rstrip()]
        if owns_package(folder):
            # A MaxText checkout over the release: the gate lowers this branch's MaxText, the release brings what its
            # train step imports.
            lines.append("pip install --no-deps -e .  # this checkout's MaxText over the release")
        return lines
