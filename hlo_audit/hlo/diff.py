"""Semantic diff of two HLO modules.

What a reviewer asks of two lowerings: did the entry parameters change (which, grouped how), did the
program change, is every difference RNG bookkeeping, and if not, what changed and where? The verdict ladder:

``identical`` (same text) < ``identical-after-normalization`` (same canonical text, and the same kernels:
kernels.py) < ``rng-state-only`` (the same once RNG state is stripped from both, and the draws' keys no less sound:
none drawn twice or from a literal where the other side's are not, rng_keys.py) < ``renamed-only`` (the same
once RNG state is stripped and the new module's entry parameters carry their partners' state paths: match.py)
< ``changed`` (with the kinds of change). ``renamed-only`` is no difference in the program: like the first two it
is not a difference `diff`'s exit code reports, and its renames are listed.

Past the verdict, the two modules (RNG state stripped) are matched as graphs (match.py) and every difference is
named (changes.py): donation, host transfers, precision, kernels, renames, parameters, program size, header
attributes, other instructions, each with its place. The normalized text diff is a view on request
(``max_text_lines``), its module header summarized per attribute (which one, how many entries) rather than
printed whole.
"""

from __future__ import annotations

import difflib
import zlib
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace

from hlo_audit.hlo.analysis import Analysis
from hlo_audit.hlo.change_kinds import explain
from hlo_audit.hlo.change_structure import sdy_sharding
from hlo_audit.hlo.changes import Change, ChangeKind, MatchSummary, summary
from hlo_audit.hlo.constants import golden_summary
from hlo_audit.hlo.header import position_entries
from hlo_audit.hlo.kernels import is_kernel_call, kernel_digest
from hlo_audit.hlo.locations import PlacedByChange, Places
from hlo_audit.hlo.match import ModuleMatch, match_modules, match_params
from hlo_audit.hlo.mesh import DeclaredSizes, module_mesh
from hlo_audit.hlo.normalize import normalize, normalize_with_printed
from hlo_audit.hlo.params import EntryParam
from hlo_audit.hlo.reorder import Sameness, reordered, reorders, rng_derivation, same_program
from hlo_audit.hlo.rng import strip_rng_state
from hlo_audit.hlo.rng_keys import KeyReport, key_changes, placed, same_draws
from hlo_audit.hlo.shapes import split_top_level
from hlo_audit.hlo.text import Computation, HloModule, cyclic_gc_paused

VERDICTS = ("identical", "identical-after-normalization", "rng-state-only", "renamed-only", "changed")
# Verdicts that are no difference in the program: `diff` exits 0 for them.
SAME_PROGRAM = frozenset({"identical", "identical-after-normalization", "renamed-only"})
DEFAULT_TEXT_DIFF_LINES = 200
# A header attribute longer than this is summarized in the text diff (its entries and a digest), not printed.
_HEADER_VALUE_SHOWN = 80


@dataclass(frozen=True)
class ParamGroupDelta:
    role: str
    dtype: str
    pattern: str
    count: int  # positive: added in NEW; negative: removed


@dataclass
class ModuleDiff:
    """What differs between two modules: the verdict, its kinds, the parameter groups the match found added and
    removed (renames taken out), the op deltas, every change named. The entry parameters' counts against each other
    (in all, by dtype and role) are not here: ``comparison.ParamDelta`` works them out once, for `check` and `diff`
    alike (``comparison.Structural`` holds both)."""

    verdict: str
    changes: list[str]  # for "changed": parameters, ops, shapes, layouts, shardings, constants, attributes
    params_added: list[ParamGroupDelta]
    params_removed: list[ParamGroupDelta]
    opcode_dtype_delta: dict[str, int]
    computations_added: list[str]
    computations_removed: list[str]
    text_diff: list[str] = field(default_factory=list)
    text_diff_omitted: int = 0
    constants: dict | None = None  # captured_delta of the two modules: state baked in as constants
    # Every difference named (changes.py), most costly kinds first; empty unless the verdict is renamed-only or
    # changed. `match`: the structural match in numbers (None where no match was needed).
    named: list[Change] = field(default_factory=list)
    match: MatchSummary | None = None
    # The computations the match found inserted and deleted (by name), where there is a match.
    computations: tuple[list[str], list[str]] | None = None

    @property
    def differs(self) -> bool:
        """A difference in the program (`diff` exits 1): RNG state or a change; renames alone are none."""
        return self.verdict not in SAME_PROGRAM


