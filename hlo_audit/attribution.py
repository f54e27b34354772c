"""Entry parameter paths from jax's own ``args_info``, for lowerings the tool made itself.

The HLO text only carries mangled names (``state__model____to_nnx__rngs____key___value``), which cannot be
inverted exactly when keys contain runs of underscores. ``Lowered.args_info`` has the real pytree keys. jax
prunes unused arguments before lowering, so each kept argument is matched to its entry parameter through
the lowering's ``kept_var_idx`` (jax has no public view of it; without it the text's names are used).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import jax


def key_name(key) -> str:
    for attribute in ("key", "name", "idx"):  # DictKey / FlattenedIndexKey, GetAttrKey, SequenceKey
        if hasattr(key, attribute):
            return str(getattr(key, attribute))
    return str(key)


def parameter_numbers(lowered: jax.stages.Lowered, count: int) -> list[int | None] | None:
    """Entry parameter number of each of ``count`` flattened arguments (None where jit pruned it).

    None overall when jax hides the pruning. Constants jax hoisted to arguments come first and take the
    first numbers.
    """
    try:
        lowering = lowered._lowering  # noqa: SLF001 (no public API for pruned arguments)
        kept = lowering.compile_args["kept_var_idx"]
        offset = len(getattr(lowering, "const_args", ()) or ())
    except (AttributeError, KeyError, TypeError):
        return None
    numbers: list[int | None] = []
    next_number = offset
    for index in range(count):
        if index + offset in kept:
            numbers.append(next_number)
            next_number += 1
        else:
            numbers.append(None)
    return numbers


def arg_keys(lowered: jax.stages.Lowered) -> tuple[tuple[str, ...], ...] | None:
    """The pytree keys of each argument jax kept, in entry parameter order; None when that order is unknown.

    The keys start below the argument itself (``("model", "decoder", ...)`` for ``state``): jax named the
    parameter after the argument, so the analysis takes the argument's name from the HLO text and the keys
    from here (``entry_params``), without parsing the module twice.
    """
    import jax  # noqa: PLC0415 (jax: imported only by what lowers; stage optimized's child sets up first)

    leaves, _ = jax.tree_util.tree_flatten_with_path(lowered.args_info)
    numbers = parameter_numbers(lowered, len(leaves))
    if numbers is None:
        return None
    # With hoisted constants the count differs from the parameters', and entry_params uses the text.
    result = []
    for (keypath, _), number in zip(leaves, numbers):
        if number is None:
            continue
        keys = state_keys(keypath[2:])  # (args-or-kwargs, argument, *keys)
        if keys and keys[-1] == "value":  # NNX Variable.value
            keys.pop()
        result.append(tuple(keys))
    return tuple(result)


def state_keys(keypath) -> list[str]:
    """Pytree keys as a state path names them: NNX ``Variable`` and ``Partitioned`` wrappers add a ``.value``
    attribute (inside the path too, where a Variable holds a pytree: AQT's ``qrhs.frozen.value.qvalue.value``),
    which is not part of the state's name. A module named ``value`` (a dict key) stays."""
    from jax.tree_util import GetAttrKey  # noqa: PLC0415 (jax: imported only by what lowers)

    return [key_name(k) for k in keypath if not (isinstance(k, GetAttrKey) and k.name == "value")]
