"""A cell's golden, whole or wanting: decided here, once, for the gate (the ``missing_golden`` rule's findings,
``rules.missing_golden``) and for ``golden update`` (the goldens it heals, ``commands.golden_update``).

A golden is wanting when it is not there, or its summary cannot be read (``Golden.damaged``); when, on a pinned run
(CI), it records another compiler stack (nothing is relaxed there: it is re-blessed under this one); when the text it
names is missing, not UTF-8, or, where it differs from the cell's, not a module (``text_damage``); or when it lacks a
part the rules compare for the cell (``lacking``). A rule that finds nothing to compare says nothing, so each of these
is a finding, never a silent pass: a summary whose ``"hlo"`` is null and whose text is gone compares no text and runs
no named rule (a lost donation and an added ``jax.debug.print`` then passed, issue 34), one without kernel digests
compares no kernel (a Pallas kernel's block size change passed). Each part is wanted where this version would write it
for the cell (``GoldenRecord.of``); a golden that lacks one is damaged where its summary says the current format
(which writes them all), written by an older hlo-audit where it says an older one (``record.GOLDEN_FORMAT``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING

from hlo_audit.findings import GoldenPart, MissingGolden
from hlo_audit.golden.record import GOLDEN_FORMAT

if TYPE_CHECKING:
    from hlo_audit.comparison import CellDelta
    from hlo_audit.golden.record import Golden
    from hlo_audit.results import LoweredCell
    from hlo_audit.scaling import Series


def wanting(result: LoweredCell, golden: Golden | None, delta: CellDelta | None, leads: Series | None,
            command: Callable[[str], str], pinned_by: str | None) -> MissingGolden | None:
    """What an ok cell's golden wants, as the ``missing_golden`` finding says it (the first of: absent or unreadable,
    another compiler stack's on a pinned run, its text unusable, parts lacking); None where it is whole.
    ``delta``: the cell's comparison with it (None where it has no readable golden); ``command``: the golden update
    that writes the cell's; ``pinned_by``: what pinned this run's stack (``CI=true``), None on a local run."""
    cid = result.cell.id
    if delta is None:
        return MissingGolden(golden.damaged if golden else None, command(cid))
    if delta.pinned and delta.stack_moved:
        return MissingGolden(str(golden.summary or cid), command(cid), stack=delta.stack_moved, pinned_by=pinned_by)
    if delta.text_problem is not None:
        return MissingGolden(delta.text_problem, command(cid))
    lacks = lacking(golden, result, leads)
    if not lacks:
        return None
    return MissingGolden(why=str(golden.summary) if golden.summary is not None else cid, command=command(cid),
                         lacks=lacks, golden_format=golden.record.format,
                         damaged=golden.record.format >= GOLDEN_FORMAT)


def needs_healing(golden: Golden, now_text: str | None) -> bool:
    """Whether ``golden update`` rewrites ``golden`` because it is damaged (its summary, or its text against the
    cell's ``now_text``, None where the cell keeps no text), not because the program changed."""
    return bool(golden.damaged or golden.text_damage(now_text))


def orphans(golden_ids: Sequence[str], matrix_ids: Collection[str]) -> list[str]:
    """The goldens the matrix has no cell for: stale, left by a cell that went."""
    return [cid for cid in golden_ids if cid not in matrix_ids]


def lacking(golden: Golden, result: LoweredCell, leads: Series | None) -> tuple[GoldenPart, ...]:
    """The parts of ``golden`` (read, not damaged) that the rules compare for ``result`` (an ok cell) and that it
    lacks. ``leads``: the cell's series where the cell is its shallowest (where the series' slopes are compared).
    Every cell whose text is known keeps it (``plan.text_owners``, since issue 26: every ok result of a run has one);
    a text named and unusable is ``text_damage``'s."""
    record = golden.record
    has_text = result.normalized is not None or result.text is not None
    wanted = (
        (GoldenPart.TEXT, record.hlo is None and has_text),
        (GoldenPart.KERNEL_DIGESTS, bool(result.kernels_by_name) and record.kernels is None),
        (GoldenPart.LAUNCHES, result.launches is not None and record.launches is None),
        (GoldenPart.MEMORY, result.memory is not None and record.memory is None),
        (GoldenPart.CONSTANTS, result.constants is not None and record.constants is None),
        (GoldenPart.RNG_INCREMENTS, result.rng is not None and record.rng_increments is None),
        (GoldenPart.PATTERN_ROLES, bool(result.params) and record.groups_by_role is None),
        (GoldenPart.SLOPES, leads is not None and record.slopes is None),
        # `measure --record` writes the host figure and the timing together: a timing without its figure is a
        # figure deleted, which would turn host_cost off for the cell (issue 37).
        (GoldenPart.HOST_FIGURE, record.measured is not None and record.host is None),
        # The host_cost rule's count: without it a golden whose figure is gone compared leaves by its entry alone, and
        # leaves jax prunes from the entry grew unseen (issue 48).
        (GoldenPart.CALL_LEAVES, result.call_leaves is not None and record.call_leaves is None),
    )
    return tuple(part for part, missing in wanted if missing)