def count_delta(old: Mapping[str, int], new: Mapping[str, int]) -> dict[str, int]:
    """new - old per key, only where they differ, keys sorted (shared with the gate)."""
    keys = sorted(set(old) | set(new))
    return {k: new.get(k, 0) - old.get(k, 0) for k in keys if new.get(k, 0) != old.get(k, 0)}


def captured_delta(old: Mapping, new: Mapping) -> dict | None:
    """Growth and shrinkage of state baked in as constants, between two ``constants.golden_summary`` records;
    None when nothing changed (shared with the gate).

    Captured arrays are compared when both sides know them (steps the tool traced); otherwise the modules'
    large constants, the view an HLO text alone gives. Literal RNG keys are counted from the module either way.
    """
    if old.get("captured") is not None and new.get("captured") is not None:
        basis, before, after = "captured arrays", old["captured"], new["captured"]
        groups = count_delta(before["groups"], after["groups"])
    else:
        basis, before, after, groups = "large constants", old["large"], new["large"], {}
    by_dtype = count_delta(before["by_dtype"], after["by_dtype"])
    bytes_by_dtype = count_delta(before["bytes_by_dtype"], after["bytes_by_dtype"])
    keys = [old["literal_keys"], new["literal_keys"]]
    if not by_dtype and not bytes_by_dtype and keys[0] == keys[1]:
        return None
    return {"basis": basis, "arrays": [sum(before["by_dtype"].values()), sum(after["by_dtype"].values())],
            "bytes": [sum(before["bytes_by_dtype"].values()), sum(after["bytes_by_dtype"].values())],
            "by_dtype": by_dtype, "bytes_by_dtype": bytes_by_dtype, "groups": groups, "literal_keys": keys}


def captured_change(delta: dict) -> str:
    """In words, as the gate and `diff` print it: ``captured arrays 56 -> 0 (436,379,816 -> 0 bytes): s8 -14, ...;
    literal RNG keys 14 -> 0; path patterns: ...``"""
    (old_n, new_n), (old_b, new_b), (old_k, new_k) = delta["arrays"], delta["bytes"], delta["literal_keys"]
    text = f"{delta['basis']} {old_n} -> {new_n} ({old_b:,} -> {new_b:,} bytes)"
    text += f": {signed_counts(delta['by_dtype'])}" if delta["by_dtype"] else ""
    text += f"; literal RNG keys {old_k} -> {new_k}" if old_k != new_k else ""
    return text + (f"; path patterns: {signed_counts(delta['groups'])}" if delta["groups"] else "")


def signed_counts(d: Mapping[str, int]) -> str:
    """``u32 +126, f32 -2``: a delta dict in words (shared with the gate)."""
    return ", ".join(f"{k} {v:+d}" for k, v in d.items())


def _param_groups(old: Analysis, new: Analysis) -> tuple[list[ParamGroupDelta], list[ParamGroupDelta]]:
    old_paths = Counter(p.path for p in old.params)
    new_paths = Counter(p.path for p in new.params)
    added: Counter[tuple[str, str, str]] = Counter()
    removed: Counter[tuple[str, str, str]] = Counter()
    for p in new.params:
        if new_paths[p.path] > old_paths[p.path]:
            added[(p.role, p.dtype, p.pattern)] += 1
    for p in old.params:
        if old_paths[p.path] > new_paths[p.path]:
            removed[(p.role, p.dtype, p.pattern)] += 1
    # Paths present on both sides but with another dtype count as removed + added.
    old_by_path = {p.path: p for p in old.params}
    for p in new.params:
        before = old_by_path.get(p.path)
        if before is not None and before.shape.text != p.shape.text and old_paths[p.path] == new_paths[p.path]:
            added[(p.role, p.dtype, p.pattern)] += 1
            removed[(before.role, before.dtype, before.pattern)] += 1

    def rows(counter: Counter, sign: int) -> list[ParamGroupDelta]:
        return [ParamGroupDelta(r, d, pat, sign * n)
                for (r, d, pat), n in sorted(counter.items(), key=lambda kv: (-kv[1], kv[0]))]

    return rows(added, 1), rows(removed, -1)


