"""The kinds of change about a program's structure: shardings, collectives, shapes and ops changed at equal shapes
(changes.py's module doc lists every kind; ``explain`` in change_kinds.py calls these before the program-size and
instruction leftovers, so each claims its edits).

* ``sharding``: entry parameters whose ``sharding`` changed (``{devices=[8,1]<=[8]}`` -> ``{replicated}``), values
  whose sharding changed (a reshape's, the outputs' tuple element by element; shardy's ``xla.sdy.sharding`` frontend
  attribute is the same sharding said again), sharding constraints (``custom-call @Sharding``) added or removed. In a
  module after SPMD partitioning (its entry named ``*_spmd``) the shardings are gone from the text: a parameter's
  per-device shape that changed where collectives reading that state were added or removed is its sharding that
  changed, and the values' per-device shapes follow it;
* ``collectives``: all-gather, all-reduce, reduce-scatter, all-to-all, collective-permute (and their ``-start`` /
  ``-done`` halves, one collective) added, removed or changed (another kind, other dimensions or replica groups),
  with how often a step runs each and the bytes it moves per step (its result, per device); a renumbered
  ``channel_id`` is no change;
* ``shapes``: entry parameters (inputs) and values whose dimensions changed, by the factor of their elements;
* ``ops``: instructions added, removed or changed in place (another opcode, comparison, dimensions, constant) at equal
  shapes, folded per region (computation and jax's op_name): a mask made non-causal, a transpose added, another
  reduction. Layouts, metadata, instruction order and fusion names are not ops. Where the leftovers tell a program-size
  story (an ``opt-barrier`` or a loop added or removed, or more instructions than ``_OPS_MAX_SHARE`` of the program)
  they are left to it.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from hlo_audit.hlo.change_places import RECOMPUTED, Groups, Sides, layer_count, under_checkpoint
from hlo_audit.hlo.changes import MESH, NO_SPLIT_CHANGE, Action, Change, ChangeKind, Place
from hlo_audit.hlo.flops import FLOP_OPS, flops
from hlo_audit.hlo.match import Edit, InstructionEdit, ModuleMatch
from hlo_audit.hlo.mesh import DeclaredSizes, MeshAxis, Split, TargetMesh, mesh_text, split_changes
from hlo_audit.hlo.params import EntryParam
from hlo_audit.hlo.shapes import split_top_level
from hlo_audit.hlo.text import Instruction

COLLECTIVES = frozenset({"all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute",
                         "collective-broadcast", "ragged-all-to-all"})
# The second half of an asynchronous collective: claimed with it, not counted again.
_DONE = frozenset({f"{op}-done" for op in COLLECTIVES})
# A sharding constraint (``jax.lax.with_sharding_constraint``) as jax lowers it.
SHARDING_TARGETS = frozenset({"Sharding", "xla.sdy.ShardingConstraint"})
_SDY_SHARDING = re.compile(r'xla\.sdy\.sharding="((?:[^"\\]|\\.)*)"')
_SDY_WRAPPER = re.compile(r"#sdy\.sharding_per_value<\[(.*)\]>|#sdy\.sharding(<.*>)")
_TILED = re.compile(r"devices=\[([\d,\s]*)\]")
_NAMED_MESH = re.compile(r"mesh\[([^\]]*)\]\s*,\s*\[(.*)\]")
_SPMD_ENTRY = re.compile(r"_spmd(?:\.\d+)?$")
# Aspects of a paired instruction that are not its op: what it reads, how it is laid out or sharded, its type and
# dims (other kinds'), where it came from, a collective's channel number.
_NOT_OPS = frozenset({"operands", "layout", "dtype", "dims", "shape", "sharding", "frontend_attributes", "calls",
                      "kernel", "channel_id", "backend_config", "metadata", "index"})
# Aspects of a paired collective that change nothing it moves: what it reads, its layout, its number, its scheduling.
_NOT_COLLECTIVE = frozenset({"operands", "layout", "channel_id", "metadata", "frontend_attributes",
                             "backend_config", "sharding"})
# Ops whose adding or removing is a program-size story (remat, loops), and leftovers too large to be a local edit.
_SIZE_STORIES = frozenset({"opt-barrier", "optimization-barrier", "while", "conditional"})
_OPS_MAX_SHARE = 0.1


def collective_op(instr: Instruction) -> str:
    """The collective an instruction is (``all-gather`` for ``all-gather-start``), "" for any other."""
    op = instr.opcode.removesuffix("-start")
    return op if op in COLLECTIVES else ""


def is_partitioned(match: ModuleMatch) -> bool:
    """Both modules after SPMD partitioning: their entry holds one device's shard, its shardings gone."""
    return all(_SPMD_ENTRY.search(m.entry.name) for m in (match.old, match.new))


