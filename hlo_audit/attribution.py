"""Entry parameter paths from jax's own ``args_info``, for lowerings the tool made itself.

The HLO text only carries mangled names (``state__model____to_nnx__rngs____key___value``), which cannot be
inverted exactly when keys contain runs of underscores. ``Lowered.args_info`` has the real pytree keys. jax
prunes unused arguments before lowering, so each kept argument is matched to its entry parameter through
the lowering's ``kept_var_idx`` (jax has no public view of it; without it the text's names are used).
"""

from __future__ import annotations

import jax



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


def arg_keys(lowered: jax.stages.Lowered) -> tuple[tuple[str, ...], ...] | None:
    """The pytree keys of each argument jax kept, in entry parameter order; None when that order is unknown.

    The keys start below the argument itself (``("model", "decoder", ...)`` for ``state``): jax named the
    parameter after the argument, so the analysis takes the argument's name from the HLO text and the keys
    from here (``entry_params``), without parsing the module twice.
    """
    leaves, _ = jax.tree_util.tree_flatten_with_path(lowered.args_info)
    kept = _kept_indices(lowered, len(leaves))
    if kept is None:
        return None
    result = []
    for index in kept:
        keypath, _ = leaves[index]
        keys = [_key_name(k) for k in keypath[2:]]  # (args-or-kwargs, argument, *keys)
        if keys and keys[-1] == "value":  # NNX Variable.value
            keys.pop()
        result.append(tuple(keys))
    return tuple(result)
