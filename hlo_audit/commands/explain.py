"""Where the entry parameters come from: a tree of collapsed path patterns, largest first.

Each parameter's group pattern (``state.model.decoder.layers_*.mlp.wi_0.AqtDotGeneral_0.to_nnx__rngs.*``) is
read as three parts: the prefix up to the innermost layer container (``state.model.decoder.layers_*``), the
module path inside a layer (``mlp.wi_0``) and the state itself (``AqtDotGeneral_0.to_nnx__rngs.*`` for RNG
state: the module that holds the streams and its own holder; the variable name, ``kernel``, otherwise). The
layer container is the one ``hlo.params.fold_layers`` found by structure (a run of identical sub-trees folded to
``foo_*`` or ``*``, or a stacked axis), carried in each parameter as ``layer_prefix``; a parameter recorded
without it (``analysed.BY_NAME``: a result stored before it existed) falls back to the names ``layers``, ``blocks``
and ``h``, as captured arrays do.
The tree's first level is the *family*, prefix and state with the module path wildcarded
(``state.model.decoder.layers_*.*.AqtDotGeneral_0.to_nnx__rngs.*``): the same kind of state in every module of
every layer, which is how per-layer bloat shows up (seven quantized dots x 32 layers x 3 streams x key and
count = 1344 ``u32``). Below a family, the module paths form a tree (``mlp`` > ``wi_0``). Chains of single
children are merged into one node so the answer fits one screen.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from hlo_audit.analysed import BY_NAME, CapturedArray, Param, StreamVerdict

# The names-only fallback without a `layer_prefix`: `layers_*` (unrolled), `layers` (scanned), `blocks_*`...
_LAYER_CONTAINER = re.compile(r"^(layers?|blocks?|h)(_\*)?$")
_BY_NAME = BY_NAME  # split_pattern's default: find the layer container by name


@dataclass
class Node:
    """A group of entry parameters: counts by role and dtype, bytes, children largest first."""

    name: str
    count: int = 0
    bytes: int = 0
    by_role: Counter = field(default_factory=Counter)
    by_dtype: Counter = field(default_factory=Counter)
    children: dict[str, "Node"] = field(default_factory=dict)
    hidden: int = 0  # children left out by `top`, and their parameters below
    hidden_params: int = 0
    dead_rng: int = 0  # parameters of RNG streams the step never draws from (`hlo-audit rng`: carried)
    drawn_rng: int = 0  # parameters of RNG streams it does draw from: needed, though perhaps not per layer

    def add(self, param: Param | CapturedArray, verdict: StreamVerdict | None = None) -> None:
        self.count += 1
        self.bytes += param.bytes
        self.by_role[param.role.value] += 1
        self.by_dtype[param.dtype] += 1
        self.dead_rng += verdict is StreamVerdict.CARRIED
        self.drawn_rng += verdict is StreamVerdict.DRAWN

    def child(self, name: str) -> "Node":
        if name not in self.children:
            self.children[name] = Node(name)
        return self.children[name]

    def ordered(self) -> list["Node"]:
        return sorted(self.children.values(), key=lambda n: (-n.count, -n.bytes, n.name))

    def to_record(self) -> dict:
        return {"name": self.name, "params": self.count, "bytes": self.bytes,
                "by_role": _largest_first(self.by_role), "by_dtype": _largest_first(self.by_dtype),
                "children": [c.to_record() for c in self.ordered()],
                "hidden_children": self.hidden, "hidden_params": self.hidden_params, "dead_rng_params": self.dead_rng,
                "drawn_rng_params": self.drawn_rng}


def _largest_first(counts: Counter) -> dict[str, int]:
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def split_pattern(pattern: str, layer_prefix: str | None | object = _BY_NAME) -> tuple[str, list[str]]:
    """(family, module path inside the layer) of a group pattern; patterns outside layers are their own family.

    ``layer_prefix`` is the pattern's prefix up to its innermost layer container (the parameter record's, None
    outside layers); without it the container is found by name.
    """
    parts = pattern.split(".")
    if layer_prefix is _BY_NAME:
        containers = [i for i, p in enumerate(parts) if _LAYER_CONTAINER.match(p)]
        if not containers:
            return pattern, []
        start = containers[-1] + 1
        if start < len(parts) and parts[start] == "*":  # `layers.*`: an nnx.List's integer index, collapsed
            start += 1
    elif layer_prefix is None:
        return pattern, []
    else:
        start = str(layer_prefix).count(".") + 1
    # The state: RNG state's holder with the module that holds it (`AqtDotGeneral_0.to_nnx__rngs.*`: a pattern
    # ends in `*` only where RNG streams fold to their holder), else the leaf, with the list index of a leaf in a
    # list (AQT's `scale.0`).
    leaf = len(parts) - 2 if parts[-1].isdigit() and len(parts) - 2 >= start else len(parts) - 1
    end = max(len(parts) - 3, start) if parts[-1] == "*" else leaf
    middle = parts[start:end]
    if not middle:
        return pattern, []
    return ".".join(parts[:start] + ["*"] + parts[end:]), middle


def build_tree(params: Iterable[Param | CapturedArray], name: str,
               verdicts: Mapping[int, StreamVerdict] | None = None) -> Node:
    """Every parameter counted at the root, its family and each module-path level below it; ``verdicts``: each RNG
    parameter's stream verdict, by parameter number.

    A family that holds one pattern only is named by that pattern (nothing is wildcarded) and has no children.
    """
    params = list(params)
    verdicts = verdicts or {}
    split = {p.pattern: split_pattern(p.pattern, getattr(p, "layer_prefix", _BY_NAME)) for p in params}
    patterns_of: dict[str, set[str]] = {}
    for pattern, (family, _) in split.items():
        patterns_of.setdefault(family, set()).add(pattern)
    root = Node(name)
    for p in params:
        verdict = verdicts.get(p.index) if isinstance(p, Param) else None
        root.add(p, verdict)
        family, middle = split[p.pattern]
        if len(patterns_of[family]) == 1:
            family, middle = p.pattern, []
        node = root.child(family)
        node.add(p, verdict)
        for part in middle:
            node = node.child(part)
            node.add(p, verdict)
    return root


def prune(node: Node, depth: int, top: int, merge: bool = True) -> Node:
    """A copy that shows ``depth`` levels below ``node`` and ``top`` children per node (0: all).

    With ``merge``, a child whose only child holds all of its parameters becomes one node ``a.b`` (module paths
    read as paths); families (the root's children) are never merged, their names are patterns.
    """
    kept = Node(node.name, node.count, node.bytes, node.by_role, node.by_dtype, dead_rng=node.dead_rng,
                drawn_rng=node.drawn_rng)
    children = node.ordered()
    if depth <= 0:
        kept.hidden, kept.hidden_params = len(children), node.count if children else 0
        return kept
    shown = children if top <= 0 else children[:top]
    for child in shown:
        # A single child carrying all of its parent's parameters adds no information: one line `a.b`.
        while merge and len(child.children) == 1 and next(iter(child.children.values())).count == child.count:
            (only,) = child.children.values()
            child = Node(f"{child.name}.{only.name}", only.count, only.bytes, only.by_role, only.by_dtype,
                         only.children, dead_rng=only.dead_rng, drawn_rng=only.drawn_rng)
        kept.children[child.name] = prune(child, depth - 1, top)
    kept.hidden = len(children) - len(shown)
    kept.hidden_params = sum(c.count for c in children[len(shown):])
    return kept


def explain(params: Iterable[Param | CapturedArray], name: str, depth: int = 3, top: int = 8,
            verdicts: Mapping[int, StreamVerdict] | None = None) -> Node:
    """The explain tree of one module's entry parameters (or captured arrays)."""
    return prune(build_tree(params, name, verdicts), depth, top, merge=False)