# -- collectives ----------------------------------------------------------------------------------------------------

def collectives(edits: Sequence[InstructionEdit], sides: Sides, claimed: set[int]) -> list[Change]:
    """Collectives added, removed or changed, folded by kind and place (module doc)."""
    groups = Groups()
    for e in edits:
        if id(e) in claimed:
            continue
        if e.edit is Edit.CHANGED:
            was, now = collective_op(e.old), collective_op(e.new)
            if not (was or now) or (was == now and set(e.aspects) <= _NOT_COLLECTIVE):
                continue
            claimed.add(id(e))
            if was == now:
                _add_collective(groups, Action.CHANGED, e, e.new, sides, _collective_form(e.old),
                                _collective_form(e.new))
                continue
            for action, instr, op in ((Action.REMOVED, e.old, was), (Action.ADDED, e.new, now)):
                if op:
                    _add_collective(groups, action, e, instr, sides)
            continue
        instr = e.instruction
        if instr.opcode in _DONE:
            claimed.add(id(e))
        elif collective_op(instr):
            claimed.add(id(e))
            _add_collective(groups, Action.ADDED if e.edit is Edit.INSERTED else Action.REMOVED, e, instr, sides)
    changes = [Change(ChangeKind.COLLECTIVES, action, op, place, count=g["count"], per_step=g["runs"],
                      before=before, after=after, bytes=g["sums"]["bytes"], layers=layer_count(g["layers"]))
               for (action, op, before, after, _), g, place in groups.items()]
    return _per_step_moved(changes)


def _per_step_moved(changes: list[Change]) -> list[Change]:
    """Without the collectives of a kind whose removed ones a step runs as often, moving as many bytes, as the added
    ones: the same collectives moved (a loop unrolled or rolled up: its body's once per layer), not changed."""
    moved = set()
    for op in {c.subject for c in changes}:
        sides = [[c for c in changes if c.subject == op and c.action is a] for a in (Action.ADDED, Action.REMOVED)]
        if all(sides) and len({(sum(c.per_step for c in side), sum(c.bytes for c in side)) for side in sides}) == 1:
            moved.add(op)
    return [c for c in changes if c.action is Action.CHANGED or c.subject not in moved]


def _add_collective(groups: Groups, action: Action, e: InstructionEdit, instr: Instruction, sides: Sides,
                    before: str = "", after: str = "") -> None:
    place = sides.place(e)
    runs = sides.runs(e)
    leaves = instr.shape.leaves()
    # An asynchronous start's result holds its operand and its result: the result is what moves.
    moved = leaves[-1].bytes if instr.opcode.endswith("-start") else sum(leaf.bytes for leaf in leaves)
    groups.add((action, collective_op(instr), before, after, place.site), place, runs,
               sides.layers(e), bytes=moved * runs)


def _collective_form(instr: Instruction) -> str:
    """A collective's kind, result and groups: what a changed one changed."""
    parts = [instr.opcode, f"{sum(leaf.bytes for leaf in instr.shape.leaves()):,} bytes"]
    parts += [f"{k}={instr.attrs[k]}" for k in ("dimensions", "replica_groups") if k in instr.attrs]
    return " ".join(parts)


# -- shardings ------------------------------------------------------------------------------------------------------

