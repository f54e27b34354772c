"""``unreached``: changed lines of model code that no cell's lowering reached (``check --changes PATCH``, issue 46).

A green check says the cells' programs did not change; where the pull request changed lines none of them ran, it
says nothing of those lines. Advisory by default (shown on a green check), ``fail`` for a gate that must see every
changed line; waived by path (``[[waive]] rule = "unreached"``, ``path = "src/legacy/*.py"``, with a reason), since
these findings are of the change, not of a cell. The gate makes them (``judging.gate``) from the change's
``coverage.Coverage``; this module is the rule: its facts, spec, words and JSON details."""

from __future__ import annotations

from dataclasses import dataclass

from hlo_audit.coverage import Axis, ChangedRun, Enclosing, ReachHint
from hlo_audit.patch import range_text
from hlo_audit.policy import Action
from hlo_audit.rules.spec import RuleSpec
from hlo_audit.rules.wording import Json, cells_named, counted, plural

NAME = "unreached"
# Where a run of unreached lines is placed: the findings' "cell" (they are of the change, not of one).
PLACE = "changed lines"


@dataclass(frozen=True)
class Unreached:
    """Runs of changed model code of which ``runs``' ``unreached`` lines no cell reached, of the ``cells`` whose
    reach was known."""

    runs: tuple[ChangedRun, ...]
    cells: int

    @property
    def lines(self) -> int:
        return sum(len(run.unreached) for run in self.runs)

    @property
    def places(self) -> tuple[str, ...]:
        return tuple(place for run in self.runs for place in range_text(run.path, run.unreached))


def hint_words(hint: ReachHint | None) -> str:
    """Which cell would reach the lines, where it is plain (``coverage.ReachHint``), as a clause: "" where nothing is
    plainer than the lines themselves."""
    if hint is None:
        return ""
    if not hint.loaded_by:
        return "in a file no cell's lowering loaded"
    ran = cells_named(hint.ran_by)
    if hint.kind is Enclosing.BRANCH:
        said = f"under `if {hint.text}` at {hint.where}: {ran} ran it, none taking the branch"
    elif hint.kind is Enclosing.ELSE:
        said = f"in the else of `if {hint.text}` at {hint.where}: {ran} ran it, each taking the if"
    elif hint.kind is Enclosing.LOOP:
        said = f"in a loop over `{hint.text}` at {hint.where}: {ran} ran it, none iterating"
    elif hint.kind is Enclosing.FUNCTION:
        said = f"in {hint.text}() at {hint.where}, which no cell called"
    elif hint.kind is Enclosing.HANDLER:
        said = f"in an exception handler at {hint.where} no cell entered"
    else:
        said = f"in {hint.where or 'a file'}, which {cells_named(hint.loaded_by)} loaded"
    return said + _axis_words(hint)


def _axis_words(hint: ReachHint) -> str:
    if hint.axis is Axis.LAYERS:
        deeper = f" ({cells_named(hint.deeper)} in the matrix)" if hint.deeper else ""
        return f": a deeper cell of that series would reach it{deeper}"
    if hint.axis is Axis.SCAN:
        return ": a cell with the other scan setting would reach it"
    if hint.axis is Axis.QUANT:
        return ": a cell of another quantization would reach it"
    return ""


# The groups of unreached lines a message names one by one (a file's lines with one hint); the rest are counted.
GROUPS_SHOWN = 10


def grouped(runs: tuple[ChangedRun, ...]) -> list[tuple[str, list[int], str]]:
    """The unreached lines by file and by what would reach them, in the diff's order: (path, lines, hint words)."""
    groups: dict[tuple[str, str], list[int]] = {}
    for run in runs:
        groups.setdefault((run.path, hint_words(run.hint)), []).extend(run.unreached)
    return [(path, lines, hint) for (path, hint), lines in groups.items()]


def message(facts: Unreached) -> str:
    groups = grouped(facts.runs)
    shown = []
    for path, lines, hint in groups[:GROUPS_SHOWN]:
        where = f"{path}:" + ", ".join(place.rpartition(":")[2] for place in range_text(path, lines))
        shown.append(f"{where} ({hint})" if hint else where)
    rest = groups[GROUPS_SHOWN:]
    if rest:
        files = len({path for path, _, _ in rest})
        lines = sum(len(group_lines) for _, group_lines, _ in rest)
        shown.append(f"and {counted(lines, 'line')} more in {counted(files, 'file')} (--format json lists each)")
    return (f"{counted(facts.lines, 'changed line')} of model code reached no cell's lowering (of {facts.cells} "
            f"{plural(facts.cells, 'cell')}): {'; '.join(shown)}. The check says nothing of "
            f"{plural(facts.lines, 'it', 'them')}: add a cell that runs {plural(facts.lines, 'it', 'them')}, or waive "
            f"the path with a reason (rule \"{NAME}\", path = ...)")


def details(facts: Unreached) -> Json:
    return {"unreached": list(facts.places), "lines": facts.lines, "cells": facts.cells,
            "hints": [{"place": ", ".join(range_text(run.path, run.unreached)),
                       **(run.hint.to_record() if run.hint is not None else {})} for run in facts.runs]}


SPEC = RuleSpec(NAME, Action.WARN, None, (Unreached,), needs_golden=False, path_waivers=True,
                doc="changed lines of model code that no cell's lowering reached (check --changes)",
                message=message, details=details)
