"""pandas views of run results (CSV export goes through these too).

pandas is imported by the functions that build a frame: a command that prints no CSV never pays for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hlo_audit.report.escape import csv_field
from hlo_audit.results import LoweredCell

if TYPE_CHECKING:
    import pandas as pd


def cells_frame(results, slopes: dict[str, float] | None = None) -> pd.DataFrame:
    """One row per cell: identity, status, entry params, one column per dtype and per role."""
    import pandas as pd  # noqa: PLC0415

    slopes = slopes or {}
    rows = []
    for r in results:
        c, lowered = r.cell, isinstance(r, LoweredCell)
        row = {**c.record(), "status": r.status.value, "entry_params": r.entry_params if lowered else None,
               "rng_params": r.rng_params if lowered else None, "slope_per_layer": slopes.get(c.id),
               "message": r.message}
        if lowered:
            row.update({f"dtype_{k}": v for k, v in r.summary.by_dtype.items()})
            row.update({f"role_{k}": v for k, v in r.summary.by_role.items()})
        rows.append(row)
    frame = pd.DataFrame(rows)
    count_columns = [col for col in frame.columns if col.startswith(("dtype_", "role_"))]
    frame[count_columns] = frame[count_columns].fillna(0).astype("int64")
    return frame


def _csv(frame: pd.DataFrame) -> str:
    """The frame as CSV, every text field through ``escape.csv_field`` (ids, messages and paths are input)."""
    text = frame.select_dtypes(include=["object", "string"]).columns
    escaped = frame.assign(**{c: frame[c].map(lambda v: csv_field(v) if isinstance(v, str) else v) for c in text})
    return escaped.to_csv(index=False)


def format_run_csv(results, slopes: dict[str, float]) -> str:
    return _csv(cells_frame(results, slopes))


def tidy_frame(view) -> pd.DataFrame:
    """One row per cell x dtype x role (a ``MatrixReport``'s tidy rows); golden columns are nullable integers."""
    import pandas as pd  # noqa: PLC0415

    frame = pd.DataFrame([row.values() for row in view.tidy_rows], columns=list(view.tidy_columns))
    for column in ("layers", "count", "bytes", "golden_count", "golden_delta"):
        frame[column] = frame[column].astype("Int64")
    return frame


def format_tidy_csv(view) -> str:
    return _csv(tidy_frame(view))
