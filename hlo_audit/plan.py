"""Config -> cells: what a command runs (``plan``), or the one cell an id names (``plan_cell``).

A plan keeps the matrix it was chosen from (``universe``: every cell at this run's depths, before ``--only`` and
``--shard``), because which depth of a series keeps the golden text is the whole series' business, not the
selection's (``text_owners``), and ``merge`` checks that shards were dealt from one selection (``shard``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from hlo_audit import host, workers
from hlo_audit.cache.key import analysis_fingerprint, package_versions
from hlo_audit.config import Config, load_config
from hlo_audit.lowering import TargetError
from hlo_audit.matrix import MAX_DEPTH, Cell, MatrixError, fingerprint, parse_shard, selection, shard_of
from hlo_audit.resolve import resolve
from hlo_audit.rules.registry import fingerprinted_tolerances
from hlo_audit.usage import InputError


@dataclass(frozen=True)
class Judge:
    """What judged a check's cells besides the cells themselves: the config (its matrix's axes and the golden
    folder's name) and its policy (actions, waivers, tolerances), each as a fingerprint; hlo-audit's version with a
    digest of its source; the environment (the versions that lower, and the Python's); the project's commit (git's
    HEAD, "unknown" outside git) and the goldens judged against (a digest of the golden folder's tree, the check's
    one snapshot: ``golden.snapshot.Snapshot.digest``; "" until a check reads them). Shards of one run agree on all of
    it: ``merge`` refuses a shard judged otherwise (one judged with ``hlo_text`` off would merge into "passed"; one
    judged at another commit would pass what the other commit changed)."""

    config: str
    policy: str
    hlo_audit: str
    environment: str
    commit: str = "unknown"
    goldens: str = ""

    @classmethod
    def of(cls, config: Config) -> Judge:
        rules = config.rules
        policy = {"actions": dict(sorted(rules.actions.items())),
                  "waivers": [[w.rule, w.reason, dict(sorted(w.match.items())), w.pattern, w.built_in]
                              for w in rules.waivers],
                  **fingerprinted_tolerances(rules)}
        matrix = {"target": config.target, "series": [asdict(axes) for axes in config.series],
                  "exclude": [dict(rule) for rule in config.exclude], "nnx": config.nnx,
                  "golden_dir": config.golden_dir.name}
        return cls(config=_digest(matrix), policy=_digest(policy), hlo_audit=_own_version(),
                   environment=_environment(), commit=head_commit(config.project))

    def differences(self, other: Judge) -> tuple[tuple[str, str, str], ...]:
        """(what, this one's, the other's) for each part that differs, in the order a reader checks them."""
        return tuple((what, getattr(self, what), getattr(other, what))
                     for what in JUDGE_PARTS if getattr(self, what) != getattr(other, what))


# The parts of a ``Judge`` in the order a reader checks them (and the order ``merge`` names the first that differs).
JUDGE_PARTS = ("commit", "hlo_audit", "environment", "config", "goldens", "policy")


def head_commit(project: Path | None) -> str:
    """The commit checked out in ``project`` (git's HEAD), or "unknown" outside a git work tree (or without git).
    Asked each time: a process (a test, a pytest plugin) may outlive a commit."""
    try:
        done = subprocess.run(["git", "rev-parse", "--verify", "-q", "HEAD"], cwd=project or None,
                              capture_output=True, text=True, timeout=30, check=False, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    head = done.stdout.strip()
    return head if done.returncode == 0 and re.fullmatch(r"[0-9a-f]{40,64}", head) else "unknown"


def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


@functools.cache
def _own_version() -> str:
    """``0.1.0 (source 1a2b...)``: one version number spans many commits; the source's digest tells them apart."""
    return f"{host.installed_version('hlo-audit')} (source {analysis_fingerprint()})"


@functools.cache
def _environment() -> str:
    versions = {**package_versions(), "python": f"{sys.version_info.major}.{sys.version_info.minor}"}
    return ", ".join(f"{name} {version}" for name, version in versions.items())


@dataclass(frozen=True)
class Shard:
    """Which shard of which selection a check ran: K of N, the fingerprint of the selection they were dealt from,
    this shard's cell count (0 when the dealing gave it none) and what judged it. What `merge` checks."""

    index: int
    count: int
    matrix: str
    cells: int
    judge: Judge | None = None  # None: a shard record without one (built by hand)


@dataclass(frozen=True)
class Plan:
    """What a command runs and everything decided with it (``Plan.of``): the matrix it was chosen from, its shard
    record, which cells keep the golden text, and the full matrix at the config's own depths (what a golden may be
    stale against; None until asked where it needs the target's full depths: ``full_matrix_of``)."""

    config: Config
    cells: list[Cell]  # what this run lowers: the selection, or its shard
    matrix: list[Cell]  # every cell of the matrix at this run's depths (before --only and --shard)
    selected: list[Cell]  # the --only selection before --shard
    shard: Shard
    owners: frozenset[str]
    full_matrix: list[Cell] | None

    @classmethod
    def of(cls, config: Config, cells: list[Cell], universe: list[Cell] | None = None,
           selected: list[Cell] | None = None, shard: tuple[int, int] | None = None) -> Plan:
        matrix = universe if universe is not None else cells
        selected = selected if selected is not None else cells
        k, n = shard or (1, 1)
        return cls(config=config, cells=cells, matrix=matrix, selected=selected,
                   shard=Shard(index=k, count=n, matrix=fingerprint(selected), cells=len(cells),
                               judge=Judge.of(config)),
                   owners=text_owners([*matrix, *cells]),
                   full_matrix=None if config.uses_full_depth else config.cells())

    def full_depth(self, model: str) -> int:
        return self._depths(model)

    @functools.cached_property
    def _depths(self) -> Callable[[str], int]:
        """One reader per plan: the target is asked once, for every model, however often a series asks."""
        return depth_reader(self.config)

    def series_cells(self, cell: Cell) -> list[Cell]:
        """The plan's cells of ``cell``'s depth series (what the RNG-scaling rule needs to judge it)."""
        return [c for c in self.cells if c.series == cell.series]

    def of_cells(self, cells: list[Cell]) -> Plan:
        """The same plan, running ``cells`` only (the matrix, and so the text owners, stay the plan's)."""
        return replace(Plan.of(self.config, cells, universe=self.matrix, selected=cells),
                       full_matrix=self.full_matrix)


def full_matrix_of(plan: Plan) -> list[Cell]:
    """Every cell of the config at its own depths (``full`` resolved): the plan's, or resolved now."""
    if plan.full_matrix is not None:
        return plan.full_matrix
    return plan.config.cells(plan.full_depth if plan.config.uses_full_depth else None)


def text_owners(cells: Sequence[Cell]) -> frozenset[str]:
    """The cells whose golden keeps the canonical text: every cell of the matrix (and of the run's cells, when a
    run went outside it), so `hlo-audit diff golden/<cell>.hlo.txt new.hlo.txt` reviews a finding at any depth
    (issue 26: with text at a series' shallowest depth only, the README's review step failed at every other depth;
    the cost, measured there, is the deeper depths' text). Decided with the plan, once, for the gate (which compares
    texts where a golden keeps one) and for golden update (which writes them)."""
    return frozenset(c.id for c in cells)


def parse_layers(value: str | None) -> list[int | str] | None:
    """``--layers 32`` / ``--layers full`` / ``--layers 2,4,full`` (depths 1..MAX_DEPTH)."""
    if not value:
        return None
    depths: list[int | str] = []
    for item in value.split(","):
        item = item.strip()
        if item == "full":
            depths.append("full")
        elif re.fullmatch(r"[0-9]+", item) and int(item) >= 1:
            if int(item) > MAX_DEPTH:
                raise MatrixError(f"--layers {item}: deeper than any model (MaxText's deepest has 126 layers); at "
                                  f"most {MAX_DEPTH}, or 'full' for the model's real depth")
            depths.append(int(item))
        else:
            raise MatrixError(f"--layers expects integers >= 1 or 'full', got {item!r}")
    return depths


def _universe(config: Config, depths: list[int | str] | None) -> list[Cell]:
    needs_depth = "full" in depths if depths else config.uses_full_depth
    return config.cells(depth_reader(config) if needs_depth else None, depths)


def depth_reader(config: Config) -> Callable[[str], int]:
    """``model -> its full depth``, as the target says it, asked of a lowering process (``workers.describe``): the
    target's code never runs here. Its errors are TargetError (the config's to report, by model)."""

    answers: dict[str, object] = {}

    def full_depth(model: str) -> int:
        if model not in answers:  # every model of the config asked at once: one lowering process, one import
            models = sorted({m for axes in config.series for m in axes.models} | {model})
            answer = workers.describe(config.target, models, config.nnx)
            if isinstance(answer, str):
                raise TargetError(answer)
            said = answer.get("full_depth") if isinstance(answer.get("full_depth"), dict) else {}
            answers.update({m: said.get(m) for m in models})
        said = answers[model]
        if not isinstance(said, dict) or "layers" not in said:
            raise TargetError(str(said.get("error", "no depth")) if isinstance(said, dict) else "no depth")
        if not isinstance(said["layers"], int) or isinstance(said["layers"], bool):
            raise ValueError(f"not a number of layers: {said['layers']!r}")
        return said["layers"]

    return full_depth


def plan(config_path: str | None = None, only: str | Sequence[str] | None = None, shard: str | None = None,
         layers: str | None = None, cwd: Path | None = None) -> Plan:
    """The cells a command runs. ``only``: one ``--only`` spec or several (AND across keys, OR within one); a
    selection of no cell is a ``MatrixError`` naming the key's known values."""
    config = resolve(load_config(config_path, cwd))
    picked = parse_shard(shard)
    universe = _universe(config, parse_layers(layers))
    chosen = selection(universe, only)
    cells = chosen if picked is None else shard_of(chosen, *picked)
    return Plan.of(config, cells, universe=universe, selected=chosen, shard=picked)


_CELL_ID = re.compile(r"^[^/\s]+/scan-(?:on|off)/[^/\s]+/L([0-9]+)(?:/[^/\s]+)*$")


def is_cell_id(spec: str) -> bool:
    return bool(_CELL_ID.match(spec))


def id_depth(cell_id: str) -> int | None:
    """The depth a cell id names (``.../L32...``), None for a string that is no cell id."""
    m = _CELL_ID.match(cell_id)
    return int(m.group(1)) if m else None


def plan_cell(cell_id: str, config_path: str | None = None, cwd: Path | None = None) -> Plan:
    """The one-cell plan for an id such as ``llama3-8b/scan-off/int8/L32`` (any depth of a configured series)."""
    m = _CELL_ID.match(cell_id)
    if not m:
        raise InputError(f"{cell_id!r} is neither a file nor a cell id such as llama3-8b/scan-off/int8/L32")
    depth = int(m.group(1))
    if not 1 <= depth <= MAX_DEPTH:  # the id's own depth, not a --layers nobody gave
        raise InputError(f"{cell_id}: depth L{depth}: expected L1 to L{MAX_DEPTH}")
    config = resolve(load_config(config_path, cwd))
    universe = _universe(config, [depth])
    cells = [c for c in universe if c.id == cell_id]
    if not cells:
        raise InputError(f"{cell_id}: no such cell in the matrix of {config.source} (see `hlo-audit list`)")
    return Plan.of(config, cells, universe=universe, selected=cells)