def opcode_dtype_histogram(module: HloModule, computations: Collection[str] | None = None) -> Counter[str]:
    """``opcode:dtype`` -> instructions over the whole module, or over ``computations`` of it (``tuple`` for
    tuple-shaped ones)."""
    return _histogram(module, lambda i: f"{i.opcode}:{i.shape.dtype or 'tuple'}", computations)


def _computation_names(text: str) -> Counter[str]:
    names = Counter()
    for line in text.splitlines():
        if line.startswith("%") and line.endswith("{"):
            names[line[1:].split(" ", 1)[0]] += 1
    return names


def _histogram(module: HloModule, key, computations: Collection[str] | None = None) -> Counter:
    if computations is None:
        return Counter(key(i) for i in module.instructions())
    return Counter(key(i) for name in computations for i in module.computations[name].instructions)


@dataclass(frozen=True)
class _Side:
    """One module as diff compares its kinds of change: the computations its canonical text prints (one of each
    set of identical ones, so that a golden's text and its raw lowering count alike) and its entry parameters."""

    module: HloModule
    printed: frozenset[str]
    params: Sequence[EntryParam]

    def computations(self) -> list[Computation]:
        return [c for name, c in self.module.computations.items() if name in self.printed]

    def instructions(self):
        for comp in self.computations():
            yield from comp.instructions


def _kinds_of_change(old: _Side, new: _Side, params_differ: bool) -> list[str]:
    """What differs between two modules whose canonical texts differ, each kind comparing like with like.

    ``ops``: how many instructions of each opcode. ``shapes``: how many values of each shape (dtype and dims);
    where the ops are the same, also which opcode makes which shape. ``layouts`` / ``shardings``: the layouts /
    shardings of the same thing on both sides: an entry parameter (by state path, same shape), or, per opcode
    and shape, the instructions of the entry, or of computations that are the same on both sides but for layouts
    and shardings (the same opcodes and shapes). A computation only one side has is a change of ops and shapes,
    never of the shardings of what it shares a shape with elsewhere. Anything else is ``attributes``.
    """
    kinds = ["parameters"] if params_differ else []
    old_ops, new_ops = (_histogram_of(side, lambda i: i.opcode) for side in (old, new))
    if old_ops != new_ops:
        kinds.append("ops")
    old_shapes, new_shapes = (_histogram_of(side, lambda i: (i.shape.dtype, i.shape.dims)) for side in (old, new))
    if old_shapes != new_shapes or (
            old_ops == new_ops and _histogram_of(old, _shape_key) != _histogram_of(new, _shape_key)):
        kinds.append("shapes")
    # A sharding is XLA's attribute and Shardy's (``xla.sdy.sharding`` in the frontend attributes, which a module
    # lowered on one device is all that differs by: its XLA shardings all ``{replicated}``).
    for kind, aspect in (("layouts", lambda i: i.shape.layout),
                         ("shardings", lambda i: (i.attrs.get("sharding"), sdy_sharding(i)))):
        before, after = _aspects_of_the_same(old, aspect), _aspects_of_the_same(new, aspect)
        if any(before[key] != after[key] for key in before.keys() & after.keys()):
            kinds.append(kind)
    # The mesh the shardings name (the header's, Shardy's): a change of it is one of the shardings'.
    if "shardings" not in kinds and module_mesh(old.module.header_attrs) != module_mesh(new.module.header_attrs):
        kinds.append("shardings")
    before, after = _literals(old), _literals(new)
    if any(before[k] != after[k] and before[k].total() == after[k].total() for k in before.keys() & after.keys()):
        kinds.append("constants")
    return kinds or ["attributes"]


