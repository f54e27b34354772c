"""What the gate saw of a pull request's change (``check --changes PATCH``, issue 46), as records: each run of changed
lines of model code, which cells' lowerings reached it (ran it, or read the file it is in) and which cells' programs
name it, and for the lines no cell reached, what would reach them where that is plain.

A green check says the programs of its cells did not change; these records say what of the change those programs
could have shown: "green, and here is what ran your change". Worked out once (``judging.change_reach``), read by
the ``unreached`` rule and every format.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import PurePosixPath

from hlo_audit.analysed import Record
from hlo_audit.patch import CONFIG_SUFFIXES, range_text
from hlo_audit.policy import Waiver


class Axis(StrEnum):
    """The matrix axis a branch no cell took reads, where its condition names it plainly."""

    LAYERS = "layers"
    SCAN = "scan"
    QUANT = "quant"
    NONE = ""


class Enclosing(StrEnum):
    """What holds lines no cell ran, in a file some cell ran: a branch of an ``if`` no cell took, a loop no cell
    iterated, a function no cell called, an exception handler no cell entered, or nothing plainer than the file."""

    BRANCH = "branch"
    ELSE = "else"
    LOOP = "loop"
    FUNCTION = "function"
    HANDLER = "handler"
    FILE = "file"


@dataclass(frozen=True)
class ReachHint:
    """Which cell would reach unreached lines, where it can be read: what encloses them (``kind``) at ``where``
    (``model.py:7``), its text (the ``if``'s condition, the function's name), the cells that ran that enclosing line,
    the axis the condition reads, and the cells of the matrix this run did not lower that are deeper in a series of
    those (a depth series whose deeper cell may run them). ``loaded_by`` empty: no cell loaded the file at all."""

    kind: Enclosing
    where: str = ""
    text: str = ""
    ran_by: tuple[str, ...] = ()
    axis: Axis = Axis.NONE
    deeper: tuple[str, ...] = ()
    loaded_by: tuple[str, ...] = ()

    def to_record(self) -> Record:
        return {"kind": self.kind.value, "where": self.where, "text": self.text, "ran_by": list(self.ran_by),
                "axis": self.axis.value, "deeper": list(self.deeper), "loaded_by": list(self.loaded_by)}

    @classmethod
    def from_record(cls, record: Record) -> ReachHint:
        return cls(Enclosing(record["kind"]), str(record["where"]), str(record["text"]), _names(record["ran_by"]),
                   Axis(record["axis"]), _names(record["deeper"]), _names(record["loaded_by"]))

    def joined(self, other: ReachHint) -> ReachHint:
        """One hint of two shards' (each knows its own cells): the cells each names, together; ``deeper`` less the
        cells either lowered."""
        ran = (*self.ran_by, *other.ran_by)
        lowered = set(ran) | set(self.loaded_by) | set(other.loaded_by)
        first = self if self.kind is not Enclosing.FILE or other.kind is Enclosing.FILE else other
        return replace(first, ran_by=tuple(dict.fromkeys(ran)),
                       deeper=tuple(c for c in dict.fromkeys((*self.deeper, *other.deeper)) if c not in lowered),
                       loaded_by=tuple(dict.fromkeys((*self.loaded_by, *other.loaded_by))))


@dataclass(frozen=True)
class ChangedRun:
    """One run of changed lines of model code in one file (``path`` as the diff names it; ``lines``, the code lines
    among them): the cells whose lowering reached any of them, those whose program names any, and the lines of it no
    cell reached, with what would reach them (``hint``; None where every line was reached)."""

    path: str
    lines: tuple[int, ...]
    reached_by: tuple[str, ...]
    named_by: tuple[str, ...]
    unreached: tuple[int, ...] = ()
    hint: ReachHint | None = None

    @property
    def place(self) -> str:
        return range_text(self.path, self.lines)[0] if self.lines else self.path

    def to_record(self) -> Record:
        return {"place": self.place, "path": self.path, "lines": list(self.lines), "reached_by": list(self.reached_by),
                "in_program_of": list(self.named_by), "unreached": range_text(self.path, self.unreached),
                "unreached_lines": list(self.unreached),
                "hint": self.hint.to_record() if self.hint is not None else None}

    @classmethod
    def from_record(cls, record: Record) -> ChangedRun:
        return cls(str(record["path"]), tuple(int(n) for n in record["lines"]), _names(record["reached_by"]),
                   _names(record["in_program_of"]), tuple(int(n) for n in record["unreached_lines"]),
                   ReachHint.from_record(record["hint"]) if record["hint"] is not None else None)

    def joined(self, other: ChangedRun) -> ChangedRun:
        """The same run as two shards saw it: reached by the cells of either, unreached where neither reached."""
        unreached = tuple(n for n in self.unreached if n in set(other.unreached))
        hint = self.hint.joined(other.hint) if self.hint is not None and other.hint is not None else None
        return ChangedRun(self.path, self.lines, tuple(dict.fromkeys((*self.reached_by, *other.reached_by))),
                          tuple(dict.fromkeys((*self.named_by, *other.named_by))), unreached,
                          hint if unreached else None)


@dataclass(frozen=True)
class Coverage:
    """The change against what the cells reached. ``runs``: each run of changed model code, in the diff's order;
    ``reached``/``in_program``: per cell, its changed lines as ``path:a-b``; ``cells``: the cells whose reach was
    known (lowered here or served with their record); ``unknown``: lowered cells whose reach was not recorded (their
    reach is not claimed either way); ``not_model``: changed files that are not model code (tests, docs, pins);
    ``by_file``: the cells knew only which files their lowering used (Python 3.11), not which lines."""

    source: str
    runs: tuple[ChangedRun, ...]
    cells: tuple[str, ...]
    reached: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    in_program: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    unknown: tuple[str, ...] = ()
    not_model: tuple[str, ...] = ()
    by_file: tuple[str, ...] = ()
    # How the policy judged the lines no cell reached: the ``unreached`` rule's action and its path waivers, kept
    # with the record so that `merge`, which reads only the shards' reports, judges their union alike.
    action: str = ""
    waivers: tuple[Waiver, ...] = ()
    # The text of each changed line of a config file (``configs/base.yml:640`` -> ``mesh_axes: [...]``), where this
    # run read it: which of them a sharding change names (those naming its mesh axes). Not recorded: a shard's
    # findings are made by the shard.
    config_text: Mapping[str, str] = field(default_factory=dict, compare=False)

    @property
    def unreached_runs(self) -> tuple[ChangedRun, ...]:
        return tuple(run for run in self.runs if run.unreached)

    @property
    def unreached(self) -> tuple[str, ...]:
        return tuple(place for run in self.unreached_runs for place in range_text(run.path, run.unreached))

    @property
    def changed_frames(self) -> frozenset[str]:
        """Each changed line of model code as an instruction's stack names it (``model.py:12``): what places a
        finding at the change (``hlo.locations.placed_by_change``)."""
        return frozenset(f"{PurePosixPath(run.path).name}:{n}" for run in self.runs for n in run.lines)

    def config_reached(self, cell: str) -> tuple[tuple[str, str], ...]:
        """The changed lines of config files (YAML) ``cell``'s lowering read, each run of them with its text
        (``("configs/base.yml:554-555", "...")``; "" where not known): what a change of its program no instruction's
        stack names a line of came from (a mesh axis declared there)."""
        found = []
        for place in self.reached.get(cell, ()):
            path, _, lines = place.rpartition(":")
            if PurePosixPath(path).suffix.lower() not in CONFIG_SUFFIXES:
                continue
            first, _, last = lines.partition("-")
            numbers = range(int(first), int(last or first) + 1) if first.isdigit() and (last or first).isdigit() \
                else ()
            found.append((place, "\n".join(self.config_text.get(f"{path}:{n}", "") for n in numbers)))
        return tuple(found)

    @property
    def changed_lines(self) -> int:
        return sum(len(run.lines) for run in self.runs)

    def to_record(self) -> Record:
        """The JSON reports' ``coverage`` (issue 46's shape: ``reached``, ``in_program``, ``unreached``), with each
        run's detail and the policy that judged it beside it."""
        return {"source": self.source, "reached": {c: list(v) for c, v in self.reached.items()},
                "in_program": {c: list(v) for c, v in self.in_program.items()}, "unreached": list(self.unreached),
                "cells": list(self.cells), "unknown": list(self.unknown), "not_model_code": list(self.not_model),
                "by_file": list(self.by_file), "runs": [run.to_record() for run in self.runs],
                "policy": {"action": self.action, "waivers": [
                    {"path": w.path, "reason": w.reason, "index": w.index, "source": w.source} for w in self.waivers]}}

    @classmethod
    def from_record(cls, record: Record) -> Coverage:
        """A shard's ``coverage`` as its check JSON wrote it (KeyError, TypeError, ValueError where it is not)."""
        policy = record["policy"]
        waivers = tuple(Waiver(rule="unreached", reason=str(w["reason"]), match={}, path=str(w["path"]),
                               index=int(w["index"]), source=str(w["source"])) for w in policy["waivers"])
        return cls(str(record["source"]), tuple(ChangedRun.from_record(r) for r in record["runs"]),
                   _names(record["cells"]), {str(c): _names(v) for c, v in record["reached"].items()},
                   {str(c): _names(v) for c, v in record["in_program"].items()}, _names(record["unknown"]),
                   _names(record["not_model_code"]), _names(record["by_file"]), str(policy["action"]), waivers)


def merged(shards: Sequence[Coverage]) -> Coverage:
    """The shards' coverages of one diff as one: each run reached by the cells of any shard, unreached where no
    shard's cells reached it; the first shard's policy (every shard of a run is judged by the same one)."""
    first, *others = shards
    runs = list(first.runs)
    for other in others:
        by_place = {(run.path, run.lines): run for run in other.runs}
        runs = [run.joined(by_place[run.path, run.lines]) if (run.path, run.lines) in by_place else run
                for run in runs]
    return replace(first, runs=tuple(runs),
                   cells=tuple(c for shard in shards for c in shard.cells),
                   reached={c: v for shard in shards for c, v in shard.reached.items()},
                   in_program={c: v for shard in shards for c, v in shard.in_program.items()},
                   unknown=tuple(c for shard in shards for c in shard.unknown),
                   by_file=tuple(c for shard in shards for c in shard.by_file))


def _names(values: Sequence) -> tuple[str, ...]:
    return tuple(str(v) for v in values)