def shardings(match: ModuleMatch, sides: Sides, claimed: set[int],
              declared: DeclaredSizes = (None, None)) -> list[Change]:
    """Shardings of parameters, values and outputs that changed; sharding constraints added or removed. Each changed
    sharding is judged on its array's split on the target mesh (``hlo.mesh``: ``declared``, each side's sizes its
    cell's config gives, where the module lowered on one device): those that split their array alike (an axis of
    size 1 added, renamed, reordered) are one change, ``NO_SPLIT_CHANGE``, with how the mesh changed; each other
    names how its array's dimensions are split now."""
    meshes = MeshPair.of(match, declared)
    unsplit = Groups()
    changes = _parameter_shardings(match, meshes, unsplit)
    values = Groups()
    unclaimed = [e for e in match.edits if id(e) not in claimed]
    # Remat added: its barriers came, or (a checkpoint that writes none) a constraint its recomputation copies.
    remat_added = any(e.edit is Edit.INSERTED and (e.instruction.opcode in ("opt-barrier", "optimization-barrier") or
                                                   e.instruction.custom_call_target in SHARDING_TARGETS and
                                                   RECOMPUTED in sides.origin(e)[0]) for e in unclaimed)
    # Remat added copies the constraints its checkpoints recompute: those are remat's (it claims what jax's name
    # stack puts under a checkpoint), not sharding constraints added.
    constraints = [e for e in unclaimed if e.edit is not Edit.CHANGED and
                   e.instruction.custom_call_target in SHARDING_TARGETS and
                   not (remat_added and e.edit is Edit.INSERTED and under_checkpoint(sides.origin(e)[0]))]
    claimed.update(id(e) for e in constraints)
    if remat_added:
        constraints = [e for e in constraints if id(e) not in _remat_swapped(match, sides, constraints)]
    # A constraint removed here and one of the same sharding added there (the match paired neither in a program
    # rewritten around them) is none removed.
    kept = {id(e) for e in _net(constraints, lambda e: sharding_key(_sharding_of(e.instruction)))}
    for e in match.edits:
        if id(e) in claimed and id(e) not in kept:
            continue
        if e.edit is Edit.CHANGED:
            pairs = _sharding_pairs(e.old, e.new) if {"sharding", "frontend_attributes"} & set(e.aspects) else []
            if not pairs:
                continue
            claimed.add(id(e))
            subject = "outputs" if e.new.is_root and sides.new.module.entry.name == e.new_computation else (
                "sharding constraint" if e.new.custom_call_target in SHARDING_TARGETS else "values")
            place = sides.place(e)
            # Shardy's names the axes: one array's split is read from it where both sides print one (XLA's tiles
            # would say the same pieces, unnamed).
            shardy = (sdy_sharding(e.old), sdy_sharding(e.new)) if len(e.new.shape.leaves()) == 1 else ("", "")
            for before, after in pairs:
                split = meshes.split_changes(*shardy) if all(shardy) else None
                if split is None or not split and sharding_key(before) != sharding_key(after):
                    split = meshes.split_changes(before, after)
                if split is not None and not split:
                    unsplit.add((), place, sides.runs(e), sides.layers(e))
                    continue
                values.add((Action.CHANGED, subject, before, after, place.computation, split or ()), place,
                           sides.runs(e), sides.layers(e))
        elif id(e) in claimed and e.instruction.custom_call_target in SHARDING_TARGETS:
            action = Action.ADDED if e.edit is Edit.INSERTED else Action.REMOVED
            sharding = _sharding_of(e.instruction)
            place = sides.place(e)
            values.add((action, "sharding constraint", "" if action is Action.ADDED else sharding,
                        sharding if action is Action.ADDED else "", place.computation, ()), place, sides.runs(e),
                       sides.layers(e))
    changes += [Change(ChangeKind.SHARDING, action, subject, place, count=g["count"], per_step=g["runs"],
                       before=before, after=after, layers=layer_count(g["layers"]), splits=split)
                for (action, subject, before, after, _, split), g, place in values.items()]
    return [*_mesh_changes(meshes, unsplit, effective=bool(changes)), *changes]


def _mesh_changes(meshes: MeshPair, unsplit: Groups, effective: bool) -> list[Change]:
    """The shardings that split their array alike, and the mesh where it changed, as one change: ``NO_SPLIT_CHANGE``
    with the mesh's axes before and after (``groups``: what happened to which axis). Where something does split an
    array differently (other shardings named with their splits, an axis resized), the mesh's change is ``MESH``."""
    found = list(unsplit.items())
    if not found and not meshes.changed:
        return []
    axes, resplit = meshes.axis_changes()
    before, after = (mesh_text(m.axes) if m else "(none)" for m in (meshes.old, meshes.new))
    subject = MESH if effective or resplit else NO_SPLIT_CHANGE
    if not found:  # the header's mesh alone changed: no sharding names what changed in it
        return [Change(ChangeKind.SHARDING, Action.CHANGED, subject, Place("main"), count=0, before=before,
                       after=after, groups=axes)]
    (_, group, place), = found
    return [Change(ChangeKind.SHARDING, Action.CHANGED, subject, place, count=group["count"], per_step=group["runs"],
                   before=before, after=after, groups=axes, layers=layer_count(group["layers"]))]


