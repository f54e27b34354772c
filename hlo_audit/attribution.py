"""Entry parameter paths and kinds from jax's own ``args_info``, for lowerings the tool made itself.

The HLO text only carries mangled names (``state__model____to_nnx__rngs____key___value``), which cannot be
inverted exactly when keys contain runs of underscores. ``Lowered.args_info`` has the real pytree keys, and
``Lowered.in_tree`` the type of every node above each leaf: what the leaf *is* (``arg_leaves``). jax prunes
unused arguments before lowering, so each kept argument is matched to its entry parameter through the
lowering's ``kept_var_idx`` (jax has no public view of it; without it the text's names are used).

What the leaves and keypaths hold, measured with jax 0.12.0.1 / flax 0.12.12:

* ``jax.jit`` over ``nnx.split``'s state (MaxText's train step, the shipped examples): the argument is an
  ``nnx.State`` of nested dicts whose leaves are ``nnx.Variable`` nodes (``Param``, ``RngKey``, ``RngCount``,
  ``OptState`` / ``OptArray`` / ``OptVariable`` for ``nnx.Optimizer``'s step and optax state, and for a Linen
  collection bridged by name a type made for it, e.g. ``_overwrite_with_gradient``), each with one child, its
  value (keypath ``...['key'].value``); an ``RngKey`` holds a typed key (``key<fry>[]``, ``u32[2]`` in HLO).
  ``nnx.State`` keeps no ``Rngs`` / ``RngStream`` / optax node types: those are dicts by then.
* ``nnx.jit`` (graph mode, flax's default): the argument becomes ``NodeStates(_graphdef, states)``, ``states``
  a tuple of flat leaf lists: the keypath is ``.states[0][17]`` and the real path only in the ``GraphDef``.
  Merging that graphdef with the ``ArgInfo`` leaves rebuilds the module (no array is made), and its
  ``nnx.state`` gives each leaf's real path and ``Variable`` type, by the leaf's identity.
* plain pytrees: typed PRNG keys say so in their dtype; optax states are named tuples of optax's classes;
  flax's ``TrainState`` is a struct whose fields are ``params``, ``opt_state`` and ``step``.

What the text cannot say, it is told (``name_parameters``): an entry parameter whose name does not read back as
the path found here (every ``nnx.jit`` leaf: ``model_states_0__17_``) is renamed in the module's text to one that
does, so the text the tool stores and prints (goldens, ``lower``) names the paths ``check`` reads from args_info.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from hlo_audit.hlo.params import (
    KIND_KEY,
    ArgLeaf,
    attributed_path,
    kind_role,
    name_role,
    path_from_keystr,
    path_from_mangled_name,
    rng_stream_pairs,
)
from hlo_audit.hlo.shapes import parse_shape
from hlo_audit.wrapped_args import key_name, node_types, state_keys, told

if TYPE_CHECKING:
    import jax

# NNX variable types that say what a leaf is, most derived first (Perturbation is an Intermediate, OptArray and
# OptVariable are OptState: nnx.Optimizer's step is the base class itself).
_NNX_KINDS = ("RngKey", "RngCount", "Param", "BatchStat", "Cache", "Perturbation", "Intermediate",
              "OptArray", "OptVariable", "OptState")
_TRAIN_STATE_FIELDS = ("params", "opt_state", "step")


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
    parameter after the argument, so the analysis takes the argument's name from ``arg_leaves`` (or the HLO
    text) and the keys from here (``entry_params``), without parsing the module twice. A leaf of an ``nnx.jit``
    argument gets its state path (``("layers_0", "dropout", "rngs", "key")``), not jit's ``states.0.17``.
    """
    kept = _kept(lowered)
    return None if kept is None else tuple(keys for keys, _, _ in kept)


def call_leaves(lowered: jax.stages.Lowered) -> int | None:
    """How many leaves the call's arguments have, pruned ones included (jax flattens each one per call and checks its
    signature, whether or not the entry takes it); None where jax gives no ``args_info``."""
    import jax  # noqa: PLC0415

    try:
        return len(jax.tree.leaves(lowered.args_info))
    except (AttributeError, TypeError, ValueError):
        return None


