"""What a golden lacks of what the rules compare for its cell: a finding, never a silent pass.

A rule that finds nothing to compare says nothing, so a golden without a part the rules read turns them off for its
cell: a summary whose ``"hlo"`` is null and whose text is gone compares no text and runs no named rule (a lost
donation and an added ``jax.debug.print`` then passed, issue 34), one without kernel digests compares no kernel (a
Pallas kernel's block size change passed). Here each part is wanted where this version would write it for the cell
(``GoldenRecord.of``), and a golden that lacks one is a ``missing_golden`` finding naming the parts and the golden
update that writes them: damaged where the summary says the current format (which writes them all), written by an
older hlo-audit where it says an older one (``record.GOLDEN_FORMAT``; the finding is the ``missing_golden`` rule's:
``rules.missing_golden``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hlo_audit.findings import GoldenPart

if TYPE_CHECKING:
    from hlo_audit.golden.snapshot import Golden
    from hlo_audit.results import CellResult
    from hlo_audit.scaling import Series


def lacking(golden: Golden, result: CellResult, leads: Series | None) -> tuple[GoldenPart, ...]:
    """The parts of ``golden`` (read, not damaged) that the rules compare for ``result`` (an ok cell) and that it
    lacks. ``leads``: the cell's series where the cell is its shallowest (where the series' slopes are compared).
    Every cell whose text is known keeps it (``plan.text_owners``, since issue 26: every ok result of a run has one);
    a text named and missing is ``Golden.text_problem``'s, found by the gate already."""
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
    )
    return tuple(part for part, missing in wanted if missing)