def _remat_swapped(match: ModuleMatch, sides: Sides, constraints: Sequence[InstructionEdit]) -> set[int]:
    """The constraints added outside a checkpoint that the match left unpaired because it paired their old selves with
    remat's copies of them (a copy under the checkpoint, same sharding and shape, paired with an old constraint):
    the program keeps them, one copy each (MaxText's remat PR: "3 sharding constraints added", 28 forward
    constraints before and after)."""
    copies: Counter = Counter()
    for comp in match.new.computations.values():
        for instr in comp.instructions:
            if instr.custom_call_target in SHARDING_TARGETS and match.partner(instr) is not None and \
                    under_checkpoint(sides.new.origin(instr, comp.name)[0]):
                copies[sharding_key(_sharding_of(instr)), str(instr.shape)] += 1
    swapped = set()
    for e in constraints:
        key = (sharding_key(_sharding_of(e.instruction)), str(e.instruction.shape))
        if e.edit is Edit.INSERTED and copies[key] > 0:
            copies[key] -= 1
            swapped.add(id(e))
    return swapped


def _parameter_shardings(match: ModuleMatch, meshes: MeshPair, unsplit: Groups) -> list[Change]:
    """Parameters whose sharding both modules print, and differs (another XLA prints a compiled module's parameters
    with or without theirs, and in another notation: ``{mesh['fsdp'=8], [{'fsdp'}, {}]}`` is
    ``{devices=[8,1]<=[8]}``), else whose Shardy sharding differs; each named by its state path and how its
    dimensions are split now. Those split alike on the target mesh go to ``unsplit``."""
    found: dict[tuple[str, str], list[tuple[EntryParam, tuple[str, ...]]]] = defaultdict(list)
    old_instrs = {p.parameter_number: p for p in match.old.entry.parameters}
    new_instrs = {p.parameter_number: p for p in match.new.entry.parameters}
    for pair in match.params:
        if pair.old is None or pair.new is None or pair.old.is_rng:
            continue
        before, after = _tidy(pair.old.sharding or ""), _tidy(pair.new.sharding or "")
        old_instr, new_instr = old_instrs.get(pair.old.index), new_instrs.get(pair.new.index)
        shardy = tuple(sdy_sharding(i) if i is not None else "" for i in (old_instr, new_instr))
        if not (before and after and sharding_key(before) != sharding_key(after)):
            before, after = shardy
            if not (before and after) or before == after:
                continue
        # Shardy's says the axes by name: the split is read from it where both sides print one.
        split = meshes.split_changes(*shardy) if all(shardy) else None
        if split is None or not split and sharding_key(before) != sharding_key(after):
            split = meshes.split_changes(before, after)
        if split is not None and not split:
            unsplit.add((), Place("main", "", "", (pair.new.pattern,)), 1, set())
            continue
        found[(before, after)].append((pair.new, split or ()))
    return [Change(ChangeKind.SHARDING, Action.CHANGED, "parameters",
                   Place("main", "", "", _patterns([p for p, _ in params])), count=len(params), before=before,
                   after=after, bytes=sum(p.bytes for p, _ in params), groups=_pattern_counts([p for p, _ in params]),
                   splits=_named_splits(params))
            for (before, after), params in sorted(found.items())]


def _named_splits(params: Sequence[tuple[EntryParam, tuple[str, ...]]]) -> tuple[str, ...]:
    """``params.wq: dim 0 split 2 (fsdp) -> 4 (fsdp, data)``: each parameter pattern's split changes, once."""
    named: dict[str, None] = {}
    for param, split in params:
        if split:
            named[f"{param.pattern}: {', '.join(split)}"] = None
    return tuple(named)


