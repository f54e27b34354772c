"""Entry parameters: what the host marshals into the jitted step on every call.

Each parameter gets a state path, a role and a group pattern.

The **path** comes, best first, from jax's own ``args_info`` (when the tool lowered the function itself: the
pytree keys, and the argument's name from jax's debug info), from the ``op_name`` metadata that XLA dumps carry
(``state['model']['decoder']...['key'].value``), or from decoding the instruction name, which jax derives from
the same key string by replacing every character outside ``[A-Za-z0-9_]`` with ``_``.

The **role** comes from what the leaf is, when the tool lowered the step: ``ArgLeaf.kind``, the type
``hlo_audit.attribution`` read from the pytree's nodes (NNX variable types such as ``nnx.RngKey`` or
``nnx.Param``, a typed PRNG key's dtype, optax's state classes, flax's ``TrainState`` fields). A leaf no type
speaks for (a plain dict pytree, an NNX variable type of a Linen collection bridged by name, every parameter of
an HLO file) falls back to structure, then names: NNX's ``RngStream`` flattens to the sibling pair
``<stream>.key`` (``u32[..., 2]``) and ``<stream>.count`` (``u32[...]``), whatever the attribute holding it is
called; then ``key`` / ``count`` under an owner named ``rngs``, optimizer words, the usual state roots.

The **pattern** folds layer indices by structure (``fold_layers``: sibling sub-trees that differ only by an
integer index and hold the same shapes) and RNG streams to the module that holds them.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hlo_audit.hlo.rng_flow import key_shaped, keys_by_dataflow
from hlo_audit.hlo.shapes import Shape
from hlo_audit.hlo.state_flow import WrittenBack, written_back
from hlo_audit.hlo.text import HloModule, Instruction, strip_number_suffix

ROLES = ("rng_key", "rng_count", "weight", "optimizer_state", "step", "batch_stat", "cache", "input", "other")
RNG_ROLES = frozenset({"rng_key", "rng_count"})

_KEYSTR_TOKEN = re.compile(r"\[\\?'([^'\\]*)\\?'\]|\[(\d+)\]|\.?([A-Za-z_][\w]*)")
_MANGLED_SEPARATOR = re.compile(r"_{3,}")
_LAYER_INDEX = re.compile(r"^(layers?|blocks?|h)_\d+$")
_FLOAT = re.compile(r"^(f|bf|c)\d")
_INTEGER = re.compile(r"^[su]\d")
_OPTIMIZER_WORDS = frozenset({"opt_state", "optimizer", "mu", "nu", "momentum", "trace", "inner_state"})
# A leaf named as a key (``key``, ``rng``, ``dropout_rng``, ``prng_key``), when shaped as one (rng_flow.key_shaped).
_KEY_NAME = re.compile(r"^(?:\w+_)?(?:key|rng)$")
_STATE_ROOTS = frozenset({"state", "params", "model", "train_state", "variables"})
DUPLICATE_PATH = re.compile(r"-\d+$")  # canonical text's second parameter of one path: `<path>-<number>`
# The frontend attribute the tool tells a parameter's kind by in text, where neither its name nor its structure says
# what it is (a typed PRNG key of a plain pytree is u32[2] like any other): `frontend_attributes={hlo_audit_kind=..}`.
KIND_KEY = "hlo_audit_kind"
_TOLD_KIND = re.compile(rf'\b{KIND_KEY}="([^"]*)"')

# What a leaf's type says it is (the kinds ``hlo_audit.attribution`` records). A kind not listed (an NNX variable
# type made for a Linen collection, e.g. fp8's ``_overwrite_with_gradient`` amax histories, or qwix's
# ``QuantStat``) says nothing about the role, and names decide: MaxText's committed goldens count those f32
# histories as weights, which the gate must keep.
_KIND_ROLES = {
    "nnx.RngKey": "rng_key", "nnx.RngCount": "rng_count", "prng_key": "rng_key",
    "nnx.Param": "weight", "nnx.BatchStat": "batch_stat", "nnx.Cache": "cache",
    "nnx.Intermediate": "other", "nnx.Perturbation": "other",
    "nnx.OptArray": "optimizer_state", "nnx.OptVariable": "optimizer_state",
    "TrainState.params": "weight", "TrainState.step": "step", "TrainState.opt_state": "optimizer_state",
}


@dataclass(frozen=True, slots=True)
class ArgLeaf:
    """What jax knew of one kept argument besides its pytree keys (``hlo_audit.attribution.arg_leaves``).

    ``argument``: the name of the function argument it is part of (``state``, ``model``), from jax's debug info;
    the HLO name only encodes it mangled together with the keys, which cannot be split when the first key is an
    attribute (``model.states[0][3]`` is ``model_states_0__3_``). ``kind``: the type that says what the leaf is
    (``nnx.RngKey``, ``nnx.Param``, ``nnx.OptState``, ``optax.ScaleByAdamState``, ``prng_key`` for a typed key,
    ``nnx.Variable:<name>`` for an NNX variable type not listed in ``_KIND_ROLES``), None for an untyped leaf.
    """

    argument: str | None
    kind: str | None

    def to_record(self) -> dict:
        return {"argument": self.argument, "kind": self.kind}

    @classmethod
    def from_record(cls, record: dict) -> "ArgLeaf":
        return cls(argument=record.get("argument"), kind=record.get("kind"))


@dataclass(frozen=True, slots=True)
class EntryParam:
    index: int
    name: str
    shape: Shape
    sharding: str | None
    path: str
    role: str
    pattern: str  # path with layer indices folded; RNG streams folded to `<owner>.*`
    kind: str | None = None  # the leaf's type, when the tool lowered the step (ArgLeaf.kind)
    # The pattern's prefix up to and including the innermost layer container (`state.layers_*`, a scanned
    # stack's `state.model.decoder.layers`), None outside layers: where explain's families start.
    layer_prefix: str | None = None

    @property
    def dtype(self) -> str:
        return self.shape.dtype or "tuple"

    @property
    def bytes(self) -> int:
        return self.shape.bytes

    @property
    def is_rng(self) -> bool:
        return self.role in RNG_ROLES

    @property
    def folded_path(self) -> str:
        """The path with layer indices folded and nothing else (an RNG stream keeps its name and key/count)."""
        if self.layer_prefix is None:
            return self.path
        depth = self.layer_prefix.count(".") + 1
        return ".".join([self.layer_prefix, *self.path.split(".")[depth:]])

    def to_record(self) -> dict:
        """What results and the cache keep of a parameter (``count --params`` adds name, layout, sharding)."""
        return {"index": self.index, "path": self.path, "role": self.role, "dtype": self.dtype,
                "dims": list(self.shape.dims), "bytes": self.bytes, "pattern": self.pattern, "kind": self.kind,
                "layer_prefix": self.layer_prefix}


def path_from_keystr(keystr: str) -> str | None:
    """``state['model']['layers_0']['rngs']['key'].value`` -> ``state.model.layers_0.rngs.key``."""
    keystr = keystr.replace("\\'", "'")
    parts: list[str] = []
    pos = 0
    while pos < len(keystr):
        m = _KEYSTR_TOKEN.match(keystr, pos)
        if not m or m.end() == pos:
            return None
        parts.append(next(g for g in m.groups() if g is not None))
        pos = m.end()
    if parts and parts[-1] == "value" and len(parts) > 1:
        parts.pop()  # NNX Variable's .value is not part of the state path
    return ".".join(parts) if parts else None


def path_from_mangled_name(name: str) -> str:
    """Invert jax's name mangling as far as it can be inverted.

    jax replaces every character of the key string outside ``[A-Za-z0-9_]`` with ``_``, so
    ``state['model']['to_nnx__rngs']['key'].value`` arrives as ``state__model____to_nnx__rngs____key___value``:
    ``']['`` is ``____``, ``'][`` and ``]['`` and ``'].`` are ``___``, and only the first ``['`` is a two-
    underscore separator, which is why names that contain ``__`` themselves (``to_nnx__rngs``) survive.
    """
    base = strip_number_suffix(name)
    components = [c for c in _MANGLED_SEPARATOR.split(base) if c]
    if not components:
        return base
    head, sep, first_key = components[0].partition("__")
    parts = [head] + ([first_key] if sep and first_key else []) + components[1:]
    parts[-1] = parts[-1].removesuffix("__")
    if len(parts) > 1 and parts[-1] == "value":
        parts.pop()  # NNX Variable's .value
    return ".".join(parts)


def collapse_layers(path: str) -> str:
    """``decoder.layers_3.mlp`` -> ``decoder.layers_*.mlp``, by name only: the fallback for a path on its own
    (a captured array's), where no sibling says what repeats. ``entry_params`` folds by
    structure (``fold_layers``) and uses these names only where structure says nothing."""
    parts = path.split(".")
    out = []
    for i, part in enumerate(parts):
        m = _LAYER_INDEX.match(part)
        if m:
            out.append(f"{m.group(1)}_*")
        elif part.isdigit() and i > 0 and _LAYER_INDEX.match(parts[i - 1] + "_0"):
            out.append("*")
        else:
            out.append(part)
    return ".".join(out)


def rng_owner(parts: Sequence[str]) -> int | None:
    """Index of the component named as an Rngs holder (``rngs``, ``to_nnx__rngs``...), if any."""
    for i, part in enumerate(parts):
        if part == "rngs" or part.endswith("_rngs"):  # also `to_nnx__rngs`
            return i
    return None


def kind_role(kind: str | None, shape: Shape) -> str | None:
    """The role a leaf's type gives it; None where the type says nothing (untyped, or a type not listed)."""
    if kind is None:
        return None
    if kind == "nnx.OptState":  # nnx.Optimizer's own step counter is the base class; its optax state the subclasses
        return "step" if not shape.dims and shape.dtype and _INTEGER.match(shape.dtype) else "optimizer_state"
    if kind.startswith("optax."):  # inside an optax state (its `count` too: Adam's bias correction)
        return "optimizer_state"
    return _KIND_ROLES.get(kind)


def name_role(path: str, shape: Shape) -> str:
    """The role names give a path: the fallback for leaves no type speaks for."""
    parts = path.split(".")
    last = parts[-1]
    owner = rng_owner(parts)
    if owner is not None and last in ("key", "count") and shape.dtype == "u32":
        return "rng_key" if last == "key" else "rng_count"
    if last == "step" and len(shape.dims) == 0:
        return "step"
    if any(p in _OPTIMIZER_WORDS for p in parts):
        return "optimizer_state"
    if parts[0] in _STATE_ROOTS:
        if shape.dtype and _FLOAT.match(shape.dtype) or last == "qvalue":  # qvalue: AQT's integer-quantized kernel
            return "weight"
        return "other"
    return "input"


def key_by_name(path: str, shape: Shape) -> bool:
    """A key-shaped ``u32`` (rng_flow.key_shaped) named as a key, or under an owner named ``rngs``: names confirm
    what the dataflow finds whatever the name (``keys_by_dataflow``: a key drawn from, or one the step carries
    through unread), and say it where the step computes with a key-shaped leaf without drawing. Apart from
    ``name_role``, whose verdicts the text the tool stores is told against (``attribution.name_parameters``) and which
    names captured arrays (``constants``)."""
    parts = path.split(".")
    owner = rng_owner(parts)
    return key_shaped(shape) and (owner is not None and owner < len(parts) - 1 or bool(_KEY_NAME.match(parts[-1])))


def classify(path: str, shape: Shape, kind: str | None = None) -> str:
    """A leaf's role: from its type when known (``kind``), else from its path's names."""
    return kind_role(kind, shape) or name_role(path, shape)


def rng_stream_pairs(paths: Sequence[str], shapes: Sequence[Shape]) -> dict[int, str]:
    """Index -> ``rng_key`` / ``rng_count`` for the leaves that flatten as an NNX ``RngStream`` does: siblings
    ``<stream>.key`` ``u32[..., 2]`` (a threefry key's data) and ``<stream>.count`` ``u32[...]`` with the key's
    leading dims (stacked streams carry a leading layer axis on both). That is the stream's structure, whatever
    the module calls the attribute holding it (``noise_source``, ``rng``); a lone ``key`` is not a stream."""
    found: dict[str, dict[str, int]] = {}
    for i, (path, shape) in enumerate(zip(paths, shapes)):
        stream, _, last = path.rpartition(".")
        if stream and last in ("key", "count") and shape.dtype == "u32":
            found.setdefault(stream, {})[last] = i
    roles: dict[int, str] = {}
    for pair in found.values():
        if len(pair) == 2:
            key, count = shapes[pair["key"]].dims, shapes[pair["count"]].dims
            if key[-1:] == (2,) and key[:-1] == count:
                roles[pair["key"]], roles[pair["count"]] = "rng_key", "rng_count"
    return roles


def group_pattern(path: str) -> str:
    """The group of a path on its own, by names: layer indices collapsed, RNG state folded to its ``rngs`` owner
    (``...to_nnx__rngs.*``). ``entry_params`` groups a module's parameters by structure (``group_patterns``)."""
    parts = collapse_layers(path).split(".")
    owner = rng_owner(parts)
    if owner is not None and parts[-1] in ("key", "count"):
        return ".".join(parts[: owner + 1] + ["*"])
    return ".".join(parts)


# ---------------------------------------------------------------------------------------------------------------
# Layers by structure
# ---------------------------------------------------------------------------------------------------------------

_INDEXED = re.compile(r"^(?:(.*)_)?(\d+)$")  # `foo_3` (stem `foo`), `3` (an nnx.List / tuple index: no stem)
_LAYER_WORD = re.compile(r"(?:^|_)(?:layers?|blocks?|h)$")  # the names-only fallback: `layers`, `dense_layers`


class _Node:
    """One path prefix of a module's entry parameters: its leaves, its children by key, and what folding needs."""

    __slots__ = ("name", "children", "leaves", "signature", "state_signature", "lengths", "common", "state",
                 "folded", "container")

    def __init__(self, name: str):
        self.name = name
        self.children: dict[str, _Node] = {}
        self.leaves: list[int] = []  # parameter indices whose path ends here
        self.signature = 0
        self.state_signature = 0
        self.lengths: set[int] = set()  # L of every rng_count u32[L] below (L > 1): a stream per stacked layer
        self.common: set[int] | None = None  # the axis sizes every leaf below has
        self.state = 0  # leaves below that are not RNG state
        self.folded: str | None = None  # its key as folded (`layers_*`), when it is a member of a folded run
        self.container = False  # a layer container: a folded member or a stacked axis


def _tree(paths: Sequence[str]) -> tuple[_Node, list[list[_Node]]]:
    """The prefix tree of ``paths``, and each path's nodes from the top."""
    root = _Node("")
    chains = []
    for i, path in enumerate(paths):
        node, chain = root, []
        for part in path.split("."):
            child = node.children.get(part)
            if child is None:
                child = node.children[part] = _Node(part)
            node = child
            chain.append(node)
        node.leaves.append(i)
        chains.append(chain)
    return root, chains


def _sign(node: _Node, leaf_info: Sequence[tuple], table: dict) -> tuple[int, int]:
    """Give every node two ids (hash-consing): one equal exactly for sub-trees of the same keys and shapes, one
    for the same keys and shapes of everything but RNG state (``_folds`` says why). ``leaf_info``: per parameter
    ((dtype, dims, is RNG state), its axis sizes, L of an rng_count u32[L] or 0)."""
    leaves = []
    common: set[int] | None = None
    for i in node.leaves:
        signature, sizes, length = leaf_info[i]
        leaves.append(signature)
        common = set(sizes) if common is None else common & sizes
        if length:
            node.lengths.add(length)
        node.state += not signature[2]
    leaves.sort()
    full, state = [], []
    for name in sorted(node.children):
        child = node.children[name]
        child_full, child_state = _sign(child, leaf_info, table)
        full.append((name, child_full))
        if child.state:
            state.append((name, child_state))
        common = set(child.common) if common is None else common & child.common
        node.lengths |= child.lengths
        node.state += child.state
    node.common = common or set()
    node.signature = table.setdefault(("all", tuple(leaves), tuple(full)), len(table))
    node.state_signature = table.setdefault(
        ("state", tuple(leaf for leaf in leaves if not leaf[2]), tuple(state)), len(table))
    return node.signature, node.state_signature


def _stacked(node: _Node) -> bool:
    """A stack of layers on an array axis (``nnx.vmap`` / ``nnx.scan``, MaxText's scanned decoder): the node's
    RNG counts are ``u32[L]`` (a stream per layer, split on a leading axis), and every leaf below has an axis
    of that size, and it holds more than RNG state (a split ``nnx.Rngs`` alone is not a stack of layers). Without
    RNG state a stack has no such mark, and its name decides (``layers``, ``h``...)."""
    if _LAYER_WORD.search(node.name):
        return True
    return len(node.lengths) == 1 and node.state > 0 and next(iter(node.lengths)) in node.common


def _runs(node: _Node) -> dict[str, list[str]]:
    """Children that differ only by an integer index, by stem: ``{"layers": ["layers_0", "layers_1"]}``,
    ``{"": ["0", "1", "2"]}`` for a list."""
    runs: dict[str, list[str]] = {}
    for name in node.children:
        m = _INDEXED.match(name)
        if m:
            runs.setdefault(m.group(1) or "", []).append(name)
    return runs


def _folds(node: _Node, run: list[str], stem: str) -> bool:
    """A run is a list of layers: two or more sub-trees with the same keys and shapes, RNG state aside where they
    hold more than RNG state (an ``nnx.Rngs`` shared by every layer appears in the first layer's state only,
    and jit prunes what a layer does not read); by name, failing that (``layers_0`` alone, at depth 1)."""
    members = [node.children[name] for name in run]
    if len(members) > 1 and all(m.children for m in members):
        first = members[0]
        if all(m.signature == first.signature for m in members):
            return True
        if first.state and all(m.state_signature == first.state_signature for m in members):
            return True
    return bool(_LAYER_WORD.search(stem if stem else node.name))


def fold_layers(paths: Sequence[str], shapes: Sequence[Shape],
                roles: Sequence[str]) -> list[tuple[list[str], int | None]]:
    """Each path's components with layer indices folded (``layers_3`` -> ``layers_*``, ``blocks.3`` ->
    ``blocks.*``), and the number of components up to its innermost layer container (None outside layers).

    A layer is a member of a run of sibling sub-trees that differ only by an integer index and hold the same keys
    and shapes, or a stacked axis (``_stacked``). Only the outermost repetition folds: inside a layer, siblings
    of equal shapes are different modules (MaxText's ``mlp.wi_0`` / ``wi_1``, its gate and up projections, which
    a golden counts apart), so nothing is folded inside a folded layer or a stacked one.
    """
    root, chains = _tree(paths)
    leaf_info = [((shape.dtype or "", shape.dims, role in RNG_ROLES), frozenset(shape.dims),
                  shape.dims[0] if role == "rng_count" and len(shape.dims) == 1 and shape.dims[0] > 1 else 0)
                 for shape, role in zip(shapes, roles)]
    _sign(root, leaf_info, {})

    def visit(node: _Node, inside: bool) -> None:
        runs = {} if inside else _runs(node)
        folding = {name: (f"{stem}_*" if stem else "*") for stem, run in runs.items() if _folds(node, run, stem)
                   for name in run}
        # A node is a stacked axis when it is not itself a list (`layers.0`, `layers.1`: an nnx.List's items);
        # inside a stacked layer nothing folds, its own children included.
        stacked = not inside and node is not root and not any(k.isdigit() for k in folding) and _stacked(node)
        if stacked:
            node.container = True
            folding = {}
        for name, child in node.children.items():
            if name in folding:
                child.folded, child.container = folding[name], True
            visit(child, inside or stacked or name in folding)

    visit(root, False)
    result = []
    for chain in chains:
        parts = [n.folded or n.name for n in chain]
        depth = next((len(chain) - i for i, n in enumerate(reversed(chain)) if n.container), None)
        result.append((parts, depth))
    return result


def group_patterns(paths: Sequence[str], roles: Sequence[str],
                   folds: Sequence[tuple[list[str], int | None]]) -> list[str]:
    """Each parameter's group pattern: its folded path, and for RNG state the module that holds the streams
    followed by ``*`` (what matters is which module holds RNG state, not the stream and key/count under it).

    The holder: a component named as an Rngs (``rngs``, ``to_nnx__rngs``), else by structure: the stream
    (``<stream>.key`` / ``.count``, when all it holds is RNG state), or the ``nnx.Rngs`` above it when that holds
    nothing but streams (``noise_source.dropout.key`` -> ``noise_source.*``).
    """
    not_rng_below: set[str] = set()  # path prefixes that hold a leaf that is not RNG state
    for path, role in zip(paths, roles):
        if role not in RNG_ROLES:
            parts = path.split(".")
            not_rng_below.update(".".join(parts[:n]) for n in range(1, len(parts) + 1))
    result = []
    for path, role, (parts, _) in zip(paths, roles, folds):
        if role in RNG_ROLES and parts[-1] in ("key", "count"):
            owner = rng_owner(parts)
            if owner is None:
                raw = path.split(".")
                stream = len(raw) - 1
                if stream > 0 and ".".join(raw[:stream]) not in not_rng_below:
                    owner = stream - 1
                    if owner > 0 and ".".join(raw[:owner]) not in not_rng_below:
                        owner -= 1
            if owner is not None:
                result.append(".".join(parts[: owner + 1] + ["*"]))
                continue
        result.append(".".join(parts))
    return result


def _param_path(instr: Instruction, named_by_path: bool) -> str:
    if named_by_path:  # canonical text: the name is the path (a second one of a path: `<path>-<number>`)
        return DUPLICATE_PATH.sub("", instr.name)
    return (instr.op_name and path_from_keystr(instr.op_name)) or path_from_mangled_name(instr.name)


def told_kind(instr: Instruction) -> str | None:
    """The kind the tool wrote into a parameter's ``frontend_attributes`` (``KIND_KEY``), if any."""
    found = _TOLD_KIND.search(instr.attrs.get("frontend_attributes", ""))
    return found[1] if found else None


def attributed_path(text_path: str, keys: Sequence[str], leaf: ArgLeaf | None) -> str:
    """A parameter's path from jax's args_info: its argument's name (``leaf``'s, else the head of the path its
    text gives) and the pytree ``keys`` below it."""
    head = leaf.argument if leaf is not None and leaf.argument else text_path.split(".", 1)[0]
    return ".".join([head, *keys])


def _roles(module: HloModule, paths: Sequence[str], shapes: Sequence[Shape], kinds: Sequence[str | None]) -> list[str]:
    """Each parameter's role: what its type says, else NNX's stream structure, else what the step does with it (a
    key-shaped leaf that reaches random-bit generation is an RNG key: ``rng_flow.keys_by_dataflow``), else names
    (``key_by_name``, then ``name_role``)."""
    streams = rng_stream_pairs(paths, shapes)
    typed = [kind_role(kind, shape) or streams.get(i) for i, (shape, kind) in enumerate(zip(shapes, kinds))]
    named = [("rng_key" if key_by_name(path, shape) else name_role(path, shape)) for path, shape in zip(paths, shapes)]
    numbers = [instr.parameter_number for instr in module.entry.parameters]
    keys = keys_by_dataflow(module, [n for n, role, name, shape in zip(numbers, typed, named, shapes)
                                     if role is None and name not in RNG_ROLES and key_shaped(shape)])
    roles = [role or ("rng_key" if number in keys else name) for number, role, name in zip(numbers, typed, named)]
    return _written_roles(module, numbers, paths, shapes, roles, [role is not None for role in typed])


def _written_roles(module: HloModule, numbers: Sequence[int | None], paths: Sequence[str], shapes: Sequence[Shape],
                   roles: list[str], typed: Sequence[bool]) -> list[str]:
    """``roles`` with what the step writes back (``state_flow``): a float leaf no type speaks for is a weight
    where the step returns it, updated or as it came, in an argument of which some leaf an update writes (an
    equinox model, a plain dict of params: a frozen leaf of a trained model too, which the gradient rule then
    finds unreached); a leaf typed a weight that sits under an optimizer's names and that no update writes is
    optimizer state (optax's moments initialised from ``nnx.Param``s keep that type)."""
    written = written_back(module)
    if not written:
        return roles
    updated = {path.split(".", 1)[0] for number, path, shape in zip(numbers, paths, shapes)
               if number in written and written[number].how is WrittenBack.UPDATED and _floating(shape)}
    out = list(roles)
    for i, (number, path, shape, role) in enumerate(zip(numbers, paths, shapes, roles)):
        how = written[number].how if number in written else None
        if not typed[i] and role in ("input", "other") and how is not None and _floating(shape) \
                and path.split(".", 1)[0] in updated:
            out[i] = "weight"
        elif typed[i] and role == "weight" and how is not WrittenBack.UPDATED and updated \
                and name_role(path, shape) == "optimizer_state":
            out[i] = "optimizer_state"
    return out


def _floating(shape: Shape) -> bool:
    return bool(shape.dtype) and bool(_FLOAT.match(shape.dtype))


def entry_params(module: HloModule, arg_keys: Sequence[Sequence[str]] | None = None,
                 arg_leaves: Sequence[ArgLeaf] | None = None) -> list[EntryParam]:
    """The entry computation's parameters in order, each with path, role and pattern.

    ``arg_keys`` (from jax's args_info: the pytree keys below the argument, one entry per kept argument) give the
    exact path below the argument's name when there is one per parameter; ``arg_leaves`` the argument's name and
    the leaf's type (``hlo_audit.attribution.arg_leaves``), likewise.
    """
    params = module.entry.parameters
    use_keys = arg_keys is not None and len(arg_keys) == len(params)
    use_leaves = arg_leaves is not None and len(arg_leaves) == len(params)
    paths, kinds = [], []
    for i, instr in enumerate(params):
        path = _param_path(instr, module.params_named_by_path)
        leaf = arg_leaves[i] if use_leaves else None
        if use_keys:
            path = attributed_path(path, arg_keys[i], leaf)
        paths.append(path)
        kinds.append(leaf.kind if leaf is not None else told_kind(instr))
    shapes = [instr.shape for instr in params]
    roles = _roles(module, paths, shapes, kinds)
    folds = fold_layers(paths, shapes, roles)
    patterns = group_patterns(paths, roles, folds)
    return [EntryParam(index=instr.parameter_number, name=instr.name, shape=instr.shape,
                       sharding=instr.attrs.get("sharding"), path=path, role=role, pattern=pattern, kind=kind,
                       layer_prefix=".".join(parts[:depth]) if depth else None)
            for instr, path, role, pattern, kind, (parts, depth)
            in zip(params, paths, roles, patterns, kinds, folds)]


@dataclass(frozen=True)
class ParamCounts:
    """Entry parameters counted: in all, by dtype, by role and by path pattern. The one bundle of these counts: a
    module's summary (``ParamSummary``) and a golden's record (``golden.record.GoldenRecord``) are each one, and two
    of them compare as one ``comparison.ParamDelta``."""

    entry_params: int
    by_dtype: Mapping[str, int]
    by_role: Mapping[str, int]
    groups: Mapping[str, int]

    @property
    def rng_params(self) -> int:
        return sum(self.by_role.get(k, 0) for k in ("rng_key", "rng_count"))


@dataclass(frozen=True)
class ParamSummary(ParamCounts):
    """Counts of one module's entry parameters, the numbers `count` reports, with their bytes by role."""

    bytes_by_role: Mapping[str, int]

    @classmethod
    def of(cls, params: Sequence[EntryParam]) -> "ParamSummary":
        bytes_by_role: Counter[str] = Counter()
        for p in params:
            bytes_by_role[p.role] += p.bytes
        return cls(
            entry_params=len(params),
            by_dtype=_sorted_counts(Counter(p.dtype for p in params)),
            by_role=_sorted_counts(Counter(p.role for p in params)),
            groups=_sorted_counts(Counter(p.pattern for p in params)),
            bytes_by_role=dict(sorted(bytes_by_role.items())),
        )

    @property
    def rng_params(self) -> int:
        return self.by_role.get("rng_key", 0) + self.by_role.get("rng_count", 0)


def roles_by_pattern(params: Sequence) -> dict[str, dict[str, int]]:
    """Each path pattern's parameters by role (``...to_nnx__rngs.*``: rng_key 42, rng_count 42): what a golden keeps
    (``groups_by_role``) and what the comparison reads to tell a pattern renamed from one retyped."""
    groups: dict[str, dict[str, int]] = {}
    for p in params:
        roles = groups.setdefault(p.pattern, {})
        role = str(p.role)
        roles[role] = roles.get(role, 0) + 1
    return {pattern: dict(sorted(roles.items())) for pattern, roles in sorted(groups.items())}


def _sorted_counts(counter: Counter[str]) -> dict[str, int]:
    """Largest first, then by name: stable across runs and readable."""
    return dict(sorted(counter.items(), key=lambda kv: (-kv[1], kv[0])))
