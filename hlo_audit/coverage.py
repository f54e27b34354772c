"""What the gate saw of a pull request's change (``check --changes PATCH``, issue 46), as records: each run of changed
lines of model code, which cells' lowerings reached it (ran it, or read the file it is in) and which cells' programs
name it, and for the lines no cell reached, what would reach them where that is plain.

A green check says the programs of its cells did not change; these records say what of the change those programs
could have shown: "green, and here is what ran your change". Worked out once (``judging.change_reach``), read by
the ``unreached`` rule and every format.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from hlo_audit.analysed import Record
from hlo_audit.patch import range_text


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

    @property
    def unreached_runs(self) -> tuple[ChangedRun, ...]:
        return tuple(run for run in self.runs if run.unreached)

    @property
    def unreached(self) -> tuple[str, ...]:
        return tuple(place for run in self.unreached_runs for place in range_text(run.path, run.unreached))

    @property
    def changed_lines(self) -> int:
        return sum(len(run.lines) for run in self.runs)

    def to_record(self) -> Record:
        """The JSON reports' ``coverage`` (issue 46's shape, with each run's detail beside it)."""
        return {"source": self.source, "reached": {c: list(v) for c, v in self.reached.items()},
                "in_program": {c: list(v) for c, v in self.in_program.items()}, "unreached": list(self.unreached),
                "cells": list(self.cells), "unknown": list(self.unknown), "not_model_code": list(self.not_model),
                "by_file": list(self.by_file),
                "runs": [{"place": run.place, "reached_by": list(run.reached_by), "in_program_of": list(run.named_by),
                          "unreached": range_text(run.path, run.unreached),
                          "hint": run.hint.to_record() if run.hint is not None else None} for run in self.runs]}