@dataclass(frozen=True)
class MeshPair:
    """Each side's mesh sized for the target (``hlo.mesh.TargetMesh``; None where a side declares none): the one
    place a sharding pair is judged on its split."""

    old: TargetMesh | None
    new: TargetMesh | None

    @classmethod
    def of(cls, match: ModuleMatch, declared: DeclaredSizes) -> MeshPair:
        # A golden written before its cell's sizes were kept is the same cell: its config's sizes are the best
        # known for its axes too (an axis only it has stays of unknown size).
        old, new = declared[0] or declared[1], declared[1] or declared[0]
        return cls(TargetMesh.of_module(match.old.header_attrs, old), TargetMesh.of_module(match.new.header_attrs, new))

    @property
    def changed(self) -> bool:
        return self.axes(self.old) != self.axes(self.new)

    @staticmethod
    def axes(mesh: TargetMesh | None) -> tuple:
        return mesh.axes if mesh is not None else ()

    def split_changes(self, before: str, after: str) -> tuple[str, ...] | None:
        """How the array's dimensions are split differently (empty: alike); None where either side's split is
        not known (a sharding of another form, a mesh the module does not declare)."""
        old, new = _split(before, self.old), _split(after, self.new)
        if old is None or new is None:
            return None
        return split_changes(old, new)

    def axis_changes(self) -> tuple[tuple[tuple[str, int], ...], bool]:
        """What happened to the mesh's axes, each with its size on the target (``"context"=1 added``, ``"data"=2
        removed``, ``"seq"=1 renamed "context"``, ``"data"=4 was size 2``, ``axes reordered``), and whether any of
        it splits an array differently: an axis of a size other than 1 (or unknown) added, removed, renamed or
        resized, or the order of those axes changed."""
        old, new = list(self.axes(self.old)), list(self.axes(self.new))
        old_names, new_names = [a.name for a in old], [a.name for a in new]
        gone = [a for a in old if a.name not in new_names]
        came = [a for a in new if a.name not in old_names]
        said: list[str] = []
        effective = any(a.size != 1 for a in (*gone, *came))
        # An axis gone where one of the same size came at the same place in the order: a rename.
        for a in list(gone):
            twin = next((b for b in came if b.size == a.size and old.index(a) == new.index(b)), None)
            if twin is not None:
                said.append(f"mesh axis {a.text()} renamed \"{twin.name}\"")
                gone.remove(a)
                came.remove(twin)
        said += [f"mesh axis {a.text()} added" for a in came] + [f"mesh axis {a.text()} removed" for a in gone]
        sizes = {a.name: a.size for a in old}
        resized = [a for a in new if a.name in sizes and sizes[a.name] != a.size]
        said += [f"mesh axis {a.text()} was size {'?' if sizes[a.name] is None else sizes[a.name]}"
                 for a in resized]
        effective = effective or bool(resized)
        kept_old = [n for n in old_names if n in new_names]
        if kept_old != [n for n in new_names if n in old_names]:
            said.append("mesh axes reordered")
            cutting = {a.name for a in (*old, *new) if a.size != 1}
            effective = effective or [n for n in kept_old if n in cutting] != \
                [n for n in new_names if n in old_names and n in cutting]
        return tuple((s, 1) for s in said), effective


def _split(sharding: str, mesh: TargetMesh | None) -> Split | None:
    """A sharding's split: Shardy's on its module's mesh; XLA's (``{devices=[4,1,2]...}``, ``{replicated}``) from its
    own tiles, which the module was lowered for (anonymous axes)."""
    if sharding.startswith("<"):
        return mesh.split(sharding) if mesh is not None else None
    key = sharding_key(sharding)
    if key[0] != "tiles":
        return None
    return Split(tuple((MeshAxis("", t),) for t in key[1]))


def _sharding_pairs(old: Instruction, new: Instruction) -> list[tuple[str, str]]:
    """(before, after) of each sharding that differs: the ``sharding`` attribute element by element (a tuple's);
    else shardy's own attribute."""
    before, after = _tidy(old.attrs.get("sharding", "")), _tidy(new.attrs.get("sharding", ""))
    if before and after and before != after:
        olds, news = _elements(before), _elements(after)
        if len(olds) == len(news):
            return [(a, b) for a, b in zip(olds, news) if sharding_key(a) != sharding_key(b)]
        return [(before, after)]
    a, b = sdy_sharding(old), sdy_sharding(new)
    if a == b:
        return []
    olds, news = _per_value(a), _per_value(b)
    if len(olds) == len(news) > 1:  # a tuple's, value by value (each its own array to split)
        return [(x, y) for x, y in zip(olds, news) if x != y]
    return [(a or "(none)", b or "(none)")]


def _per_value(shardings: str) -> list[str]:
    """Shardy's shardings of a tuple's values (``<@mesh, [{"a"}]>, <@mesh, [{}]>``), one each."""
    values, depth, start = [], 0, 0
    for i, ch in enumerate(shardings):
        if ch in "<[{(":
            depth += 1
        elif ch in ">]})":
            depth -= 1
        elif ch == "," and depth == 0:
            values.append(shardings[start:i].strip())
            start = i + 1
    values.append(shardings[start:].strip())
    return [v for v in values if v]