def arg_leaves(lowered: jax.stages.Lowered) -> tuple[ArgLeaf, ...] | None:
    """Each kept argument's name and kind (``hlo.params.ArgLeaf``), in entry parameter order, like ``arg_keys``."""
    kept = _kept(lowered)
    return None if kept is None else tuple(ArgLeaf(argument, kind) for _, argument, kind in kept)


def _kept(lowered) -> list[tuple[tuple[str, ...], str | None, str | None]] | None:
    """(keys below the argument, argument name, kind) of every argument jit kept, in entry parameter order."""
    import jax  # noqa: PLC0415 (jax: imported only by what lowers; stage optimized's child sets up first)

    leaves, _ = jax.tree_util.tree_flatten_with_path(lowered.args_info)
    numbers = parameter_numbers(lowered, len(leaves))
    if numbers is None:
        return None
    # With hoisted constants the count differs from the parameters', and entry_params uses the text.
    chains = node_types(lowered.in_tree)
    if len(chains) != len(leaves):
        chains = [()] * len(leaves)
    graph = _graph_leaves(lowered.args_info)
    names = _argument_names(lowered, len(leaves))
    user = told(lowered) or {}  # behind a wrapper that flattened the user's pytree first (equinox's)
    result = []
    for i, ((keypath, leaf), chain, number) in enumerate(zip(leaves, chains, numbers)):
        if number is None:
            continue
        if (received := user.get(tuple(map(key_name, keypath)))) is not None:
            keys = [*received.keys[:-1], *[k for k in received.keys[-1:] if k != "value"]]
            result.append((tuple(keys), received.argument, _kind(None, received.chain, received.keys, leaf)))
            continue
        argument = _argument(names[i], keypath) if names else None
        if id(leaf) in graph:  # a leaf of an nnx.jit argument: its real path and Variable type
            keys, variable = graph[id(leaf)]
            result.append((keys, argument, _kind(variable, (), (), leaf)))
            continue
        keys = state_keys(keypath[2:])  # (args-or-kwargs, argument, *keys)
        if keys and keys[-1] == "value":  # NNX Variable.value
            keys.pop()
        result.append((tuple(keys), argument, _kind(None, chain, keypath, leaf)))
    return result


def _argument_names(lowered, count: int) -> list[str] | None:
    """jax's name of each flattened argument (``state['model']['decoder']...``: the argument's own name, then
    the key string), which the HLO name mangles; None where jax does not say."""
    try:
        info = lowered._lowering.compile_args["all_args_info"]  # noqa: SLF001 (no public view of debug info)
        names = list(info.debug_info.arg_names)
    except (AttributeError, KeyError, TypeError):
        return None
    return names if len(names) == count and all(isinstance(n, str) for n in names) else None


def _argument(name: str, keypath) -> str | None:
    """The function argument's name: jax's name of the leaf less the key string of its keys. A function that
    takes ``*args`` (what ``nnx.grad`` wraps a step in) has jax name them ``args[0]``: that is ``args.0``."""
    from jax.tree_util import keystr  # noqa: PLC0415

    suffix = keystr(tuple(keypath[2:]))
    if suffix and name.endswith(suffix):
        name = name[: -len(suffix)]
    return name if name.isidentifier() else path_from_keystr(name)


def _nnx():
    """flax.nnx when something imported it: a pytree cannot hold NNX types otherwise, so this never imports it."""
    return sys.modules.get("flax.nnx")


