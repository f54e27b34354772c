"""The user's own argument pytree behind a jit wrapper that flattens it before jax sees it.

``jax.jit`` keeps the pytree a function receives: ``Lowered.args_info`` has its keys (``attribution``). A wrapper
that partitions its arguments first hands jax flat leaves, and the structure only as a static argument, which
``Lowered`` does not keep: equinox's ``filter_jit`` passes ``dynamic_donate['first'][17]`` (the 17th leaf of the
first argument), its ``filter_pmap`` ``_dynamic[1][0]...`` (the first argument inside its own
``(fun, args, dummy, out_axes)`` tuple). Read from that, every path is a position, a new field renames every
later parameter, and layers never fold.

So while a target's function runs, ``recording()`` listens where each known wrapper receives the user's
arguments, and keeps, for the jax ``Lowered`` the wrapper returns, each leaf's keys as jax will flatten them
(``ArgumentPaths``: jax's keypath below ``args_info`` -> the argument's name and its keys, with the node types
above the leaf, which say what a leaf is: optax's state classes, a typed key). ``attribution`` reads it by the
``Lowered`` object (``told``). A wrapper is one entry of ``WRAPPERS``: where it is called and how its flat leaves
map back; one whose module was never imported is never touched. A wrapper not listed keeps jax's keys: the
positions are what is known, and ``count`` shows them as such.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class UserLeaf:
    """One leaf as the user's function received it: the argument's name, the keys below it, and the node types
    above the leaf (outermost first) in the user's pytree."""
    argument: str
    keys: tuple[str, ...]
    chain: tuple[type, ...]


# jax's keypath of an args_info leaf, as key names (("0", "0", "first", "17")) -> the leaf as the user passed it.
ArgumentPaths = dict[tuple[str, ...], UserLeaf]

_TOLD: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def told(lowered) -> ArgumentPaths | None:
    """The user's paths recorded for this jax ``Lowered`` (None where no wrapper flattened its arguments)."""
    try:
        return _TOLD.get(lowered)
    except TypeError:  # an object that cannot be weakly referenced was never recorded
        return None


def key_name(key) -> str:
    for attribute in ("key", "name", "idx"):  # DictKey / FlattenedIndexKey, GetAttrKey, SequenceKey
        if hasattr(key, attribute):
            return str(getattr(key, attribute))
    return str(key)


def state_keys(keypath) -> list[str]:
    """Pytree keys as a state path names them: NNX ``Variable`` and ``Partitioned`` wrappers add a ``.value``
    attribute (inside the path too, where a Variable holds a pytree: AQT's ``qrhs.frozen.value.qvalue.value``),
    which is not part of the state's name. A module named ``value`` (a dict key) stays."""
    from jax.tree_util import GetAttrKey  # noqa: PLC0415 (jax: imported only by what lowers)

    return [key_name(k) for k in keypath if not (isinstance(k, GetAttrKey) and k.name == "value")]


def node_types(treedef) -> list[tuple[type, ...]]:
    """The node types above each leaf of ``treedef``, outermost first, in leaf order."""
    chains: list[tuple[type, ...]] = []
    stack = [(treedef, ())]
    while stack:
        node, chain = stack.pop()
        data = node.node_data()
        if data is None:  # a leaf
            chains.append(chain)
            continue
        stack.extend((child, (*chain, data[0])) for child in reversed(node.children()))
    return chains



def _leaves(tree, prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], tuple[type, ...]]]:
    """(keys, node types above) of every leaf of ``tree`` in jax's flatten order. Every leaf counts, arrays or
    not: equinox's partitions keep a non-array's position (as None, which jax then drops)."""
    import jax  # noqa: PLC0415 (only where a wrapper was called: jax is imported)

    flat, treedef = jax.tree_util.tree_flatten_with_path(tree)
    chains = node_types(treedef)
    if len(chains) != len(flat):
        chains = [()] * len(flat)
    return [((*prefix, *state_keys(path)), chain) for (path, _), chain in zip(flat, chains)]


def _parameter_names(function, count: int) -> list[str]:
    """The names of ``count`` positional arguments of ``function`` or of its ``inspect.Signature``
    (``args.N`` past a ``*args``, ``argN`` where the signature cannot be read)."""
    try:
        signature = function if isinstance(function, inspect.Signature) else inspect.signature(function)
    except (TypeError, ValueError):
        return [f"arg{i}" for i in range(count)]
    parameters = list(signature.parameters.values())
    names: list[str] = []
    for parameter in parameters:
        if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            names.extend(f"{parameter.name}.{i}" for i in range(count - len(names)))
            break
        if parameter.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
            names.append(parameter.name)
    names.extend(f"arg{i}" for i in range(len(names), count))
    return names[:count]


