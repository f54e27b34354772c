"""What a rule is (``RuleSpec``) and what its judge reads (``Subject``, ``Context``).

A judge is a pure function of what it judges (``Subject``: the cell's result, its ``comparison.CellDelta`` against the
golden, its depth series where it leads one) and the policy's numbers (``Context``), returning a finding before the
policy's action and waivers are applied, or None. The gate (``gate.Gate``) applies the registry's judges in order,
turns actions and waivers into new findings, and holds no state of its own.

Direction: a regression is something that got worse or changed in a way a reviewer must judge; an improvement is
only what a user would call one (fewer entry parameters of RNG state, fewer never-drawn streams' increments, less
memory for the same program, fewer host transfers, fewer kernels per step, a donation gained). A program that shrinks
is not an improvement by itself: lost gradient work, a removed collective or a removed transform is a change to
judge, gated like any other until accepted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hlo_audit.findings import Finding, GoldenPart, NamedChange
from hlo_audit.hlo.changes import Change, ChangeKind
from hlo_audit.policy import Action, Policy
from hlo_audit.results import LoweredCell, Severity

if TYPE_CHECKING:  # the comparison and the golden are built above the rules (they read what the rules judge)
    from hlo_audit.comparison import CellDelta
    from hlo_audit.golden.record import Golden
    from hlo_audit.scaling import Series


@dataclass(frozen=True)
class Subject:
    """What the rules judge of one ok cell: its result, its golden (readable, or None), the comparison of the two
    (None without a golden), its series where the cell is the series' shallowest (where the series is judged)."""

    result: LoweredCell
    golden: Golden | None
    delta: CellDelta | None
    leads: Series | None

    @property
    def cell(self) -> str:
        return self.result.cell.id


@dataclass(frozen=True)
class Context:
    """The policy, each rule's tolerance under it (``registry.context`` resolves them: a config's, else the spec's),
    and the accept command of each cell (its whole depth series: ``gate.Gate.command``)."""

    policy: Policy
    command: Callable[[str], str]
    tolerances: Mapping[str, float] = field(default_factory=dict)
    # What pinned this run's compiler stack (``CI=true``; ``stack.why_pinned``), None on a local run: a golden of
    # another stack is then a missing golden (``golden.health``).
    pinned_by: str | None = None
    # The kinds whose rules account for the instructions they name (``registry.size_explained``, from the specs):
    # what program_size leaves to them.
    size_explained: tuple[ChangeKind, ...] = ()
    # The rules that compare each part of a golden (``registry.comparing``): what a golden lacking it leaves without
    # a comparison, as the missing_golden finding names them.
    comparing: Mapping[GoldenPart, tuple[str, ...]] = field(default_factory=dict)

    def tolerance(self, rule: str) -> float:
        return self.tolerances[rule]


Judge = Callable[[Subject, Context], Finding | None]


@dataclass(frozen=True)
class Tolerance:
    """A rule's allowance against the golden, a fraction in [0, 1), set in a config's ``[policy]`` table as
    ``<rule>_tolerance``. ``top_level``: also a top-level key of that name (memory's and program_size's were, before
    ``[policy]`` held tolerances), and always part of the policy's fingerprint (shards of a default policy keep the
    fingerprint they always had); another rule's tolerance enters the fingerprint where a config sets it otherwise."""

    default: float
    example: str  # how an error message shows a good value: "0.02 for 2%"
    top_level: bool = False


@dataclass(frozen=True)
class KindWords:
    """A kind of change as every report says it: its word (``routing``) and its line, ``line(change, word, where)``
    with ``where`` the change's place in words (``wording.place_text``); None: the common line (``+3 all-reduce
    ...``, ``report.change_words.change_line``). Each kind is worded by the one spec that lists it (``RuleSpec.words``,
    ``registry.kind_words``), in the rule's own module."""

    kind: ChangeKind
    word: str
    line: Callable[[Change, str, str], str] | None = None


