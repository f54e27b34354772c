"""The gate's named rules: a cell against its golden by the kinds of change users pay for, each a finding that says
what changed and where (``findings.NamedChange``, worded by ``report.words``).

They gate whether or not the text rule is advisory: under another environment than the golden's, a jax release
moves the text, but it does not drop a donation, add a host callback, upcast a dot, remove remat or unroll a loop.
The structural diff of the golden's canonical text and the cell's (``hlo.diff.diff_modules``) runs once per cell,
only where the texts differ (``Structural.of``); the text rule reads its verdict and every rule here its named
changes (``ModuleDiff.named``):

* ``donation``: entry parameters that stop being donated (``input_output_alias``, ``buffer_donor``), with their bytes;
  at a compiled stage the record's ``alias_bytes`` too, so that a step that lost its donation is not a memory
  "improvement" (its temp bytes fall while every donated buffer is now kept beside the outputs). Donation gained is
  an improvement to record.
* ``host_transfer``: host callbacks, infeed / outfeed, send / recv to the host added (removed: an improvement).
* ``precision``: dots and convolutions whose operand or result types or precision config changed, with the converts
  around them and the FLOPs that moved: a regression either way (an upcast costs time, a downcast numerics).
* ``program_size``: instructions in the text and executed per step, against the golden's, beyond
  ``program_size_tolerance``; rematerialization removed (memory) and a loop unrolled (program and compile size) are
  regressions whatever the count. Fewer instructions beyond the tolerance: an improvement that asks to tighten.
* ``kernels``: Pallas / Mosaic / Triton kernel bodies by content digest (``hlo.kernels``) against the golden
  record's; a kernel added or removed from the diff. A golden written before digests were kept compares none.
* ``sharding``, ``collectives``, ``shapes``, ``ops``: the structural kinds (``hlo.change_structure``): a parameter's or
  value's sharding changed or a sharding constraint added or removed; collectives added, removed or changed (a
  removed one is a change to judge, not an improvement); inputs or activations of other dims; ops added, removed or
  changed at equal shapes (a mask, a transpose, a reduction). Each a regression whichever way: layouts, metadata,
  instruction order and fusion names are none of these kinds. Under another environment than the golden's, ops and
  the values' shapes are advisory (another jax and XLA move them in an unchanged step); shardings, collectives and
  the inputs' shapes still gate.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from hlo_audit.findings import EnvironmentChange, KernelBody, NamedChange
from hlo_audit.hlo.analysis import Analysis, analyze
from hlo_audit.hlo.change_places import instructions_per_step
from hlo_audit.hlo.changes import REMAT_REMOVED, Action, Change, ChangeKind
from hlo_audit.hlo.diff import ModuleDiff, count_delta, diff_modules
from hlo_audit.hlo.locations import Places
from hlo_audit.policy import Rule

# The memory kinds a lost donation moves (reported with it, not as a memory finding of their own).
_DONATION_MEMORY = ("alias_bytes", "temp_bytes", "argument_bytes", "output_bytes")


@dataclass(frozen=True)
class Structural:
    """A cell's canonical text against its golden's, diffed once: the diff (its verdict, its named changes), the RNG
    parameters gained, and each side's instructions (in the printed text; executed per step, by opcode)."""

    diff: ModuleDiff
    rng_params: int
    instructions: tuple[int, int]
    per_step: tuple[Mapping[str, int], Mapping[str, int]]

    @classmethod
    def of(cls, golden_text: str, text: str, places: Places | None = None) -> Structural:
        """``places``: the cell's op_name and source by instruction of ``text`` (``CellResult.places``)."""
        before, after = analyze(golden_text, "golden"), analyze(text, "now")
        diff = diff_modules(before, after, max_text_lines=0, new_places=places)
        rng = sum(p.is_rng for p in after.params) - sum(p.is_rng for p in before.params)
        # The match's own count where there is one (the program, RNG state stripped); else the printed text's.
        instructions = diff.match.instructions if diff.match is not None else (_printed(before), _printed(after))
        return cls(diff, rng, instructions,
                   (instructions_per_step(before.module), instructions_per_step(after.module)))

    def named(self, kind: ChangeKind) -> tuple[Change, ...]:
        return tuple(c for c in self.diff.named if c.kind is kind)


def _printed(analysis: Analysis) -> int:
    """Instructions of the computations the canonical text prints (one of each set of identical ones)."""
    return sum(len(c.instructions) for name, c in analysis.module.computations.items()
               if name in analysis.printed_computations)


def donation(structural: Structural | None, golden_memory: Mapping[str, int] | None,
             memory: Mapping[str, int] | None, tolerance: float, command: str) -> NamedChange | None:
    """Parameters no longer (or newly) donated, from the diff; at a compiled stage, ``alias_bytes`` against the
    golden's (beyond the memory tolerance) says the same where no text is compared, and the memory that moved with
    it is reported here."""
    changes = structural.named(ChangeKind.DONATION) if structural is not None else ()
    sizes: dict[str, tuple[int, int]] = {}
    if golden_memory is not None and memory is not None and "alias_bytes" in golden_memory and "alias_bytes" in memory:
        before, after = golden_memory["alias_bytes"], memory["alias_bytes"]
        if abs(after - before) > tolerance * before or (changes and after != before):
            sizes = {k: (golden_memory[k], memory[k]) for k in _DONATION_MEMORY
                     if k in golden_memory and k in memory and golden_memory[k] != memory[k]}
    if not changes and "alias_bytes" not in sizes:
        return None
    lost = any(c.action is Action.REMOVED for c in changes) or (
        "alias_bytes" in sizes and sizes["alias_bytes"][1] < sizes["alias_bytes"][0])
    return NamedChange(Rule.DONATION, lost, changes, sizes=sizes, command=command)