def _literals(side: _Side) -> dict[tuple, Counter]:
    """The constants' values by type (a learning rate changed is ``constants``, not ``attributes``): as many
    constants of a type on both sides with other values. Constants added or removed are the ops'."""
    found: dict[tuple, Counter] = {}
    for i in side.instructions():
        if i.opcode == "constant":
            found.setdefault((i.shape.dtype, i.shape.dims), Counter())[
                (i.literal, i.attrs.get("frontend_attributes", ""))] += 1
    return found


def _histogram_of(side: _Side, key) -> Counter:
    return Counter(key(i) for i in side.instructions())


def _shape_key(instr) -> tuple:
    return instr.opcode, instr.shape.dtype or "tuple", instr.shape.dims


def _aspects_of_the_same(side: _Side, aspect) -> dict[tuple, set]:
    """What ``aspect`` (a layout, a sharding) is, per thing both sides can have: ``("param", path, dtype, dims)``
    for an entry parameter; ``(computation, opcode, dtype, dims)`` for the instructions of the entry
    (``computation`` None) or of computations with that skeleton (their opcodes and shapes, counted)."""
    paths = {p.index: p.path for p in side.params}
    found: dict[tuple, set] = {}
    for comp in side.computations():
        where = None if comp.is_entry else _skeleton(comp)
        for instr in comp.instructions:
            if comp.is_entry and instr.opcode == "parameter" and instr.parameter_number in paths:
                key = ("param", paths[instr.parameter_number], instr.shape.dtype, instr.shape.dims)
            else:
                key = (where, *_shape_key(instr))
            found.setdefault(key, set()).add(aspect(instr))
    return found


def _skeleton(comp: Computation) -> tuple:
    """A computation as far as layouts and shardings are no part of it: its opcodes and shapes, counted."""
    return tuple(sorted(Counter(_shape_key(i) for i in comp.instructions).items()))


@dataclass
class _Verdict:
    """What ``diff_modules`` decided of two different texts: the verdict, its kinds, every change named, the match
    in numbers, and the parameter groups left once renames are taken out."""

    verdict: str
    changes: list[str]
    added: list[ParamGroupDelta]
    removed: list[ParamGroupDelta]
    named: list[Change] = field(default_factory=list)
    match: MatchSummary | None = None
    # The computations the match found inserted and deleted (by name), where there is a match.
    computations: tuple[list[str], list[str]] | None = None


@dataclass(frozen=True)
class _Stripped:
    """One side with its RNG state taken out (or as it is, where it has none) and its canonical text."""

    module: HloModule
    kept: Sequence[EntryParam]
    canonical: str
    printed: frozenset[str]  # the computations its canonical text prints