@dataclass(frozen=True)
class RuleSpec:
    """One rule, in one place: its ``[policy]`` key, its default action, its tolerance (None: it has none), the kinds
    of the structural diff it reads, its judge (None: the gate makes its findings itself, ``gate.Gate``), whether it
    compares with a golden (the gate runs it only where a readable golden is there), the typed facts its findings
    carry (what selects their words, ``report.words.message``, and their JSON details, ``merge.details_record``),
    whether its advisories fold into one line, whether a waiver of it may name a pattern, and the parts of a golden it
    compares (``compares``: a golden that lacks one is a ``missing_golden`` finding naming the rules it leaves
    without a comparison, ``golden.health``)."""

    name: str
    action: Action
    judge: Judge | None
    facts: tuple[type, ...]
    reads: tuple[ChangeKind, ...] = ()
    tolerance: Tolerance | None = None
    needs_golden: bool = True
    doc: str = ""  # what it gates, in one line
    # Its advisories hold for most cells of a real model (MaxText carries dead RNG state in every cell today): reports
    # fold them into one line unless asked for every finding (``outcome``).
    folds: bool = False
    # A waiver of it may name a ``pattern`` (a glob over what its findings list: dead_rng's stream patterns), which
    # its judge sets apart (``Policy.pattern_waiver``); the config accepts the key for these rules only.
    pattern_waivers: bool = False
    # A waiver of it names a ``path`` (a glob over changed files' repository paths) and no cells: its findings are of
    # the pull request's changed lines, not of a cell (``unreached``).
    path_waivers: bool = False
    # The parts of a golden it compares besides the text every rule that ``reads`` a kind of change compares.
    golden_parts: tuple[GoldenPart, ...] = ()
    # Its findings account for the instructions the changes it reads name (a loop rolled, remat removed): the
    # program_size rule neither calls a program that shrank with them a change of size nor counts the growth they
    # explain (``registry.size_explained``).
    explains_size: bool = False
    # The kinds of change it words (each kind is worded by one spec; a rule may read a kind another words, as
    # program_size reads rng_keys'), and what its named findings say besides their changes (kernel bodies, program
    # sizes, the memory a donation moved).
    words: tuple[KindWords, ...] = ()
    numbers: Callable[[NamedChange], list[str]] | None = None
    # Its findings in words and as JSON details, functions of their facts in the rule's own module
    # (``report.words.message``, ``merge.details_record``). None: a named rule's, which every named rule shares (its
    # changes' lines with its ``numbers``; each change's record).
    message: Callable[[Any], str] | None = None
    details: Callable[[Any], dict[str, Any]] | None = None

    def compares(self, part: GoldenPart) -> bool:
        """Whether it compares ``part`` of a golden: its own parts, and the text where it reads the text's diff."""
        return part in self.golden_parts or (part is GoldenPart.TEXT and bool(self.reads))

    @property
    def tolerance_key(self) -> str | None:
        return f"{self.name}_tolerance" if self.tolerance is not None else None


def named(judge: Callable[[CellDelta, Context], NamedChange | None]) -> Judge:
    """A named rule (a kind of change the structural account names) as a finding: advisory where the environment
    moved what it judges, else a regression where ``worse``, else an improvement."""
    def rule(subject: Subject, ctx: Context) -> Finding | None:
        facts = judge(subject.delta, ctx)
        if facts is None:
            return None
        severity = (Severity.ADVISORY if facts.environment else  # ops and values' shapes, the stack moved
                    Severity.REGRESSION if facts.worse else Severity.IMPROVEMENT)
        return Finding(subject.cell, severity, facts.rule, facts)
    return rule


def named_spec(name: str, judge: Callable[[CellDelta, Context], NamedChange | None], words: tuple[KindWords, ...],
               doc: str, tolerance: Tolerance | None = None, golden_parts: tuple[GoldenPart, ...] = (),
               explains_size: bool = False, also_reads: tuple[ChangeKind, ...] = (),
               numbers: Callable[[NamedChange], list[str]] | None = None) -> RuleSpec:
    """The spec of a named rule: ``fail`` by default, its findings ``NamedChange``s of the kinds it words (and of
    ``also_reads``, kinds another spec words)."""
    reads = tuple(w.kind for w in words) + also_reads
    return RuleSpec(name, Action.FAIL, named(judge), (NamedChange,), reads, tolerance, doc=doc,
                    golden_parts=golden_parts, explains_size=explains_size, words=words, numbers=numbers)


def change_spec(name: str, words: KindWords, doc: str) -> RuleSpec:
    """The spec of a named rule that fails on any change of one kind the program's diff names, either way (a
    change to judge, never an improvement): remat, conditional, routing, each accounting for the instructions its
    changes name (``RuleSpec.explains_size``)."""
    kind = words.kind

    def judge(d: CellDelta, ctx: Context) -> NamedChange | None:
        changes = of_kind(d, kind, program_changed=True)
        return NamedChange(name, True, changes, command=ctx.command(d.cell)) if changes else None
    judge.__name__ = judge.__qualname__ = name
    return named_spec(name, judge, (words,), doc, explains_size=True)


def changed(delta: CellDelta) -> bool:
    """Whether the structural diff says the program changed (not RNG state or renames alone)."""
    return delta.structural is not None and delta.structural.diff.verdict == "changed"


def of_kind(delta: CellDelta, kind: ChangeKind, program_changed: bool = False) -> tuple:
    """The diff's changes of ``kind`` (none without a text compared; with ``program_changed``, none unless the
    program changed)."""
    if delta.structural is None or (program_changed and not changed(delta)):
        return ()
    return delta.structural.named(kind)