def host_transfer(structural: Structural | None, command: str) -> NamedChange | None:
    """Host round trips added per step (removed: an improvement)."""
    changes = structural.named(ChangeKind.HOST_TRANSFER) if structural is not None else ()
    if not changes:
        return None
    return NamedChange(Rule.HOST_TRANSFER, any(c.action is Action.ADDED for c in changes), changes, command=command)


def precision(structural: Structural | None, command: str) -> NamedChange | None:
    """Dots and convolutions of another precision: a regression whichever way (module doc)."""
    changes = structural.named(ChangeKind.PRECISION) if structural is not None else ()
    return NamedChange(Rule.PRECISION, True, changes, command=command) if changes else None


def program_size(structural: Structural | None, tolerance: float, command: str) -> NamedChange | None:
    """The ratchet on instructions (in the text and per step) beyond ``tolerance``; remat removed and loops unrolled
    whatever the counts. Only a changed program: RNG state alone is the count rule's, renames are no change."""
    if structural is None or structural.diff.verdict != "changed":
        return None
    changes = structural.named(ChangeKind.PROGRAM_SIZE)
    golden_step, now_step = structural.per_step
    sizes = {"instructions": structural.instructions,
             "instructions_per_step": (sum(golden_step.values()), sum(now_step.values()))}
    grew = any(b > a * (1 + tolerance) for a, b in sizes.values())
    shrank = not grew and any(b < a * (1 - tolerance) for a, b in sizes.values())
    story = any(c.subject == REMAT_REMOVED or _unrolled(c) for c in changes)
    if not (grew or shrank or story):
        return None
    return NamedChange(Rule.PROGRAM_SIZE, grew or story, changes, sizes=sizes,
                       by_opcode=count_delta(golden_step, now_step), tolerance=tolerance, command=command)


def _unrolled(change: Change) -> bool:
    """A program-size change whose story is loops unrolled (``hlo.changes._size_story``)."""
    return change.action is Action.ADDED and " unrolled (" in change.subject


def kernels(structural: Structural | None, golden: Mapping[str, tuple[str, ...]] | None,
            now: Mapping[str, tuple[str, ...]] | None, command: str) -> NamedChange | None:
    """Kernel bodies against the golden record's digests (both sides must have them: a golden from before they were
    kept compares none), and kernels added or removed as the diff names them."""
    bodies: list[KernelBody] = []
    if golden is not None and now is not None:
        bodies = [KernelBody(name, tuple(golden.get(name, ())), tuple(now.get(name, ())))
                  for name in sorted(golden.keys() | now.keys())
                  if Counter(golden.get(name, ())) != Counter(now.get(name, ()))]
    changes = structural.named(ChangeKind.KERNEL) if structural is not None else ()
    if not bodies and not changes:
        return None
    return NamedChange(Rule.KERNELS, True, changes, kernels=tuple(bodies), command=command)


def _structural(rule: Rule, kind: ChangeKind, structural: Structural | None, command: str,
                moved: tuple[EnvironmentChange, ...] = ()) -> NamedChange | None:
    changes = structural.named(kind) if structural is not None else ()
    return NamedChange(rule, True, changes, command=command, environment=moved) if changes else None


def sharding(structural: Structural | None, command: str) -> NamedChange | None:
    """Shardings of parameters, values or outputs changed; sharding constraints added or removed."""
    return _structural(Rule.SHARDING, ChangeKind.SHARDING, structural, command)


def collectives(structural: Structural | None, command: str) -> NamedChange | None:
    """Collectives added, removed or changed per step."""
    return _structural(Rule.COLLECTIVES, ChangeKind.COLLECTIVES, structural, command)


def shapes(structural: Structural | None, command: str,
           moved: tuple[EnvironmentChange, ...] = ()) -> NamedChange | None:
    """Inputs and activations whose dims changed. ``moved``: the environment's changes since the golden
    (``environment_moved``): the values' shapes move with jax and XLA, so the finding is advisory there; the inputs'
    dims do not, and gate."""
    if moved and structural is not None and any(c.subject == "inputs" for c in structural.named(ChangeKind.SHAPES)):
        moved = ()
    return _structural(Rule.SHAPES, ChangeKind.SHAPES, structural, command, moved)


def ops(structural: Structural | None, command: str, moved: tuple[EnvironmentChange, ...] = ()) -> NamedChange | None:
    """Ops added, removed or changed at equal shapes; advisory where ``moved`` (``shapes``)."""
    return _structural(Rule.OPS, ChangeKind.OPS, structural, command, moved)


def environment_moved(golden: Mapping[str, str | None],
                      now: Mapping[str, str | None]) -> tuple[EnvironmentChange, ...]:
    """What moved since the golden (jax, jaxlib, libtpu, the stage...): another jax lowers and another XLA rewrites
    the op mix and the per-device shapes of an unchanged step (jax 0.11.2 against 0.12's goldens: 74 ops in the
    fused computations of an unchanged compiled FSDP step), so those findings are advisory there, as the text is."""
    return tuple(EnvironmentChange(k, golden.get(k), now.get(k)) for k in sorted({*golden, *now})
                 if golden.get(k) != now.get(k))