def diff_modules(old: Analysis, new: Analysis, max_text_lines: int = DEFAULT_TEXT_DIFF_LINES,
                 new_places: Places | None = None, old_places: Places | None = None,
                 mesh_sizes: DeclaredSizes = (None, None),
                 keys: tuple[KeyReport, KeyReport] | None = None) -> ModuleDiff:
    """The verdict, the parameter and op deltas, every change named, and ``max_text_lines`` of the normalized text
    diff (0: none, and none computed). ``new_places``: where ``new`` is a canonical text printed without metadata,
    each instruction's op_name and source (``hlo.locations.canonical_places``), which place its changes;
    ``old_places``: the same of ``old`` where its own text said them (a dump; a golden's says none); ``keys``: each
    side's literal and reused keys where its text cannot say them (XLA's, which shows no draw: what the stage read of
    the module jax handed XLA), which decide whether RNG state is all that differs."""
    added, removed = _param_groups(old, new)
    # The same text, and the same values behind the constants it elides: nothing to normalize.
    same_text = old.text == new.text and old.literal_digests == new.literal_digests
    old_text, new_text = ("", "") if same_text else (old.normalized, new.normalized)
    kernels_differ = not same_text and _kernels(old.module) != _kernels(new.module)
    if same_text:
        judged = _Verdict("identical", [], added, removed)
    elif old_text == new_text and not kernels_differ:
        judged = _Verdict("identical-after-normalization", [], added, removed)
    else:
        with cyclic_gc_paused():  # the match and its kinds build millions of objects, none in a cycle (text.py)
            judged = _judge(old, new, old_text, new_text, kernels_differ, added, removed, (old_places, new_places),
                            mesh_sizes, keys or (old.keys, new.keys))
    text_diff, omitted = _text_diff(old, new, old_text, new_text, judged.verdict, max_text_lines)
    moved = _computations_moved(judged, old_text, new_text)
    return ModuleDiff(
        verdict=judged.verdict, changes=judged.changes, params_added=judged.added, params_removed=judged.removed,
        # Over the computations the canonical text prints, on both sides: a golden's text holds one of each set
        # of identical computations, and a raw lowering beside it must not count its repeats as new ops.
        opcode_dtype_delta={} if old.text == new.text else count_delta(
            opcode_dtype_histogram(old.module, old.printed_computations),
            opcode_dtype_histogram(new.module, new.printed_computations)),
        computations_added=moved[0], computations_removed=moved[1],
        text_diff=text_diff, text_diff_omitted=omitted,
        constants=captured_delta(golden_summary(old.constants.to_record()), golden_summary(new.constants.to_record())),
        named=_with_key_changes(old, new, judged, new_places), match=judged.match,
    )


def _with_key_changes(old: Analysis, new: Analysis, judged: _Verdict, new_places: Places | None) -> list[Change]:
    """The named changes, literal and reused RNG keys first (rng_keys.py): whatever the verdict, RNG state only
    included (a key drawn twice instead of split strips to the same program), where the texts differ at all."""
    if judged.verdict in ("identical", "identical-after-normalization"):
        return judged.named
    return [*key_changes(old.keys, placed(new.keys, new.module, new.params, new_places)), *judged.named]


def _computations_moved(judged: _Verdict, old_text: str, new_text: str) -> tuple[list[str], list[str]]:
    """The computations added and removed: the match's where there is one (a computation whose body changed is the
    same computation, changed, though its canonical name, a digest of the body, is new); else by canonical name
    (read off the texts only then: 400,000 lines each on a module of 100,000 computations)."""
    if judged.computations is not None:
        return sorted(judged.computations[0]), sorted(judged.computations[1])
    if old_text == new_text:
        return [], []
    old_comps, new_comps = _computation_names(old_text), _computation_names(new_text)
    return sorted((new_comps - old_comps).elements()), sorted((old_comps - new_comps).elements())


def _stripped(side: Analysis, text: str, has_rng_state: bool) -> _Stripped:
    if not has_rng_state:  # nothing to strip: the module and its canonical text as they are
        return _Stripped(side.module, side.params, text, side.printed_computations)
    module, kept = strip_rng_state(side.module, side.params)
    canonical, printed = normalize_with_printed(module, kept)
    return _Stripped(module, kept, canonical, printed)


def _through_stripping(before: HloModule, after: HloModule, places: Places | None) -> Places | None:
    """``places`` (keyed by ``before``'s names) keyed by ``after``'s: stripping RNG state rewrites the computations
    it passes through (a scanned body's loop carries the keys) under new names, their instructions kept, so each
    kept instruction keeps its place (a scanned body's changes were else placed near the scan call)."""
    if places is None or after is before:
        return places
    where = {id(instr): (comp.name, instr.name) for comp in before.computations.values() for instr in comp.instructions}
    moved = {(comp.name, instr.name): places[key] for comp in after.computations.values()
             for instr in comp.instructions if (key := where.get(id(instr))) in places}
    return PlacedByChange(moved, places.changed) if isinstance(places, PlacedByChange) else moved


