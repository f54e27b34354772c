"""What the gate decides about a cell: a ``Finding`` per thing it found, typed: its place (a cell id, or where a
waiver is written), its rule, a ``Severity`` and the facts behind it, each kind a frozen record of numbers.

Findings carry no sentences: ``report.words`` makes every one of them, and the JSON formats shape ``details`` from
the facts (``merge.finding_record``). A waiver does not edit a finding: the gate makes a new one, of severity
waived, that names the waivers (``Finding.waived``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from hlo_audit.hlo.changes import Change, MatchSummary
from hlo_audit.hlo.diff import ParamGroupDelta
from hlo_audit.hlo.launch_groups import LaunchGroup
from hlo_audit.policy import Waiver
from hlo_audit.results import Severity


class TextVerdict(StrEnum):
    """The canonical text against the golden's (``comparison.CellDelta.text``; the text and memory rules read it)."""

    NOT_COMPARED = "not_compared"  # no text on one side (or the golden's cannot be read: the gate says so)
    SAME = "same"
    RNG_DROPPED = "rng_dropped"  # RNG state only, dropped: the fix seed 001 is
    RNG_ONLY = "rng_only"  # RNG state only, added
    RENAMED = "renamed"  # entry parameters renamed, the program the same (renamed-only)
    CHANGED = "changed"


@dataclass(frozen=True)
class Matches:
    """The cell matches its golden: the one finding of a cell the gate found nothing about."""


@dataclass(frozen=True)
class LoweringFailure:
    """The cell failed to lower, or cannot be lowered here: the result's own message."""

    message: str


class GoldenPart(StrEnum):
    """A part of a golden summary that a rule compares, by its key in the summary (``golden.health``)."""

    TEXT = "hlo"
    KERNEL_DIGESTS = "kernels"
    LAUNCHES = "launches"
    MEMORY = "memory"
    CONSTANTS = "constants"
    RNG_INCREMENTS = "rng_increments"
    PATTERN_ROLES = "groups_by_role"
    SLOPES = "slopes"
    HOST_FIGURE = "host"
    CALL_LEAVES = "call_leaves"


@dataclass(frozen=True)
class MissingGolden:
    """No golden for the cell (``why`` None), or one that cannot be read, or a text it names that is missing, or a
    summary (``why``: its path) that lacks parts the rules compare for the cell (``lacks``): written by an older
    hlo-audit (its ``golden_format``), or damaged (``damaged``: its format is the current one, which writes them)."""

    why: str | None
    command: str  # the golden update that writes it
    lacks: tuple[GoldenPart, ...] = ()
    golden_format: int | None = None
    damaged: bool = False
    # A golden recorded under another compiler stack on a pinned run (CI, ``stack.stack_mode``): the stack's changes
    # and what made the run pinned (``CI=true``); the command re-blesses it under this stack.
    stack: tuple[EnvironmentChange, ...] = ()
    pinned_by: str | None = None
    # The rules the parts it lacks leave with nothing to compare for the cell, in the registry's order (their specs
    # say which parts they compare: ``rules.registry.comparing``).
    without: tuple[str, ...] = ()


@dataclass(frozen=True)
class Unjudged:
    """A cell with a golden that this run could not judge (it is unavailable here): a failing finding unless a
    waiver with a reason accepts it (rule ``unjudged``), since a check that skips it passes on nothing."""

    status: str  # the result's status (unavailable)
    message: str  # why, in the result's own words
    golden: str  # the golden's summary left unchecked


@dataclass(frozen=True)
class StaleGolden:
    """A golden without a cell in the matrix."""


@dataclass(frozen=True)
class PatternMove:
    pattern: str
    delta: int
    roles: Mapping[str, int]  # role -> delta


@dataclass(frozen=True)
class PatternRename:
    before: str
    after: str
    params: int
    roles: Mapping[str, int]


@dataclass(frozen=True)
class PatternRetype:
    """A path pattern that kept its parameter count while its dtypes or roles moved (``bf16 +6, f32 -6``)."""

    pattern: str
    dtypes: Mapping[str, int]  # dtype -> delta
    roles: Mapping[str, int]  # role -> delta


@dataclass(frozen=True)
class PatternChanges:
    """Path patterns that grew, shrank, were renamed (one gone and one new with the same count and roles), or were
    retyped (the same count, other dtypes or roles)."""

    grown: tuple[PatternMove, ...] = ()
    shrunk: tuple[PatternMove, ...] = ()
    renamed: tuple[PatternRename, ...] = ()
    retyped: tuple[PatternRetype, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.grown or self.shrunk or self.renamed or self.retyped)