def sharding_key(sharding: str) -> tuple:
    """What a sharding says, whichever notation prints it: the tiles per dimension and the replication left over
    (``{replicated}``, ``{devices=[8,1]<=[8]}``, ``{devices=[2,1,4]<=[8] last_tile_dim_replicate}``, the named
    mesh's ``{mesh['fsdp'=8], [{'fsdp'}, {}]}``); its text where it is none of these (a tuple, a maximal one)."""
    text = sharding.strip().strip("{}").strip()
    if text == "replicated":
        return ("tiles", ())
    m = _TILED.match(text)
    if m:
        tiles = [int(d) for d in m.group(1).split(",") if d.strip()]
        if "last_tile_dim_replicate" in text and tiles:
            tiles = tiles[:-1]
        return ("tiles", tuple(t for t in tiles) if any(t > 1 for t in tiles) else ())
    m = _NAMED_MESH.match(text)
    if m:
        sizes = {name: int(size) for name, size in re.findall(r"'([^']+)'\s*=\s*(\d+)", m.group(1))}
        tiles = []
        for dim in re.findall(r"\{([^{}]*)\}", m.group(2)):
            size = 1
            for axis in re.findall(r"'([^']+)'", dim):
                size *= sizes.get(axis, 1)
            tiles.append(size)
        return ("tiles", tuple(tiles) if any(t > 1 for t in tiles) else ())
    return ("text", sharding)


def _elements(sharding: str) -> list[str]:
    if sharding.startswith("{{") or sharding.startswith("{ {"):
        return [s.strip() for s in split_top_level(sharding[1:-1])]
    return [sharding]


def _sharding_of(instr: Instruction) -> str:
    return _tidy(instr.attrs.get("sharding", "")) or sdy_sharding(instr)


def sdy_sharding(instr: Instruction) -> str:
    """Shardy's sharding of a value, without its wrapper: ``<@mesh, [{"fsdp"}, {}]>``."""
    m = _SDY_SHARDING.search(instr.attrs.get("frontend_attributes", ""))
    if not m:
        return ""
    text = m.group(1).replace('\\"', '"')
    inner = _SDY_WRAPPER.fullmatch(text)
    return (inner.group(1) or inner.group(2)) if inner else text


def _tidy(text: str) -> str:
    return " ".join(text.split())


def _patterns(params: Sequence[EntryParam]) -> tuple[str, ...]:
    return tuple(p for p, _ in _pattern_counts(params))


