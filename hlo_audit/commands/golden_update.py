"""`hlo-audit golden update`: the goldens of an outcome's cells written, in one all-or-nothing swap of the store.

What is written is the outcome's, decided once there: each ok cell's record with its depth series as a golden records
it (``Outcome.recorded_series``: stored depths a partial run did not lower included) and, at the cells that keep it
(``Plan.owners``), its canonical text. Everything is read through the one snapshot the transaction holds (after a
killed update's leftovers are settled), so one update reads each golden file once. `measure --record` writes its
host figures into goldens the same way (``record_figures``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from hlo_audit.golden import store
from hlo_audit.golden.health import needs_healing
from hlo_audit.golden.record import HLO_SUFFIX, SUMMARY_SUFFIX, GoldenRecord, dumps
from hlo_audit.judging.outcome import Outcome
from hlo_audit.plan import Plan, full_matrix_of
from hlo_audit.results import CellResult, LoweredCell
from hlo_audit.rules import dead_model
from hlo_audit.rules.dead_model import DeadModel
from hlo_audit.stack import is_compiler
from hlo_audit.usage import EXIT_DIFFERENCE, EXIT_OK

if TYPE_CHECKING:  # measure's rows (measure reads the goldens; this writes its figures into them)
    from hlo_audit.commands.measure import CellMeasurement


@dataclass(frozen=True)
class GoldenUpdate:
    """What one golden update did."""

    written: list[str]
    unchanged: list[str]
    skipped: list[tuple[str, str]]  # (cell id, why): errors and unavailable cells write nothing
    pruned: list[str]
    pruned_files: list[str]  # every file --prune removed, as paths
    healed: list[str]  # cells whose golden was damaged and is now rewritten
    cleaned: list[str]  # stale staging folders of killed runs, removed
    # Cells whose step computes none of its model (``rules.dead_model``), with what was found: their goldens are
    # written, and said, never blessed silently; `check` fails them unless waived.
    computes_none: list[tuple[str, DeadModel]] = field(default_factory=list)
    # init's first update where the target refused every cell: no golden, nothing to gate (``skipped`` says why)
    every_cell_refused: bool = False

    @property
    def failed(self) -> bool:
        """A cell failed to lower (an unavailable one is not a failure), or init found nothing to gate."""
        return self.every_cell_refused or any(why.startswith("error") for _, why in self.skipped)

    @property
    def exit_code(self) -> int:
        """`golden update`'s (and `init`'s) exit code: a cell that failed to lower is a failure."""
        return EXIT_DIFFERENCE if self.failed else EXIT_OK


def writable(plan: Plan) -> None:
    """Refuse, before anything is lowered, a golden folder outside the plan's project (``store.inside``)."""
    store.inside(Path(plan.config.golden_dir), plan.config.project)


def update(plan: Plan, results: Sequence[CellResult], prune: bool = False, prepare=None) -> GoldenUpdate:
    """Write the goldens of ``results``; with ``prune``, remove hlo-audit's goldens of cells no longer in the matrix
    (only files hlo-audit wrote: ``Snapshot.owned_files``). ``prepare(snapshot, results)``: the results completed
    from the snapshot being replaced first (``judging.host_figures.with_host_figures``)."""
    root = Path(plan.config.golden_dir)
    with store.transaction(root, within=plan.config.project) as (snapshot, cleaned):
        results = prepare(snapshot, results) if prepare else results
        outcome = Outcome.of(plan, results, snapshot)
        wanted, healed = _records(outcome)
        pruned, pruned_files = [], []
        if prune:
            matrix = {c.id for c in full_matrix_of(plan)}
            for cell_id in (cid for cid in snapshot.stored_ids() if cid not in matrix):
                files = snapshot.owned_files(cell_id)
                wanted.update(dict.fromkeys(files))
                pruned_files += [str(path) for path in files]
                pruned += [cell_id] if files else []
        changed = {_cell_id(root, path) for path in store.commit(snapshot, wanted)}
    lowered = [r.cell.id for r in results if r.ok]
    return GoldenUpdate(
        written=[cid for cid in lowered if cid in changed], unchanged=[cid for cid in lowered if cid not in changed],
        skipped=[(r.cell.id, f"{r.status}: {r.message}") for r in results if not r.ok], pruned=pruned,
        pruned_files=pruned_files, healed=[cid for cid in healed if cid in changed], cleaned=[str(p) for p in cleaned],
        computes_none=[(r.cell.id, facts) for r in results if isinstance(r, LoweredCell)
                       and (facts := dead_model.computes_none(r)) is not None])


def record_figures(rows: Sequence[CellMeasurement], golden_dir, project=None) -> tuple[str, ...]:
    """`measure --record`: each measured cell's figures written into its golden summary (``host``, ``measured``), in
    one swap of the golden store as an update writes it (``golden.store``: all or nothing, each rewritten golden
    keeping its mode, only inside ``project``); a cell without a golden is skipped (`golden update` writes it first).
    Returns the ids written."""
    written, wanted = [], {}
    with store.transaction(golden_dir, within=project) as (snapshot, _):
        for row in rows:
            stored = snapshot.golden(row.cell)
            golden = stored.record if stored is not None else None
            if golden is None or row.host is None:
                continue
            updated = replace(golden, host=row.host,
                              measured=row.timing.to_record() if row.timing is not None else golden.measured)
            wanted[store.summary_path(snapshot.root, row.cell)] = dumps(updated.to_json())
            written.append(row.cell)
        store.commit(snapshot, wanted)
    return tuple(written)


def _records(outcome: Outcome) -> tuple[dict[Path, str | None], list[str]]:
    """The files the outcome's ok cells want (path -> text; None: delete) and the cells whose golden was damaged."""
    root, wanted, healed = outcome.goldens.root, {}, []
    for r in outcome.results:
        if not isinstance(r, LoweredCell):
            continue
        cid = r.cell.id
        old = outcome.goldens.golden(cid)
        hlo = r.canonical_text() if cid in outcome.plan.owners else None
        if old is not None and needs_healing(old, hlo):
            healed.append(cid)
        record = _kept_versions(GoldenRecord.of(r, outcome.recorded_series.get(r.cell.series), hlo is not None),
                                old.record if old is not None and not old.damaged else None)
        wanted[store.summary_path(root, cid)] = dumps(record.to_json())
        # A cell that keeps no text (outside the owners) drops the text its old summary named.
        if hlo is not None or (old is not None and old.names_text):
            wanted[store.hlo_path(root, cid)] = hlo
    return wanted, healed


def _kept_versions(record: GoldenRecord, old: GoldenRecord | None) -> GoldenRecord:
    """``record`` as the golden already says it where the two differ only in the code under test's versions
    (``stack.is_compiler``: maxtext 0.2.3 -> 0.2.4 with the program the same): a version line alone is no change
    to write, and a release commit does not rewrite every golden for it."""
    if old is None:
        return record
    environment = {k: v for k, v in record.environment.items() if is_compiler(k)}
    # Only the keys this run records: a key the old golden holds beyond them is refused by a check (issue 48).
    environment.update({k: v for k, v in old.environment.items() if not is_compiler(k) and k in record.environment})
    kept = replace(record, environment=dict(sorted(environment.items())))
    return kept if dumps(kept.to_json()) == dumps(old.to_json()) else record


def _cell_id(root: Path, path: Path) -> str:
    return str(path.relative_to(root)).removesuffix(HLO_SUFFIX).removesuffix(SUMMARY_SUFFIX)
