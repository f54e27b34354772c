"""Targets: what lowers a cell. ``get_target(spec)`` picks the implementation by the config's ``target``."""

from __future__ import annotations

import importlib

from hlo_audit import host

# Built-in targets by name: module and class, imported only when a config names them (MaxText imports jax).
BUILTIN = {"maxtext": ("hlo_audit.targets.maxtext", "MaxTextTarget")}


def get_target(spec: str):
    """``maxtext`` or ``package.module:function`` (a user's callable)."""
    host.cpu_backend_only_without_accelerators()  # for library callers too, not only the processes hlo-audit owns
    module, name = BUILTIN.get(spec, ("hlo_audit.targets.callable", "CallableTarget"))
    implementation = getattr(importlib.import_module(module), name)
    return implementation() if spec in BUILTIN else implementation(spec)
