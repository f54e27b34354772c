"""Entry parameter paths from jax's own ``args_info``, for lowerings the tool made itself.

The HLO text only carries mangled names (``state__model____to_nnx__rngs____key___value``), which cannot be
inverted exactly when keys contain underscores runs. ``Lowered.args_info`` has the real pytree keys. jax
prunes unused arguments before lowering, so each kept argument is matched to its entry parameter through
the lowering's ``kept_var_idx`` (jax has no public view of it; without it the paths are used only when the
counts agree one to one).
"""

from __future__ import annotations

import jax

from hlo_audit.hlo.params import path_from_mangled_name
from hlo_audit.hlo.text import HloModule


def _key_name(key) -> str:
    for attribute in ("key", "name", "idx"):  # DictKey / FlattenedIndexKey, GetAttrKey, SequenceKey
        if hasattr(key, attribute):
            return str(getattr(key, attribute))
    return str(key)


def _kept_indices(lowered: jax.stages.Lowered, count: int) -> list[int] | None:
    try:
        lowering = lowered._lowering  # noqa: SLF001 (no public API for pruned arguments)
        kept = lowering.compile_args["kept_var_idx"]
        offset = len(getattr(lowering, "const_args", ()) or ())
    except (AttributeError, KeyError, TypeError):
        return None
    return [i for i in range(count) if i + offset in kept]


def arg_paths(lowered: jax.stages.Lowered, module: HloModule) -> tuple[str, ...] | None:
    """One dotted path per entry parameter, in parameter order; None when the match is not certain."""
    leaves, _ = jax.tree_util.tree_flatten_with_path(lowered.args_info)
    params = module.entry.parameters
    kept = _kept_indices(lowered, len(leaves))
    if kept is None:
        kept = list(range(len(leaves))) if len(leaves) == len(params) else None
    if kept is None or len(kept) != len(params):
        return None
    paths = []
    for index, param in zip(kept, params, strict=True):
        keypath, _ = leaves[index]
        # keypath = (args-or-kwargs, argument index or name, *keys). jax named the parameter after the
        # argument, so the argument's name is the first component of the decoded text name.
        keys = [_key_name(k) for k in keypath[2:]]
        if keys and keys[-1] == "value":  # NNX Variable.value
            keys.pop()
        root = path_from_mangled_name(param.name).split(".", 1)[0]
        paths.append(".".join([root, *keys]))
    return tuple(paths)
