"""Targets: what lowers a cell. ``get_target(spec)`` picks the implementation by the config's ``target``."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Mapping

from hlo_audit import host, preflight
from hlo_audit.lowering import TargetError

# Built-in targets by name: module and class, imported only when a config names them (they import jax).
BUILTIN = {
    "maxtext": ("hlo_audit.targets.maxtext", "MaxTextTarget"),
    "nnx": ("hlo_audit.targets.nnx", "NnxTarget"),  # a Flax NNX library's model, described in the config
}


# What a built-in target imports beyond hlo-audit's core (jax, jaxlib, typer, rich, pandas), and the extra that
# brings it: a plain-JAX install has no flax (issue 40), and a target asked for without its stack is one line.
STACKS: dict[str, tuple[tuple[str, ...], str]] = {
    "maxtext": (("flax",), "maxtext"),  # MaxText itself, when missing, is its cells' to say (unavailable)
    "nnx": (("flax", "optax"), "flax"),
}


# MaxText needs Python >= 3.12: on 3.11 its extra installs nothing (pyproject.toml's markers), and says why here.
_MAXTEXT_PYTHON = "" if sys.version_info >= (3, 12) else (f", which needs Python >= 3.12: this is "
                                                          f"{sys.version_info.major}.{sys.version_info.minor}")


def missing_stack(spec: str) -> str | None:
    """Why the built-in target ``spec`` cannot run here (a module of its stack is not installed: what to install,
    in one line), or None. Only looks (``find_spec``): nothing is imported."""
    needs, extra = STACKS.get(spec, ((), ""))
    missing = [module for module in needs if importlib.util.find_spec(module) is None]
    if not missing:
        return None
    python = _MAXTEXT_PYTHON if extra == "maxtext" else ""
    return (f"target {spec!r} needs {' and '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} not "
            f"installed here: pip install 'hlo-audit[{extra}]'{python}")


def get_target(spec: str, models: Mapping[str, Mapping] | None = None):
    """``maxtext``, ``nnx`` or ``package.module:function`` (a user's callable). ``models``: the config's model
    descriptions, for a target that answers ``full_depth`` from them (``nnx``; its cells carry their own)."""
    host.cpu_backend_only_without_accelerators()  # for library callers too, not only the processes hlo-audit owns
    preflight.check_jax_variables()  # every target imports jax: a JAX_* value it refuses is one line, not a cell's
    if problem := missing_stack(spec):
        raise TargetError(problem)
    module, name = BUILTIN.get(spec, ("hlo_audit.targets.callable", "CallableTarget"))
    try:
        implementation = getattr(importlib.import_module(module), name)
    except ModuleNotFoundError as exc:
        if spec not in BUILTIN:
            raise
        # The built-in target's own stack is an extra (MaxText: pip install "hlo-audit[maxtext]"): name what is
        # missing in one line, not a traceback.
        raise TargetError(f"target {spec!r} needs {exc.name!r}, which is not installed here (for MaxText: "
                          f"pip install 'hlo-audit[maxtext]'{_MAXTEXT_PYTHON})") from None
    if spec == "nnx":
        return implementation(models)
    return implementation() if spec in BUILTIN else implementation(spec)