def _judge(old: Analysis, new: Analysis, old_text: str, new_text: str, kernels_differ: bool,
           added: list[ParamGroupDelta], removed: list[ParamGroupDelta],
           places: tuple[Places | None, Places | None], mesh_sizes: DeclaredSizes,
           keys: tuple[KeyReport, KeyReport]) -> _Verdict:
    """Two texts that differ after normalization (or whose kernels do): RNG state only, renames only, or changed,
    with every change named from the structural match."""
    has_rng_state = any(p.is_rng for p in old.params) or any(p.is_rng for p in new.params)
    a, b = _stripped(old, old_text, has_rng_state), _stripped(new, new_text, has_rng_state)
    if has_rng_state and a.canonical == b.canonical and not kernels_differ:
        if same_draws(*keys):
            return _Verdict("rng-state-only", [], added, removed)
        # Stripping takes out every key and what is computed from it, draws included: a key handed on unsplit strips
        # to the program its split had. The draws' keys are no bookkeeping where one side draws from a key twice or
        # from a literal where the other does not: the bits the draws see differ (named: rng_keys.key_changes).
        return _Verdict("changed", ["rng"], added, removed, [rng_derivation(old.module, new.module)])
    match = match_modules(a.module, b.module, a.kept, b.kept)
    old_places, new_places = (_through_stripping(old.module, a.module, places[0]),
                              _through_stripping(new.module, b.module, places[1]))
    named = explain(match, old.params, new.params, old.module.header_attrs, new.module.header_attrs, new_places,
                    old_places, mesh_sizes)
    added, removed = _without_renames(added, removed, match, old, new)
    computations = (match.computations_inserted, match.computations_deleted)
    same = Sameness.DIFFERENT if kernels_differ else _renamed_only(match, a.canonical, old, new, has_rng_state)
    if same is not Sameness.DIFFERENT:
        # Renamed or reordered, and else the same: its renames (the module's name among them) are all there is to
        # name, what a reordering of the state's leaves moved is no change; but RNG derivation that only the rename
        # could hide (salts collapsed, a fold_in more) is a change, named.
        renames = [c for c in named
                   if c.kind is ChangeKind.RENAME or c.kind is ChangeKind.HEADER and c.subject == "name"]
        renames += [] if any(c.kind is ChangeKind.RENAME for c in renames) else reorders(match)
        if same is Sameness.SAME:
            return _Verdict("renamed-only", [], added, removed, renames, summary(match), computations)
        return _Verdict("changed", ["rng"], added, removed, [rng_derivation(old.module, new.module), *renames],
                        summary(match), computations)
    if kernels_differ and a.canonical == b.canonical:
        changes = ["kernels"]  # the canonical text drops kernel bodies: nothing else differs
    else:
        params_differ = any(p.old is None or p.new is None or p.reshaped for p in match.params)
        changes = _kinds_of_change(_Side(a.module, a.printed, a.kept), _Side(b.module, b.printed, b.kept),
                                   params_differ)
        changes += ["kernels"] if kernels_differ else []
    return _Verdict("changed", changes, added, removed, named, summary(match), computations)


def _text_diff(old: Analysis, new: Analysis, old_text: str, new_text: str, verdict: str,
               max_text_lines: int) -> tuple[list[str], int]:
    """The first ``max_text_lines`` of the normalized texts' unified diff (headers summarized), and how many more."""
    if verdict not in ("rng-state-only", "renamed-only", "changed") or max_text_lines <= 0:
        return [], 0
    full = list(difflib.unified_diff(_header_summarized(old_text).splitlines(),
                                     _header_summarized(new_text).splitlines(),
                                     old.source, new.source, lineterm="", n=1))
    return full[:max_text_lines], max(0, len(full) - max_text_lines)


