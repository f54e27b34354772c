"""Launches per step grouped by what they run and the state they read, and what changed between two steps.

A group is one kind of work reading one kind of state: ``42 scalar kernels loop_add_fusion, each reading
state.model.decoder.layers_*.*.to_nnx__rngs.*.count``. A report's groups (``launch_groups``), the difference of
two reports (``launch_delta``: seed 000's revert is ``+42 scalar kernels loop_add_fusion ...``), and the same from
what a record keeps (``group_counts``, ``group_delta``), so that a golden and a result compare as their reports do.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from hlo_audit.hlo.params import EntryParam, collapse_layers


class _Launch(Protocol):
    category: str
    is_scalar: bool
    reads: tuple[int, ...]

    @property
    def per_step(self) -> int: ...

    @property
    def name(self) -> str: ...


class LaunchReport(Protocol):
    """What grouping reads of a step's report (``hlo.launches.LaunchReport``, which builds its groups here): its
    launches, and its entry parameters by number."""

    @property
    def launches(self) -> Sequence[_Launch]: ...

    def param_by_number(self) -> Mapping[int, EntryParam]: ...

# What a launch of each category is called, one and many.
_CATEGORY_WORDS = {"kernel": ("kernel", "kernels"), "library": ("library call", "library calls"),
                   "collective": ("collective", "collectives"), "copy": ("copy", "copies"),
                   "memset": ("memset", "memsets"), "host": ("host transfer", "host transfers")}


@dataclass(frozen=True, slots=True)
class LaunchGroup:
    """Launches of one kind of work reading one kind of state: ``42 scalar kernels loop_add_fusion, each reading
    state.model.decoder.layers_*.*.to_nnx__rngs.*.count`` (a count is signed in a diff)."""

    count: int
    category: str
    scalar: bool
    name: str
    reads: str  # the common pattern of the parameters read ("" when none)
    reads_per_launch: int  # the most parameters one launch of the group reads

    def describe(self, signed: bool = False) -> str:
        one, many = _CATEGORY_WORDS.get(self.category, (f"{self.category} launch", f"{self.category} launches"))
        number = f"{self.count:+d}" if signed else str(self.count)
        text = f"{number} {'scalar ' if self.scalar else ''}{one if abs(self.count) == 1 else many} {self.name}"
        if self.reads:
            each = "" if abs(self.count) == 1 else "each "
            more = "" if self.reads_per_launch <= 1 else f" (up to {self.reads_per_launch} parameters)"
            text += f", {each}reading {self.reads}{more}"
        return text

    def to_record(self) -> dict:
        return {"count": self.count, "category": self.category, "scalar": self.scalar, "name": self.name,
                "reads": self.reads, "reads_per_launch": self.reads_per_launch}


# (category, scalar, name, roles of the parameters read, their layer-collapsed paths)
_Key = tuple[str, bool, str, tuple[str, ...], tuple[str, ...]]


def _fine_counts(report: LaunchReport, keep=lambda launch: True) -> dict[_Key, tuple[int, int, set[str]]]:
    """Per key: launches per step, the most parameters one launch reads, and the exact paths read."""
    params = report.param_by_number()
    counts: dict[_Key, tuple[int, int, set[str]]] = {}
    for launch in report.launches:
        if not launch.per_step or not keep(launch):
            continue
        read = [params[i] for i in launch.reads if i in params]
        paths = [p.path for p in read]
        key = (launch.category, launch.is_scalar, launch.name, tuple(sorted({p.role for p in read})),
               tuple(sorted({collapse_layers(p) for p in paths})))
        count, most, seen = counts.get(key, (0, 0, set()))
        counts[key] = (count + launch.per_step, max(most, len(paths)), seen | set(paths))
    return counts


def launch_groups(report: LaunchReport, scalar_only: bool = False) -> list[LaunchGroup]:
    """``report``'s launches per step grouped by what they run and read, largest first (``LaunchReport.groups``)."""
    return _merge(_fine_counts(report, lambda launch: not scalar_only or launch.is_scalar))


def _merge(counts: dict[_Key, tuple[int, int, set[str]]]) -> list[LaunchGroup]:
    """One group per (category, scalar, name, roles read, sign of the count): a kernel that increments RNG
    counters is not grouped with the same fusion incrementing the optimizer's step; the group's read pattern is
    common to all its paths."""
    merged: dict[tuple, tuple[int, int, set[str]]] = {}
    for (cat, scalar, name, roles, _collapsed), (count, most, paths) in counts.items():
        if not count:
            continue
        key = (cat, scalar, name, roles, count > 0)
        total, widest, seen = merged.get(key, (0, 0, set()))
        merged[key] = (total + count, max(widest, most), seen | paths)
    groups = [LaunchGroup(count=count, category=cat, scalar=scalar, name=name, reads=common_pattern(paths),
                          reads_per_launch=most)
              for (cat, scalar, name, _roles, _positive), (count, most, paths) in merged.items()]
    return sorted(groups, key=lambda g: (-abs(g.count), g.category, g.name, g.reads))