def _graph_leaves(args_info) -> dict[int, tuple[tuple[str, ...], type | None]]:
    """id(ArgInfo) -> (state path keys, NNX Variable type or None) for the leaves of ``nnx.jit``'s arguments."""
    nnx = _nnx()
    extract = sys.modules.get("flax.nnx.extract")
    if nnx is None or extract is None:
        return {}
    import jax  # noqa: PLC0415

    node_states = extract.NodeStates
    found: dict[int, tuple[tuple[str, ...], type | None]] = {}
    flat, _ = jax.tree_util.tree_flatten_with_path(args_info, is_leaf=lambda x: isinstance(x, node_states))
    for prefix, node in flat:
        if not isinstance(node, node_states) or node._graphdef is None:  # noqa: SLF001 (graphdef raises without)
            continue
        try:
            module = nnx.merge(node.graphdef, *node.states)  # ArgInfo leaves: rebuilds the graph, no arrays
            state = nnx.to_flat_state(nnx.state(module))
        except Exception:  # noqa: BLE001 (a graph flax cannot rebuild from ArgInfo keeps jit's keys)
            continue
        outer = state_keys(prefix[2:])  # a module inside a tuple or dict argument: the keys above it
        for path, variable in state:
            is_variable = isinstance(variable, nnx.Variable)
            value = variable.get_value() if is_variable else variable
            # A Variable may hold a pytree (qwix's QuantStat: {count, sum_of_absmax}): one leaf per array.
            for inner, leaf in jax.tree_util.tree_flatten_with_path(value)[0]:
                keys = (*outer, *map(str, path), *state_keys(inner))
                found[id(leaf)] = (keys, type(variable) if is_variable else None)
    return found


def _kind(variable: type | None, chain: tuple[type, ...], keypath, leaf) -> str | None:
    """What a leaf is, from its NNX Variable type (``variable``, or the innermost in ``chain``), a typed key's
    dtype, flax's TrainState field above it, or optax's state class above it; None if no type says."""
    import jax  # noqa: PLC0415

    nnx = _nnx()
    if variable is None and nnx is not None:
        variable = next((t for t in reversed(chain) if isinstance(t, type) and issubclass(t, nnx.Variable)), None)
    kind = _variable_kind(nnx, variable) if variable is not None else None
    dtype = getattr(leaf, "dtype", None)
    if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key) and kind != "nnx.RngKey":
        return "prng_key"
    if kind is not None:
        return kind
    train_state = sys.modules.get("flax.training.train_state")
    for depth, node_type in enumerate(chain):
        if train_state is not None and isinstance(node_type, type) and issubclass(node_type, train_state.TrainState):
            field = key_name(keypath[depth]) if depth < len(keypath) else None
            if field in _TRAIN_STATE_FIELDS:
                return f"TrainState.{field}"
    optax = next((t for t in reversed(chain) if getattr(t, "__module__", "").split(".")[0] == "optax"), None)
    return f"optax.{optax.__name__}" if optax is not None else None


def _variable_kind(nnx, variable: type) -> str:
    for name in _NNX_KINDS:
        base = getattr(nnx, name, None)
        if isinstance(base, type) and issubclass(variable, base):
            return f"nnx.{name}"
    return f"nnx.Variable:{variable.__name__}"


# The entry computation of a printed module, and its parameters' definitions: ``name = SHAPE parameter(N)...``
# (XLA's dumps and compiled modules add ``metadata={op_name="state['model']..."}``, which a reading trusts first).
_ENTRY = re.compile(r"^ENTRY\b.*?^\}", re.M | re.S)
_PARAMETER = re.compile(r"^(\s*%?)([\w.\-]+)(\s*=\s*(\([^\n]*?\)|\S+)\s+parameter\((\d+)\)[^\n]*)$", re.M)
_OP_NAME = re.compile(r'(\bop_name=")((?:[^"\\]|\\.)*)(")')
_DEFINED = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=", re.M)
_NOT_IN_KEY = re.compile(r"[^A-Za-z0-9_]")