def _equinox_jit(jit_wrapper, args, kwargs) -> dict[str, list[UserLeaf]]:
    """equinox.filter_jit: ``first`` is the first argument's leaves, ``rest`` those of ``(args[1:] + (None,),
    kwargs)`` and ``fun`` the wrapped callable's, each flattened whole (a non-array leaf keeps its position as
    None, which jax drops: a kept leaf's index is its index among all the user's leaves)."""
    bound = jit_wrapper._signature.bind(*args, **kwargs)  # noqa: SLF001 (equinox binds with this signature)
    positional = (*bound.args, None)
    names = _parameter_names(jit_wrapper._signature, len(bound.args))  # noqa: SLF001
    first = [UserLeaf(names[0] if names else "arg0", keys, chain) for keys, chain in _leaves(positional[0])]
    rest = []
    for keys, chain in _leaves((positional[1:], dict(bound.kwargs))):
        if keys[0] == "0":  # the positional tuple: keys[1] is the index after the first argument
            index = int(keys[1]) + 1
            argument = names[index] if index < len(names) else f"arg{index}"
            rest.append(UserLeaf(argument, keys[2:], chain[2:]))
        else:
            rest.append(UserLeaf(keys[1], keys[2:], chain[2:]))
    fun = [UserLeaf("fun", keys, chain) for keys, chain in _leaves(getattr(jit_wrapper, "_dynamic_fun", None))]
    return {"first": first, "rest": rest, "fun": fun}


def _equinox_jit_paths(jit_wrapper, args, kwargs, lowered) -> ArgumentPaths:
    """jax's keypaths of a filter_jit lowering: ``((dynamic_donate, dynamic_nodonate), {})``, each a dict of the
    three parts, each a tuple of leaves."""
    parts = _equinox_jit(jit_wrapper, args, kwargs)
    import jax  # noqa: PLC0415

    found: ArgumentPaths = {}
    for keypath, _ in jax.tree_util.tree_flatten_with_path(lowered.args_info)[0]:
        names = tuple(key_name(k) for k in keypath)
        if len(names) == 4 and names[2] in parts and names[3].isdigit() and int(names[3]) < len(parts[names[2]]):
            found[names] = parts[names[2]][int(names[3])]
    return found


def _equinox_pmap_paths(pmap_wrapper, args, kwargs, lowered) -> ArgumentPaths:
    """equinox.filter_pmap: jax's one argument is ``(fun, args, dummy, out_axes)`` with non-arrays as None, so a
    leaf's keypath is ``(0, 0, 1, <argument index>, *keys)`` for an argument and ``(0, 0, 0, *keys)`` for the
    callable's own arrays."""
    import jax  # noqa: PLC0415

    function = pmap_wrapper._fun  # noqa: SLF001 (equinox keeps the wrapped function here)
    names = _parameter_names(function, len(args))
    user = {("1", *keys): chain for keys, chain in _leaves(tuple(args))}
    user.update({("0", *keys): chain for keys, chain in _leaves(function)})
    found: ArgumentPaths = {}
    for keypath, _ in jax.tree_util.tree_flatten_with_path(lowered.args_info)[0]:
        names_here = tuple(key_name(k) for k in keypath)
        below = names_here[2:]
        if below not in user:
            continue
        chain = user[below]
        if below[0] == "1" and len(below) > 1 and below[1].isdigit() and int(below[1]) < len(names):
            found[names_here] = UserLeaf(names[int(below[1])], below[2:], chain[2:])
        elif below[0] == "0":
            found[names_here] = UserLeaf("fun", below[1:], chain[1:])
    return found


@dataclass(frozen=True)
class Wrapper:
    """Where a jit wrapper receives the user's arguments: ``owner`` (a module) and ``attribute`` (a function of
    that module, or ``Class.method``) called as ``(wrapper, is_lower, args, kwargs)`` and returning an object whose
    ``.lowered`` is jax's ``Lowered`` when ``is_lower``; ``paths`` reads the user's leaves back from them."""
    owner: str
    attribute: str
    paths: Callable[..., ArgumentPaths]


WRAPPERS = (
    Wrapper("equinox._jit", "_call", _equinox_jit_paths),
    Wrapper("equinox._vmap_pmap", "_PmapWrapper._call", _equinox_pmap_paths),
)


def _listened(wrapper: Wrapper, original):
    def call(first, is_lower, args, kwargs):
        result = original(first, is_lower, args, kwargs)
        lowered = getattr(result, "lowered", None) if is_lower else None
        if lowered is not None:
            try:
                _TOLD[lowered] = wrapper.paths(first, args, kwargs, lowered)
            except Exception:  # noqa: BLE001 (a wrapper's other version: keep jax's keys rather than fail the cell)
                pass
        return result
    return call


@contextlib.contextmanager
def recording() -> Iterator[None]:
    """Listen where each imported wrapper of ``WRAPPERS`` receives the user's arguments, for the duration."""
    restore = []
    for wrapper in WRAPPERS:
        module = sys.modules.get(wrapper.owner)
        if module is None:
            continue
        holder_name, _, name = wrapper.attribute.rpartition(".")
        holder = getattr(module, holder_name, None) if holder_name else module
        original = getattr(holder, name, None) if holder is not None else None
        if original is None:
            continue
        setattr(holder, name, _listened(wrapper, original))
        restore.append((holder, name, original))
    try:
        yield
    finally:
        for holder, name, original in reversed(restore):
            setattr(holder, name, original)