def launch_delta(before: LaunchReport, after: LaunchReport, scalar_only: bool = False) -> list[LaunchGroup]:
    """What ``after`` launches per step that ``before`` does not (positive counts) and the reverse (negative),
    grouped as ``LaunchGroup``: seed 000's revert is ``+42 scalar kernels loop_add_fusion, each reading
    state.model.decoder.layers_*.*.to_nnx__rngs.*.count``."""
    keep = (lambda launch: launch.is_scalar) if scalar_only else (lambda launch: True)
    return _merge(_delta(_fine_counts(before, keep), _fine_counts(after, keep)))


def _delta(old: dict[_Key, tuple[int, int, set[str]]],
           new: dict[_Key, tuple[int, int, set[str]]]) -> dict[_Key, tuple[int, int, set[str]]]:
    delta: dict[_Key, tuple[int, int, set[str]]] = {}
    for key in old.keys() | new.keys():
        count_old, most_old, paths_old = old.get(key, (0, 0, set()))
        count_new, most_new, paths_new = new.get(key, (0, 0, set()))
        if count_new != count_old:
            paths = ((paths_new - paths_old or paths_new) if count_new > count_old
                     else (paths_old - paths_new or paths_old))
            delta[key] = (count_new - count_old, max(most_old, most_new), paths)
    return delta


# `kernel scalar loop_add_fusion [rng_count] state.layers_*.mlp.to_nnx__rngs.aqt.count`: one group of a record.
_GROUP_KEY = re.compile(r"^(?P<category>\w+)(?P<scalar> scalar)? (?P<name>\S+)"
                        r"(?: \[(?P<roles>[^\]]*)\] (?P<paths>.*))?$")


def group_counts(report: LaunchReport) -> dict[str, int]:
    """Launches per step by what they run and the entry parameters they read, layer indices collapsed, as
    ``{"kernel scalar loop_add_fusion [rng_count] state.layers_*.bridge.to_nnx__rngs.params.count": 2, ...}``: what
    a record (a result, a golden) keeps so that two of them give the same attribution as ``launch_delta`` of their
    reports (``group_delta``), one line a group in a golden's diff."""
    counts = {}
    for (cat, scalar, name, roles, paths), (count, _most, _seen) in _fine_counts(report).items():
        key = (f"{cat}{' scalar' if scalar else ''} {name}"
               + (f" [{','.join(roles)}] {','.join(paths)}" if paths else ""))
        counts[key] = counts.get(key, 0) + count
    return dict(sorted(counts.items()))


def group_delta(before: dict[str, int], after: dict[str, int],
                reading: Iterable[str] | None = None) -> list[LaunchGroup]:
    """``launch_delta`` of two records' ``group_counts`` (the most parameters a launch reads: its collapsed paths);
    with ``reading`` (roles), only the launches that read an entry parameter of one of those roles."""
    old, new = _parse_groups(before), _parse_groups(after)
    if reading is not None:
        wanted = set(reading)
        old, new = ({k: v for k, v in side.items() if wanted & set(k[3])} for side in (old, new))
    return _merge(_delta(old, new))


def _parse_groups(groups: dict[str, int]) -> dict[_Key, tuple[int, int, set[str]]]:
    fine: dict[_Key, tuple[int, int, set[str]]] = {}
    for text, count in groups.items():
        m = _GROUP_KEY.match(text)
        if m is None:
            raise ValueError(f"not a launch group: {text!r}")
        roles = tuple(r for r in (m.group("roles") or "").split(",") if r)
        paths = tuple(p for p in (m.group("paths") or "").split(",") if p)
        fine[(m.group("category"), bool(m.group("scalar")), m.group("name"), roles, paths)] = (
            count, len(paths), set(paths))
    return fine


def common_pattern(paths: Iterable[str]) -> str:
    """One pattern for a set of state paths: layer indices collapsed (``layers_*``), positions that differ as
    ``*``, a run of them as one; paths of different lengths keep their common head and tail around one ``*``.

    ``{layers_0.mlp.wi_0.to_nnx__rngs.aqt.count, layers_1.self_attention.query.to_nnx__rngs.params.count}`` ->
    ``layers_*.*.to_nnx__rngs.*.count``."""
    split = sorted({tuple(collapse_layers(p).split(".")) for p in paths})
    if not split:
        return ""
    if len(split) == 1:
        return ".".join(split[0])
    if len({len(parts) for parts in split}) == 1:
        parts = [column[0] if len(set(column)) == 1 else "*" for column in zip(*split)]
    else:
        head = _common_prefix(split)
        tail = _common_prefix([tuple(reversed(p[len(head):])) for p in split])
        parts = [*head, "*", *reversed(tail)]
    collapsed: list[str] = []
    for part in parts:
        if not (part == "*" and collapsed and collapsed[-1] == "*"):
            collapsed.append(part)
    return ".".join(collapsed)


def _common_prefix(sequences: Sequence[tuple[str, ...]]) -> list[str]:
    prefix: list[str] = []
    for column in zip(*sequences):
        if len(set(column)) != 1:
            break
        prefix.append(column[0])
    return prefix