def name_parameters(text: str, keys: Sequence[Sequence[str]] | None, leaves: Sequence[ArgLeaf] | None) -> str:
    """``text`` with each entry parameter that does not read back (its ``op_name``, else its name) as the path
    args_info gives it told that path: its ``op_name`` rewritten where it has one, else its name; and a leaf whose
    kind gives its role where the text alone would not (a plain pytree's typed PRNG key) told its kind
    (``params.KIND_KEY``). The text as it is where every parameter already reads right (jax.jit over state, named by
    key: MaxText's modules stay byte for byte) or where the keys do not match the parameters."""
    entry = _ENTRY.search(text)
    found = [m for _, m in sorted((int(m[5]), m) for m in _PARAMETER.finditer(entry[0]))] if entry else []
    if keys is None or len(found) != len(keys) or (leaves is not None and len(leaves) != len(keys)):
        return text
    leaves = leaves if leaves is not None else [None] * len(keys)
    said = [(op and path_from_keystr(op[2])) or path_from_mangled_name(m[2])
            for m, op in ((m, _OP_NAME.search(m[3])) for m in found)]
    paths = [attributed_path(s, k, leaf) for s, k, leaf in zip(said, keys, leaves)]
    lines: dict[int, str] = {}  # a definition's start in the entry -> its line as told
    renames: dict[str, str] = {}
    taken: set[str] | None = None
    for m, path, was, kind in zip(found, paths, said, _untold_kinds(found, paths, leaves)):
        line = m[0]
        if path != was and _OP_NAME.search(m[3]):
            told = _keystr(path)
            line = line if told is None else line[:m.start(3) - m.start()] + _OP_NAME.sub(
                lambda o, told=told: o[1] + told + o[3], m[3], count=1)
        elif path != was:
            taken = taken if taken is not None else set(_DEFINED.findall(text))
            if (new := _parameter_name(path, taken)) is not None:
                renames[m[2]] = new
                taken.add(new)
        if kind is not None:
            line = _with_kind(line, kind)
        if line != m[0]:
            lines[m.start()] = line
    if lines:
        body = _PARAMETER.sub(lambda m: lines.get(m.start(), m[0]), entry[0])
        text = text[:entry.start()] + body + text[entry.end():]
    if not renames:
        return text
    names = "|".join(re.escape(n) for n in sorted(renames, key=len, reverse=True))
    return re.sub(rf"(?<![\w.\-])(%?)({names})(?![\w.\-])", lambda m: m[1] + renames[m[2]], text)


def _untold_kinds(found: list[re.Match], paths: list[str], leaves: Sequence[ArgLeaf | None]) -> list[str | None]:
    """Per parameter, the kind to write into the text: a kind that gives a role (``params.kind_role``) which the
    text alone (its paths by name, NNX's key/count stream structure) would not give; None elsewhere."""
    try:
        shapes = [parse_shape(m[4]) for m in found]
    except ValueError:  # a shape this reading cannot take: tell nothing rather than fail the cell
        return [None] * len(found)
    streams = rng_stream_pairs(paths, shapes)
    kinds = []
    for i, (path, shape, leaf) in enumerate(zip(paths, shapes, leaves)):
        role = kind_role(leaf.kind, shape) if leaf is not None else None
        kinds.append(leaf.kind if role is not None and role != (streams.get(i) or name_role(path, shape)) else None)
    return kinds


def _with_kind(line: str, kind: str) -> str:
    """A parameter's definition with ``KIND_KEY`` in its frontend attributes (added to any it has)."""
    entry = f'{KIND_KEY}="{kind}"'
    attributes = re.search(r"\bfrontend_attributes=\{([^}]*)\}", line)
    if attributes is None:
        return f"{line}, frontend_attributes={{{entry}}}"
    inner = f"{attributes[1]},{entry}" if attributes[1].strip() else entry
    return line[:attributes.start(1)] + inner + line[attributes.end(1):]


def _keystr(path: str) -> str | None:
    """``path`` as jax's key string in a printed ``op_name`` (``model[\\'layers\\'][\\'0\\']``, quotes escaped
    as XLA prints them); None when that would not read back as ``path``."""
    head, *rest = path.split(".")
    told = head + "".join(f"[\\'{key}\\']" for key in rest)
    return told if path_from_keystr(told) == path else None


def _parameter_name(path: str, taken: set[str]) -> str | None:
    """A name that reads back as ``path``: jax's own mangling of its key string (``model['layers'][0]...`` ->
    ``model__layers____0__``, as jax.jit names state), else the dotted path; with XLA's ``.N`` counter, which
    the reading strips and which keeps it apart from every name in the module. None when neither reads back (a
    key with characters or underscore runs a name cannot hold apart)."""
    head, *rest = path.split(".")
    mangled = _NOT_IN_KEY.sub("_", head + "".join(f"['{key}']" for key in rest))
    for base in (mangled, re.sub(r"[^\w.\-]", "_", path)):
        if path_from_mangled_name(f"{base}.1") != path:
            continue
        counter = 1
        while f"{base}.{counter}" in taken:
            counter += 1
        return f"{base}.{counter}"
    return None