def _without_renames(added: list[ParamGroupDelta], removed: list[ParamGroupDelta], match: ModuleMatch,
                     old: Analysis, new: Analysis) -> tuple[list[ParamGroupDelta], list[ParamGroupDelta]]:
    """The parameter groups added and removed, less the parameters the match found renamed (named as renames)."""
    renamed = [p for p in match.params if p.renamed]
    if not renamed:
        return added, removed
    gone = Counter((p.new.role, p.new.dtype, p.new.pattern) for p in renamed)
    back = Counter((p.old.role, p.old.dtype, p.old.pattern) for p in renamed)

    def less(rows: list[ParamGroupDelta], taken: Counter, sign: int) -> list[ParamGroupDelta]:
        kept = []
        for g in rows:
            n = abs(g.count) - taken[(g.role, g.dtype, g.pattern)]
            if n > 0:
                kept.append(ParamGroupDelta(g.role, g.dtype, g.pattern, sign * n))
        return kept

    return less(added, gone, 1), less(removed, back, -1)


def _kernels(module: HloModule) -> Counter[str]:
    """The kernels a module runs, by content (kernels.py): the canonical text drops their bodies."""
    return Counter(kernel_digest(i) for i in module.instructions() if i.opcode == "custom-call" and is_kernel_call(i))


def _renamed_only(match: ModuleMatch, old_canonical: str, old: Analysis, new: Analysis,
                  has_rng_state: bool) -> Sameness:
    """Whether the modules differ only by entry parameters' names and order: every parameter paired, some renamed or
    moved, none of another shape, and the new module, its parameters named as their partners, prints the old one's
    text or numbers as it does whatever the order of leaves (reorder.py); RNG derivation included (reorder.py: its
    salts as a rename explains them), so a rename never hides an RNG change: ``Sameness.RNG`` says so."""
    pairs = match.params
    if any(p.old is None or p.new is None or p.reshaped for p in pairs):
        return Sameness.DIFFERENT
    renamed = any(p.renamed for p in pairs)
    if not renamed and not reordered(pairs):
        return Sameness.DIFFERENT
    old_path = {p.new.index: p.old.path for p in pairs}
    new_kept = [p.new for p in pairs]
    relabeled = [replace(p, path=old_path.get(p.index, p.path)) for p in sorted(new_kept, key=lambda p: p.index)]
    # The module's name is the jitted function's: renamed with the parameters, it is a rename too.
    if normalize(replace(match.new, name=match.old.name), relabeled) == old_canonical:
        stripped = Sameness.SAME
    else:
        stripped = same_program(match.old, match.new, [(p.old.index, p.new.index) for p in pairs], renamed)
    if stripped is not Sameness.SAME or not has_rng_state:
        return stripped
    # The RNG state set aside above, the whole modules: the kept parameters paired as the match paired them, the
    # RNG state's among themselves.
    rng = match_params([p for p in old.params if p.is_rng], [p for p in new.params if p.is_rng])
    if any(p.old is None or p.new is None or p.reshaped for p in rng):
        return Sameness.RNG
    every = [(p.old.index, p.new.index) for p in (*pairs, *rng)]
    return Sameness.SAME if same_program(old.module, new.module, every, renamed) is Sameness.SAME else Sameness.RNG


def _header_summarized(text: str) -> str:
    """Canonical text with its ``HloModule`` line split per attribute, each long one summarized (its entries and a
    digest): a changed ``input_output_alias`` is one line in the text diff, not two lines of 2,500 characters."""
    if not text:
        return text
    header, _, rest = text.partition("\n")
    name, _, attrs = header.partition(", ")
    lines = [name]
    for item in split_top_level(attrs) if attrs else []:
        key, _, value = item.strip().partition("=")
        if len(value) <= _HEADER_VALUE_SHOWN:
            lines.append(f"  {key}={value}")
            continue
        entries = position_entries(key, value)
        count = f"{entries} entries, " if entries is not None else ""
        lines.append(f"  {key}=<{count}{len(value):,} characters, digest {zlib.crc32(value.encode()):08x}>")
    return "\n".join(lines) + "\n" + rest