@dataclass(frozen=True)
class CapturedDelta:
    """State baked in as constants against the golden's (``hlo.diff.captured_delta``)."""

    basis: str  # "captured arrays", or "large constants" when either side does not know what was captured
    arrays: tuple[int, int]
    bytes: tuple[int, int]
    by_dtype: Mapping[str, int]
    bytes_by_dtype: Mapping[str, int]
    groups: Mapping[str, int]
    literal_keys: tuple[int, int]

    @property
    def baked_more(self) -> bool:
        """More arrays or bytes of some dtype, or more literal RNG keys, than the golden."""
        return (any(v > 0 for v in (*self.by_dtype.values(), *self.bytes_by_dtype.values()))
                or self.literal_keys[1] > self.literal_keys[0])

    @classmethod
    def of(cls, delta: Mapping[str, Any] | None) -> CapturedDelta | None:
        if delta is None:
            return None
        return cls(basis=delta["basis"], arrays=tuple(delta["arrays"]), bytes=tuple(delta["bytes"]),
                   by_dtype=delta["by_dtype"], bytes_by_dtype=delta["bytes_by_dtype"], groups=delta["groups"],
                   literal_keys=tuple(delta["literal_keys"]))

    def to_record(self) -> dict[str, Any]:
        """The HLO core's record of it (``hlo.diff.captured_change`` words it; the JSON formats print it)."""
        return {"basis": self.basis, "arrays": list(self.arrays), "bytes": list(self.bytes),
                "by_dtype": dict(self.by_dtype), "bytes_by_dtype": dict(self.bytes_by_dtype),
                "groups": dict(self.groups), "literal_keys": list(self.literal_keys)}


@dataclass(frozen=True)
class IncrementChange:
    """RNG counter increments per step against the golden's, by stream verdict and pattern."""

    golden: int | float
    now: int | float
    by_verdict: Mapping[str, int | float]
    by_pattern: Mapping[str, int | float]
    paths: Mapping[str, tuple[str, ...]]  # the streams of each pattern whose increments grew


@dataclass(frozen=True)
class LaunchChange:
    """A GPU program's launches per step against another's (kernels, scalar ones, collectives)."""

    golden: Mapping[str, int]
    now: Mapping[str, int]
    delta: Mapping[str, int]  # only the counts that moved
    groups: tuple[LaunchGroup, ...]  # the launch groups that came (positive) and went


@dataclass(frozen=True)
class SlopeChange:
    """The series' per-layer slopes against the golden's: ``params_per_layer`` -> (golden, now), ..."""

    moved: Mapping[str, tuple[float, float]]

    @property
    def grew(self) -> bool:
        """Some slope is steeper than the golden's: more per layer is growth, a regression, never an improvement."""
        return any(now > golden for golden, now in self.moved.values())


@dataclass(frozen=True)
class EnvironmentChange:
    key: str
    golden: str | None
    now: str | None


class Moved(StrEnum):
    """Why a named change is advisory under another environment than the golden's (``NamedChange.moved_by``)."""

    OP_MIX = "op_mix"  # another jax and XLA move the op mix and the values' shapes of an unchanged step
    CLOSED_CALLS = "closed_calls"  # one side's jax writes closed_calls as calls, the other's inline (compare.py)


class TextKind(StrEnum):
    CHANGED = "changed"  # a regression
    RNG_DROPPED = "rng_dropped"  # RNG state only, dropped: an improvement to accept
    MOVED = "moved"  # another environment than the golden's: advisory
    RENAMED = "renamed"  # entry parameters renamed, the program the same (renamed-only): advisory, to record


@dataclass(frozen=True)
class TextChange:
    kind: TextKind
    changed_lines: int
    diff: tuple[str, ...]  # the unified diff's first lines
    verdict: str  # hlo.diff's verdict
    changes: tuple[str, ...]  # its kinds of change
    rng_params: int  # RNG parameters gained (negative: dropped)
    environment: tuple[EnvironmentChange, ...]
    command: str
    renames: tuple[Change, ...] = ()  # renamed-only: the renames (hlo.changes, kind rename)
    params: tuple[ParamGroupDelta, ...] = ()  # entry parameters added (count > 0) and removed, by path pattern
    match: MatchSummary | None = None  # the structural match's numbers: instructions added, removed, changed


@dataclass(frozen=True)
class KernelBody:
    """Kernels of one name (``hlo.kernels.kernel_name``) whose bodies, by content digest, are not the golden's."""

    name: str
    golden: tuple[str, ...]  # the digests, sorted
    now: tuple[str, ...]


@dataclass(frozen=True)
class NamedChange:
    """What a named rule (donation, host_transfer, precision, program_size, kernels, loops, remat, gradient...: each a
    module of ``rules`` whose spec ``rules.spec.named_spec`` builds) found against the golden: the structural diff's
    records of its kind (``hlo.changes.Change``: kind, place, counts, bytes) and the numbers it judged by.

    ``worse``: a regression (else an improvement to accept). ``sizes``: name -> (golden, now): program_size's
    ``instructions`` (in the text) and ``instructions_per_step``; donation's compiled ``alias_bytes`` and the memory
    kinds that moved with it (the cost of the lost donation, not a memory improvement). ``by_opcode``: program_size's
    instructions per step that moved, by opcode. ``tolerance``: program_size's ratchet. ``environment``: for the ops
    and shapes rules under another environment than the golden's, what moved: the change is advisory, as the text is
    (another jax and XLA move the op mix and the values' shapes of an unchanged step); for program_size and loops
    only across the line where jax began to inline closed_calls. ``moved_by``: which of the two."""

    rule: str
    worse: bool
    changes: tuple[Change, ...] = ()
    kernels: tuple[KernelBody, ...] = ()
    sizes: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    by_opcode: Mapping[str, int] = field(default_factory=dict)
    tolerance: float | None = None
    command: str = ""
    environment: tuple[EnvironmentChange, ...] = ()
    moved_by: Moved = Moved.OP_MIX


