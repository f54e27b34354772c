"""`init` on a matrix with cells the target refuses (issue 40: MaxText's gemma4-e2b refuses scan on, and init exited 1
with one 25,586-character line): each refused cell, or a depth series refused whole, becomes an ``[[exclude]]`` of
the config init wrote, with the target's reason on one comment line above its keys (cut at ``REASON_SHOWN``
characters, the whole text kept in ``cache_dir/refused/``); the other cells' goldens are made. And the excludes a
user names outright (``init --exclude model=...,scan=on``).

A refusal is the target's ``Unavailable`` or its model's own configuration rejecting the cell
(``CellResult.refused``); a crash (any other exception) is no refusal: init still fails on it.
"""

from __future__ import annotations

import os
import stat
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from hlo_audit.config import DEFAULT_CONFIG_FILE, DEFAULTS, ConfigError, validate
from hlo_audit.files import confined, write_atomic
from hlo_audit.matrix import AXES, Cell, known_values
from hlo_audit.report.escape import visible
from hlo_audit.results import CellResult, UnavailableCell
from hlo_audit.usage import InputError

REASON_SHOWN = 200  # characters of a reason on the config's comment line
REFUSED_DIR = "refused"  # under cache_dir: each refused cell's whole reason


@dataclass(frozen=True)
class Excluded:
    """One ``[[exclude]]`` init wrote: its keys, the cells it leaves out, the reason as the config's comment says
    it, and where the whole reason is kept (None: the comment holds all of it, or the user named it)."""

    rule: Mapping[str, object]
    cells: tuple[str, ...]
    reason: str
    full: Path | None = None


def _rule(cell: Cell, keys: Sequence[str], whole_series: bool) -> dict[str, object]:
    record = cell.record()
    return {key: record[key] for key in keys if not (whole_series and key == "layers")}


def refused_cells(cells: Sequence[Cell], results: Sequence[CellResult]) -> list[tuple[dict, list[CellResult]]]:
    """(exclude rule, the refused results it covers) for each depth series with refused cells: the series whole
    where every depth of it was refused, else each refused depth. The rule names the cell's model, scan and quant,
    and every other axis on which the matrix's cells differ, so it leaves out exactly those cells."""
    keys = [key for key in AXES if key in ("model", "scan", "quant") or len(known_values(cells, key)) > 1]
    if "layers" not in keys:
        keys.append("layers")
    refused = [r for r in results if r.refused]
    by_series: dict[str, list[CellResult]] = {}
    for r in refused:
        by_series.setdefault(r.cell.series, []).append(r)
    rules = []
    for series, found in by_series.items():
        whole = len(found) == sum(1 for c in cells if c.series == series)
        if whole:
            rules.append((_rule(found[0].cell, keys, True), found))
        else:
            rules += [(_rule(r.cell, keys, False), [r]) for r in found]
    return rules


def _toml(value: object) -> str:
    return str(value) if isinstance(value, int) else '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def exclude_tables(excluded: Sequence[Excluded], why: str) -> str:
    """The ``[[exclude]]`` tables, each with its reason on the comment line above its keys."""
    lines = ["", f"# {why}"]
    for e in excluded:
        lines += ["[[exclude]]", f"# {e.reason}", *(f"{key} = {_toml(value)}" for key, value in e.rule.items())]
    return "\n".join(lines) + "\n"


def _reason(results: Sequence[CellResult], folder: Path) -> tuple[str, Path | None]:
    """The target's reason on one line, cut at ``REASON_SHOWN`` characters with a pointer to the whole text, which
    is written under ``cache_dir/refused/`` (one file per rule: its first cell's id)."""
    first = results[0]
    kind = "unavailable" if isinstance(first, UnavailableCell) else "refused by the model's configuration"
    whole = " ".join(first.message.split())
    shown = visible(whole)
    if len(shown) <= REASON_SHOWN:
        return f"{kind}: {shown}", None
    path = folder / DEFAULTS["cache_dir"] / REFUSED_DIR / (first.cell.id.replace("/", "__") + ".txt")
    write_atomic(confined(path, folder, "init's refused reasons"), "".join(f"{r.cell.id}: {r.message}\n"
                                                                          for r in results))
    return (f"{kind}: {shown[:REASON_SHOWN]}... ({len(whole):,} characters; the whole reason: "
            f"{path.relative_to(folder)})"), path


def exclude_refused(folder: Path, cells: Sequence[Cell], results: Sequence[CellResult]) -> list[Excluded]:
    """Write each refused cell of init's first run as an ``[[exclude]]`` of its config (``refused_cells``), the
    config read back and validated before it replaces the one init wrote (its mode kept); none when no cell was
    refused, or when every cell was (nothing would be left to gate: init fails as before)."""
    rules = refused_cells(cells, results)
    if not rules or sum(len(found) for _, found in rules) == len(cells):
        return []
    excluded = []
    for rule, found in rules:
        reason, full = _reason(found, folder)
        excluded.append(Excluded(rule, tuple(r.cell.id for r in found), reason, full))
    path = folder / DEFAULT_CONFIG_FILE
    text = path.read_text(encoding="utf-8") + exclude_tables(
        excluded, "init: cells the target refused here, left out of the matrix (delete an exclude to gate its cells "
                  "again)")
    try:
        validate(tomllib.loads(text), DEFAULT_CONFIG_FILE, folder)
    except (tomllib.TOMLDecodeError, ConfigError) as exc:  # a rule init made: its own mistake, said in one line
        raise InputError(f"init: the excludes of the refused cells make a config hlo-audit refuses: {exc}") from None
    write_atomic(confined(path, folder, "init's config"), text, mode=stat.S_IMODE(os.stat(path).st_mode))
    return excluded


def parse_excludes(values: Sequence[str]) -> tuple[tuple[tuple[str, object], ...], ...]:
    """``init --exclude model=gemma4-e2b,scan=on`` (repeatable): each an exclude rule's keys and values (a depth
    an integer); the config's validation checks them with the rest."""
    rules = []
    for value in values:
        rule: dict[str, object] = {}
        for part in value.split(","):
            key, sep, item = (s.strip() for s in part.partition("="))
            if not sep or not key or not item:
                raise InputError(f"init --exclude expects KEY=VALUE[,KEY=VALUE...], got {value!r}")
            if key not in AXES:
                raise InputError(f"init --exclude {value}: unknown key {key!r} (use {', '.join(AXES)})")
            if key in rule:
                raise InputError(f"init --exclude {value}: {key} given twice")
            rule[key] = int(item) if key == "layers" and item.isdigit() else item
        rules.append(tuple(rule.items()))
    return tuple(rules)


def named_excludes(rules: Sequence[Sequence[tuple[str, object]]]) -> str:
    """The ``[[exclude]]`` tables of ``init --exclude``, for the config's text."""
    if not rules:
        return ""
    return exclude_tables([Excluded(dict(rule), (), "named by init --exclude") for rule in rules],
                          "init --exclude: cells left out of the matrix")
