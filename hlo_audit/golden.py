"""The golden store: what each cell looked like when a human last accepted it.

Per cell ``golden/<cell id>.json``: entry parameters by dtype and role, path-pattern groups, opcode
histogram, the state captured as constants, the depth series' per-layer slopes, a compiled cell's memory and cost,
a GPU cell's launches per step (kernels by kind, scalar, collectives, and by what they run and read), and the
environment fingerprint (jax, jaxlib, flax, maxtext, libtpu for a TPU topology, platform, stage). Per
depth series, at its shallowest depth, ``golden/<cell id>.hlo.txt``: the normalized
module. Keys are sorted and every item sits on its own line, so a PR diff of a golden reads like the change.

Writing is all-or-nothing, as syrupy's ``--snapshot-update`` is: every lowering happens first, the new files
are written to a staging folder beside the store, and only then renamed into place, one ``os.replace`` per
file. A crash or Ctrl-C before that point (where nearly all the time goes) leaves the old goldens untouched;
a cell that failed to lower writes nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from hlo_audit.hlo.constants import golden_summary
from hlo_audit.results import CellResult
from hlo_audit.scaling import Series

SUMMARY_SUFFIX = ".json"
REQUIRED_KEYS = ("entry_params", "by_dtype", "by_role", "groups", "environment")
HLO_SUFFIX = ".hlo.txt"


def summary_path(root: Path, cell_id: str) -> Path:
    return root / f"{cell_id}{SUMMARY_SUFFIX}"


def hlo_path(root: Path, cell_id: str) -> Path:
    return root / f"{cell_id}{HLO_SUFFIX}"


def summary(result: CellResult, series: Series | None, with_hlo: bool) -> dict:
    s = result.summary
    record = {
        "cell": result.cell.id,
        "entry_params": s["entry_params"],
        "by_dtype": s["by_dtype"],
        "by_role": s["by_role"],
        "groups": s["groups"],
        "opcodes": result.opcodes,
        "environment": result.environment,
        "hlo": hlo_path(Path(), result.cell.id).name if with_hlo else None,
    }
    if result.memory is not None:  # compiled cells: what the memory rule ratchets on
        record["memory"] = result.memory
    if result.cost is not None:
        record["cost"] = result.cost
    if result.constants is not None:  # state baked in as constants: the count ratchet covers it too
        record["constants"] = golden_summary(result.constants)
    if result.params:  # per dtype x role: what the report's tidy rows compare against
        record["by_dtype_role"] = {f"{dtype}:{role}": n for (dtype, role), (n, _) in result.by_dtype_role().items()}
        record["groups_by_role"] = result.groups_by_role()  # a finding names the roles of a pattern that moved
    if result.rng is not None:  # the count ratchet covers RNG counter increments per step too
        record["rng_increments"] = increments_summary(result.rng)
    if result.launches is not None:  # GPU cells: the count ratchet covers kernels per step too
        record["launches"] = launches_summary(result.launches)
    if series is not None:
        record["slopes"] = {
            "depths": list(series.depths),
            "total": series.total.slope,
            "by_dtype": {k: v.slope for k, v in series.by_dtype.items()},
            "by_role": {k: v.slope for k, v in series.by_role.items()},
        }
        if series.launches:
            record["slopes"]["launches"] = {k: v.slope for k, v in series.launches.items()}
    return record


# What a golden keeps of a result's launches record (hlo.thunks.LaunchReport.to_record): the counts the ratchet
# compares, and the groups a finding's attribution is the difference of.
_LAUNCH_FIELDS = ("total", "scalar", "collectives", "reading_rng", "by_category", "by_kind", "exact", "from_module",
                  "groups")


def launches_summary(launches: dict) -> dict:
    return {k: launches[k] for k in _LAUNCH_FIELDS if k in launches}


# The RNG analysis' verdicts (hlo_audit.hlo.rng_flow.VERDICTS), each with its increments' field in the record.
_INCREMENT_FIELDS = {"drawn": "drawn_increments", "carried": "dead_increments", "unknown": "unknown_increments"}


def increments_summary(rng: dict) -> dict:
    """RNG counter increments per step (an ``RngReport`` record), by stream verdict and by stream pattern: what a
    golden keeps so that the count ratchet covers them."""
    return {"by_verdict": {verdict: rng.get(field, 0) for verdict, field in _INCREMENT_FIELDS.items()},
            "by_pattern": {p["pattern"]: sum(p.get(field, 0) for field in _INCREMENT_FIELDS.values())
                           for p in rng["patterns"]}}


def dumps(record: dict) -> str:
    return json.dumps(record, indent=1, sort_keys=True) + "\n"


@dataclass(frozen=True)
class Golden:
    cell_id: str
    record: dict
    hlo: str | None

    @property
    def environment(self) -> dict:
        return self.record.get("environment", {})


class GoldenError(ValueError):
    """A golden file that cannot be read; names the file."""


def load(root: Path, cell_id: str) -> Golden | None:
    path = summary_path(root, cell_id)
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise GoldenError(f"{path}: unreadable golden: {exc}") from None
    missing = [k for k in REQUIRED_KEYS if not isinstance(record, dict) or k not in record]
    if missing:
        raise GoldenError(f"{path}: not a golden summary: missing {missing[0]!r} "
                          f"(regenerate: hlo-audit golden update --only id={cell_id})")
    text_path = hlo_path(root, cell_id)
    return Golden(cell_id, record, text_path.read_text() if text_path.is_file() else None)


def stored_ids(root: Path) -> list[str]:
    """Every cell id with a golden summary under ``root``."""
    if not root.is_dir():
        return []
    ids = []
    for path in root.rglob(f"*{SUMMARY_SUFFIX}"):
        if not any(part.startswith(".") for part in path.relative_to(root).parts):
            ids.append(str(path.relative_to(root))[: -len(SUMMARY_SUFFIX)])
    return sorted(ids)


@dataclass
class UpdateReport:
    written: list[str]
    unchanged: list[str]
    skipped: list[tuple[str, str]]  # (cell id, why): errors and unavailable cells write nothing
    pruned: list[str]


def update(root: Path, entries: list[tuple[CellResult, Series | None, str | None]],
           prune_ids: Iterable[str] = ()) -> UpdateReport:
    """Write the goldens of ``entries`` (result, its series, its normalized HLO or None); remove ``prune_ids``."""
    root = Path(root)
    wanted: dict[Path, str | None] = {}  # None: delete
    report = UpdateReport([], [], [], [])
    for result, series, hlo in entries:
        if result.status != "ok":
            report.skipped.append((result.cell.id, f"{result.status}: {result.message}"))
            continue
        wanted[summary_path(root, result.cell.id)] = dumps(summary(result, series, hlo is not None))
        # Only a series' shallowest depth keeps its text; a deeper one drops a text it had before.
        wanted[hlo_path(root, result.cell.id)] = hlo
    for cell_id in prune_ids:
        wanted[summary_path(root, cell_id)] = None
        wanted[hlo_path(root, cell_id)] = None
        if summary_path(root, cell_id).exists():
            report.pruned.append(cell_id)
    changes = {path: content for path, content in wanted.items() if _differs(path, content)}
    changed_ids = {_cell_id(root, path) for path in changes}
    for result, _, _ in entries:
        if result.status == "ok":
            (report.written if result.cell.id in changed_ids else report.unchanged).append(result.cell.id)
    _commit(root, changes)
    return report


def _differs(path: Path, content: str | None) -> bool:
    if content is None:
        return path.exists()
    return not (path.is_file() and path.read_text() == content)


def _cell_id(root: Path, path: Path) -> str:
    return str(path.relative_to(root)).removesuffix(HLO_SUFFIX).removesuffix(SUMMARY_SUFFIX)


def _commit(root: Path, changes: dict[Path, str | None]) -> None:
    """Stage every new file, then rename them into place; nothing under ``root`` changes until all are staged."""
    if not changes:
        return
    root.mkdir(parents=True, exist_ok=True)
    # Beside the store, not in it: a kill while staging must leave the store itself untouched.
    staging = Path(tempfile.mkdtemp(prefix=f".{root.name}-staging-", dir=root.parent))
    try:
        staged = []
        for i, (path, content) in enumerate(sorted(changes.items(), key=lambda kv: str(kv[0]))):
            if content is not None:
                tmp = staging / f"{i}.tmp"
                tmp.write_text(content)
                staged.append((tmp, path))
        for tmp, path in staged:
            path.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, path)
        for path, content in changes.items():
            if content is None:
                path.unlink(missing_ok=True)
                _remove_empty_parents(path.parent, root)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _remove_empty_parents(folder: Path, root: Path) -> None:
    while folder != root and folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()
        folder = folder.parent