def _pattern_counts(params: Sequence[EntryParam]) -> tuple[tuple[str, int], ...]:
    counts = Counter(p.pattern for p in params)
    return tuple(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


# -- shapes ---------------------------------------------------------------------------------------------------------

def shapes(match: ModuleMatch, sides: Sides, claimed: set[int], found: Sequence[Change]) -> list[Change]:
    """Entry parameters and values whose dims changed, by factor (module doc). ``found``: the changes named so far;
    after SPMD partitioning, per-device shapes of state whose collectives changed are that state's sharding."""
    resharded = _resharded_leaves(found) if is_partitioned(match) else set()
    inputs: list[tuple[EntryParam, EntryParam]] = []
    moved: list[EntryParam] = []
    for pair in match.params:
        if pair.old is None or pair.new is None or pair.old.is_rng or pair.old.shape.dims == pair.new.shape.dims:
            continue
        if _leaf(pair.new) in resharded:
            moved.append(pair.new)
        else:
            inputs.append((pair.old, pair.new))
    changes = []
    if moved:
        changes.append(_per_device(moved, match))
    if inputs:
        factors = Counter(_factor(a.shape.num_elements, b.shape.num_elements) for a, b in inputs)
        (before, after), _ = Counter((_dims(a), _dims(b)) for a, b in inputs).most_common(1)[0]
        params = [b for _, b in inputs]
        changes.append(Change(ChangeKind.SHAPES, Action.CHANGED, "inputs", Place("main", "", "", _patterns(params)),
                              count=len(inputs), before=before, after=after,
                              bytes=sum(b.bytes - a.bytes for a, b in inputs), groups=_ordered(factors)))
    values = [e for e in match.edits if id(e) not in claimed and e.edit is Edit.CHANGED and _reshaped(e)]
    if inputs:  # the constants that scale by the inputs' sizes (a mean's 1/N) follow them
        claimed.update(id(e) for e in match.edits if e.edit is Edit.CHANGED and e.aspects == ("literal",)
                       and e.new.opcode == "constant" and not e.new.shape.dims)
    if not values:
        return changes
    claimed.update(id(e) for e in values)
    if moved and not inputs:  # the values' per-device shapes follow the state's new sharding
        return changes
    groups = Groups()
    for e in values:
        place = sides.place(e)
        groups.add((), place, sides.runs(e), sides.layers(e), **{_factor(_size(e.old), _size(e.new)): 1})
    forms = Counter((_dims(e.old), _dims(e.new)) for e in values)
    (before, after), _ = forms.most_common(1)[0]
    # After SPMD partitioning a value holds one device's shard: its dims say its shape or its sharding changed.
    what = "values (per device)" if is_partitioned(match) else "values"
    for _, g, place in groups.items():
        changes.append(Change(ChangeKind.SHAPES, Action.CHANGED, what, place, count=g["count"],
                              per_step=g["runs"], before=before, after=after, groups=_ordered(g["sums"]),
                              layers=layer_count(g["layers"])))
    return changes


def _reshaped(e: InstructionEdit) -> bool:
    """A value of other dims of the same type and rank holding another number of elements (the same elements in
    other dims is a compiler's bitcast or reshape, not a shape change); a tuple's, leaf by leaf of the same types."""
    old, new = e.old.shape, e.new.shape
    if "dims" not in e.aspects and not ("shape" in e.aspects and old.is_tuple and new.is_tuple):
        return False
    if old.is_tuple:
        a, b = old.leaves(), new.leaves()
        if len(a) != len(b) or any(x.dtype != y.dtype for x, y in zip(a, b)):
            return False
        return sum(x.num_elements for x in a) != sum(y.num_elements for y in b)
    # Another type or rank is another value paired (a program rewritten around it), not this one's shape changed.
    return old.dtype == new.dtype and len(old.dims) == len(new.dims) and old.num_elements != new.num_elements


def _size(instr: Instruction) -> int:
    return sum(leaf.num_elements for leaf in instr.shape.leaves())


def _per_device(params: Sequence[EntryParam], match: ModuleMatch) -> Change:
    old = {p.new.index: p.old for p in match.params if p.new is not None and p.old is not None}
    (before, after), _ = Counter((_dims(old[p.index]), _dims(p)) for p in params).most_common(1)[0]
    return Change(ChangeKind.SHARDING, Action.CHANGED, "parameters (per-device shape)",
                  Place("main", "", "", _patterns(params)), count=len(params), before=before, after=after,
                  bytes=sum(p.bytes - old[p.index].bytes for p in params), groups=_pattern_counts(params))


def _resharded_leaves(found: Sequence[Change]) -> set[str]:
    """What state the collectives added or removed read (``layer_*.up``: a weight and its optimizer's moments)."""
    return {".".join(path.split(".")[-2:]) for c in found if c.kind is ChangeKind.COLLECTIVES
            and c.action is not Action.CHANGED for path in c.place.paths}


def _leaf(p: EntryParam) -> str:
    return ".".join(p.folded_path.split(".")[-2:])


def _factor(before: int, after: int) -> str:
    """``x2``, ``x1/2``: how many times the elements."""
    if not before:
        return "x?"
    ratio = Fraction(after, before)
    return f"x{ratio.numerator}" if ratio.denominator == 1 else f"x{ratio.numerator}/{ratio.denominator}"


def _dims(x: Instruction | EntryParam) -> str:
    shape = x.shape
    return f"{shape.dtype}[{','.join(map(str, shape.dims))}]" if not shape.is_tuple else "tuple"


def _ordered(counts) -> tuple[tuple[str, int], ...]:
    return tuple(sorted(((k, n) for k, n in counts.items() if n), key=lambda kv: (-kv[1], kv[0])))


# -- ops at equal shapes --------------------------------------------------------------------------------------------

# The kinds whose story accounts for the ops left around it (change_flow.py).
_FLOW_STORIES = frozenset({ChangeKind.LOOPS, ChangeKind.REMAT, ChangeKind.GRADIENT, ChangeKind.TRANSFORM})


def rewrite_story(found: Sequence[Change]) -> bool:
    """Whether a change named so far rewrites the program around it, so that ops and constants changed in place are
    that story's: after SPMD partitioning, state resharded makes the partitioner rewrite its indexing (its slices,
    partition ids and constants); a loop rolled or unrolled, remat, lost gradient work."""
    return any(c.kind is ChangeKind.SHARDING and c.subject.endswith("(per-device shape)") or c.kind in _FLOW_STORIES
               for c in found)


def ops(match: ModuleMatch, sides: Sides, claimed: set[int], found: Sequence[Change]) -> list[Change]:
    """Instructions added, removed or changed in place at equal shapes, per region (module doc). ``found``: the
    changes named so far; after SPMD partitioning, state resharded makes the partitioner rewrite its indexing (its
    slices, partition ids and constants): that is the sharding change, left to the program size."""
    if rewrite_story(found):
        return []
    changed = [e for e in match.edits if id(e) not in claimed and e.edit is Edit.CHANGED and
               not set(e.aspects) <= _NOT_OPS]
    alone = [e for e in match.edits if id(e) not in claimed and e.edit is not Edit.CHANGED]
    if any(e.instruction.opcode in _SIZE_STORIES for e in alone):
        return []  # remat or a loop: the program size's story, and the pairs it left changed in place the rewrite's
    alone = _net(alone)
    if len(alone) > _OPS_MAX_SHARE * max(match.instructions):
        alone = []  # too many to be a local edit: the program size's
    if not changed and not alone:
        return []
    groups = Groups()
    moved: Counter = Counter()  # FLOPs per step of the dots and convolutions added (removed: negative), per group
    for e in (*changed, *alone):
        place = sides.place(e)
        key = (place.computation, place.op_name)
        if e.edit is Edit.CHANGED:
            mix = {f"{e.old.opcode} -> {e.new.opcode}" if e.old.opcode != e.new.opcode else
                   f"{e.new.opcode} ({', '.join(a for a in e.aspects if a not in _NOT_OPS)})": 1}
            if e.old.opcode in FLOP_OPS or e.new.opcode in FLOP_OPS:  # a dot of other dims: its FLOPs moved
                moved[key] += sides.runs(e) * (
                    (flops(e.new, sides.new.operands(e.new, e.new_computation)) if e.new.opcode in FLOP_OPS else 0)
                    - (flops(e.old, sides.old.operands(e.old, e.old_computation)) if e.old.opcode in FLOP_OPS
                       else 0))
        else:
            mix = {e.instruction.opcode: 1 if e.edit is Edit.INSERTED else -1}
            if e.instruction.opcode in FLOP_OPS:
                view = sides.new if e.edit is Edit.INSERTED else sides.old
                moved[key] += mix[e.instruction.opcode] * sides.runs(e) * flops(
                    e.instruction, view.operands(e.instruction, e.computation))
        groups.add(key, place, sides.runs(e), sides.layers(e), **mix)
    claimed.update(id(e) for e in (*changed, *alone))
    changes = []
    for key, g, place in groups.items():
        mix = _ordered_signed(g["sums"])  # an op removed here and added there in one region: moved, no change
        if not mix:
            continue
        added, removed = sum(n for _, n in mix if n > 0), -sum(n for _, n in mix if n < 0)
        in_place = any(" -> " in op or "(" in op for op, _ in mix)
        action = Action.CHANGED if in_place or (added and removed) else Action.ADDED if added else Action.REMOVED
        changes.append(Change(ChangeKind.OPS, action, place.op_name or place.computation or "main", place,
                              count=sum(abs(n) for _, n in mix), per_step=g["runs"], instructions=added - removed,
                              groups=mix, layers=layer_count(g["layers"]), flops=moved[key]))
    changes.sort(key=lambda c: -c.count)
    return changes


def _ordered_signed(mix) -> tuple[tuple[str, int], ...]:
    return tuple(sorted(((k, n) for k, n in mix.items() if n), key=lambda kv: (-abs(kv[1]), kv[0])))


def _net(alone: Sequence[InstructionEdit], key=lambda e: e.instruction.opcode) -> list[InstructionEdit]:
    """The instructions added or removed beyond what the other side holds of the same ``key`` (op): an op removed in
    one place and added in another (a value re-matched elsewhere, a fusion rebuilt) leaves the program's op mix as
    it was."""
    net = Counter()
    keys = [key(e) for e in alone]
    for e, k in zip(alone, keys):
        net[k] += 1 if e.edit is Edit.INSERTED else -1
    kept = []
    for e, k in zip(alone, keys):
        n = net[k]
        if n > 0 and e.edit is Edit.INSERTED or n < 0 and e.edit is Edit.DELETED:
            kept.append(e)
            net[k] -= 1 if n > 0 else -1
    return kept