@dataclass(frozen=True)
class MemoryChange:
    changed: Mapping[str, tuple[int, int]]  # kind -> (golden, now) beyond the tolerance
    tolerance: float
    grew: bool
    command: str
    # Less memory while the program itself changed: a change to judge, not an improvement (that is less memory for
    # the same program).
    program_changed: bool = False


@dataclass(frozen=True)
class RngScaling:
    slope: float  # RNG parameters per layer
    by_role: Mapping[str, float]
    depths: tuple[int, ...]
    patterns: Mapping[str, float] = field(default_factory=dict)  # path pattern -> RNG parameters per layer


@dataclass(frozen=True)
class LaunchScaling:
    slope: float  # launches reading RNG state per layer
    per_layer: Mapping[str, float]  # total, scalar: kernels per layer (where not 0)
    depths: tuple[int, ...]
    groups: tuple[LaunchGroup, ...]  # what the deepest cell launches beyond the shallowest


@dataclass(frozen=True)
class DeadRng:
    cell: str
    streams: int  # carried streams shown (the patterns not waived, or all when every one is)
    params: int
    increments: int | float
    patterns: tuple[str, ...]
    largest: str
    largest_streams: int
    waived_patterns: Mapping[str, Waiver]  # pattern -> the waiver naming it


@dataclass(frozen=True)
class StaleWaiver:
    waiver: Waiver
    covered: int  # cells of the matrix it covers


@dataclass(frozen=True)
class Worded:
    """A finding read back from a check's JSON (``merge``): its sentence and its details as its shard wrote them
    (JSON text, parsed again only where JSON is written), and the dead RNG parameters its details name."""

    message: str
    details: str
    dead_params: int = 0


@dataclass(frozen=True)
class Finding:
    cell: str  # the cell's id; a stale waiver's: where the waiver is written
    severity: Severity
    rule: str
    # Typed facts: a rule's (the types its spec lists, ``RuleSpec.facts``, some declared in the rule's own module:
    # ``rules.count.CountChange``), or what is no rule's (``Matches``, ``LoweringFailure``, ``Worded``).
    facts: object
    waivers: tuple[Waiver, ...] = ()  # what waived it, when its severity is waived

    @property
    def failing(self) -> bool:
        return self.severity.failing

    @property
    def accept_command(self) -> str | None:
        """The golden update that accepts what this finding is about (its cell's whole depth series: the gate's
        ``command_for``), as its facts hold it or a shard's JSON wrote it (``regenerate``); None for kinds that
        have none (a lowering failure, a stale waiver)."""
        if isinstance(self.facts, Worded):
            details = json.loads(self.facts.details)
            command = details.get("regenerate") if isinstance(details, dict) else None
        else:
            command = getattr(self.facts, "command", None)
        return command if isinstance(command, str) and command else None

    def waived(self, *waivers: Waiver) -> Finding:
        """A new finding: this one, waived by ``waivers``."""
        return replace(self, severity=Severity.WAIVED, waivers=waivers)

    def warned(self) -> Finding:
        """A new finding: this one, a warning (its rule's action is warn)."""
        return replace(self, severity=Severity.ADVISORY)

    @property
    def dead_params(self) -> int:
        """The never-drawn RNG parameters a dead_rng finding is about (what the folded line sums)."""
        if isinstance(self.facts, DeadRng):
            return self.facts.params
        if isinstance(self.facts, Worded):
            return self.facts.dead_params
        return 0


def worst(findings) -> Severity:
    return max((f.severity for f in findings), key=lambda s: s.rank, default=Severity.OK)


@dataclass(frozen=True)
class Accept:
    """One golden update that accepts every failing cell of a check (issue 40: a failing pull request printed nine
    commands, one per cell): the ids each failing finding's own command names (its cell's depth series), in the
    order the findings come, each once, under the command the gate words (``--config`` when not the default)."""

    prefix: str  # hlo-audit golden update [--config FILE]
    ids: tuple[str, ...]

    @property
    def command(self) -> str:
        return f"{self.prefix} --only {','.join(f'id={cell_id}' for cell_id in self.ids)}"

    @classmethod
    def of(cls, findings) -> Accept | None:
        """The failing findings' cells that an accept command names; None when none does (a lowering error is
        fixed, not accepted)."""
        prefix, ids = None, {}
        for finding in findings:
            command = finding.accept_command if finding.failing else None
            head, only, spec = (command or "").partition(" --only ")
            if not only:
                continue
            prefix = prefix or head
            ids.update(dict.fromkeys(_ONLY_ID.findall(spec)))
        return cls(prefix, tuple(ids)) if prefix and ids else None


_ONLY_ID = re.compile(r"(?:^|,)id=([^,\s]+)")
