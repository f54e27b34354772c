"""The host figures `check` and `golden update` measure now, for the host_cost rule: a cell whose golden records a
figure has its own measured in a lowering process (the step is the user's code: never run in the process that
judges), and `measure` hands the gate the figures it measured. Each is a ``prepare`` of ``gate.judged`` (or of
``golden update``): the results completed from the command's one snapshot of the goldens, before they are judged."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from hlo_audit.host_cost import CHECK_ROUNDS, HostFigure, Rounds
from hlo_audit.results import LoweredCell


def with_measured_figures(figures: dict[str, HostFigure]) -> Callable:
    """`measure`'s ``prepare`` for ``gate.judged``: each lowered cell with the host figure measured of it now."""

    return lambda tree, results: [replace(r, host=figures[r.cell.id])
                                  if isinstance(r, LoweredCell) and r.cell.id in figures else r for r in results]


def prepared_for_check(tree, results: Sequence) -> list:
    """`check`'s results completed from its snapshot of the goldens (``gate.judged``'s ``prepare``): each cell whose
    golden records a host figure with its own measured now (``with_host_figures``)."""
    return with_host_figures(results, tree.golden)


def prepared_for_update(tree, results: Sequence) -> list:
    """`golden update`'s results completed from the snapshot being replaced (``golden_update.update``'s ``prepare``):
    a golden's host figure measured again, its own kept where the leaves held (``with_host_figures``)."""
    return with_host_figures(results, tree.golden, keep_held=True)


# (a lowering's entry key, the rounds) -> its host figure's record, measured once per process (None: not measurable).
_MEASURED: dict[tuple[str, Rounds], dict | None] = {}


def with_host_figures(results: Sequence, golden: Callable, rounds: Rounds | None = None,
                      keep_held: bool = False) -> list:
    """``results`` with the host figure measured now for each ok cell whose golden (``golden(cell_id)``: the
    command's one snapshot's ``Golden``) records one (what the host_cost rule compares; every other cell as it is,
    measured nothing). ``keep_held`` (`golden update`): where the leaves
    held, the golden's own figure, so a golden is not rewritten for a time that moved within its noise."""

    from hlo_audit import workers  # noqa: PLC0415

    rounds = rounds or CHECK_ROUNDS
    recorded = {}
    for result in results:
        stored = golden(result.cell.id) if isinstance(result, LoweredCell) else None
        if stored is not None and stored.record is not None and stored.record.host is not None:
            recorded[result.cell.id] = stored.record
    # Measured in a lowering process (the step is the user's code: never run in the process that judges); a cell
    # not measurable now compares nothing, as for no figure. Each lowering (its entry key) once per process: a
    # snapshot read again because a `golden update` swapped the tree meanwhile does not measure again.
    wanted = [r for r in results if r.cell.id in recorded and (r.key, rounds) not in _MEASURED]
    if wanted:
        figures = workers.host_figures([r.cell for r in wanted], rounds)
        _MEASURED.update({(r.key, rounds): figures.get(r.cell.id) for r in wanted if r.key})
    measured = {r.cell.id: _MEASURED[(r.key, rounds)] for r in results
                if r.cell.id in recorded and r.key and _MEASURED.get((r.key, rounds)) is not None}
    out = []
    for result in results:
        record = recorded.get(result.cell.id)
        if record is None:
            out.append(result)
            continue
        try:
            figure = HostFigure.from_record(measured[result.cell.id]) if result.cell.id in measured else None
        except (KeyError, TypeError, ValueError):
            figure = None
        held = keep_held and (figure is None or figure.leaves == record.host.leaves)
        out.append(replace(result, host=record.host if held else figure))
    return out
