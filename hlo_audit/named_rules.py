"""The gate's named rules: a cell against its golden by the kinds of change users pay for, each a finding that says
what changed and where (``findings.NamedChange``, worded by ``report.words``).

They gate whether or not the text rule is advisory: under another environment than the golden's, a jax release
moves the text, but it does not drop a donation, add a host callback, upcast a dot, remove remat, unroll a loop or
cut a weight off the loss.
The structural diff of the golden's canonical text and the cell's (``hlo.diff.diff_modules``) runs once per cell,
only where the texts differ (``Structural.of``); the text rule reads its verdict and every rule here its named
changes (``ModuleDiff.named``):

* ``donation``: entry parameters that stop being donated (``input_output_alias``, ``buffer_donor``), with their bytes;
  at a compiled stage the record's ``alias_bytes`` too, so that a step that lost its donation is not a memory
  "improvement" (its temp bytes fall while every donated buffer is now kept beside the outputs). Donation gained is
  an improvement to record; alias bytes that grew because the donated buffers grew (no parameter newly donated) are
  no donation change: the shapes and memory rules judge them.
* ``host_transfer``: host callbacks, infeed / outfeed, send / recv to the host added (removed: an improvement).
* ``precision``: dots and convolutions whose operand or result types or precision config changed, with the converts
  around them and the FLOPs that moved: a regression either way (an upcast costs time, a downcast numerics).
* ``program_size``: instructions in the text and executed per step, against the golden's, beyond
  ``program_size_tolerance``, either way: a program that shrinks is no improvement by itself (lost gradient work, a
  removed transform or collective shrink it too), a change to judge as growth is, unless the loops, remat or
  gradient rules name what went (they judge it); nor where only the instructions per step moved with the loops
  the loops rule names (a trip count: the same program run more times, not a program of another size).
* ``kernels``: Pallas / Mosaic / Triton kernel bodies by content digest (``hlo.kernels``) against the golden
  record's; a kernel added or removed from the diff. A golden written before digests were kept compares none.
* ``loops``: loops unrolled, layers rolled into a loop (``nn.scan``), loops added or removed, trip counts changed
  (``hlo.change_flow``); ``remat``: rematerialization removed or added, or its policy changed; ``gradient``: weights
  the loss no longer reaches (or newly does), optimizer transforms (clipping) added or removed. Each is a change to
  judge, a regression until accepted, whatever it does to the program's size.
* ``rng_keys``: random bits drawn from a literal key (``PRNGKey(0)`` inside the step: every call draws the same bits)
  or one key drawn from twice without a split or fold_in between (two dropouts drop the same units), beyond the
  golden's (``hlo.rng_keys``), placed at the draws; fewer is an improvement.
* ``conditional``: a ``conditional`` removed or added with its branches' sizes, replaced by computing both branches
  and selecting (``jnp.where``): a change to judge, either way.
* ``sharding``, ``collectives``, ``shapes``, ``ops``: the structural kinds (``hlo.change_structure``): a parameter's or
  value's sharding changed or a sharding constraint added or removed; collectives added, removed or changed (a
  removed one is a change to judge, not an improvement); inputs or activations of other dims; ops added, removed or
  changed at equal shapes (a mask, a transpose, a reduction). Each a regression whichever way: layouts, metadata,
  instruction order and fusion names are none of these kinds. Under another environment than the golden's, ops and
  the values' shapes are advisory (another jax and XLA move them in an unchanged step); shardings, collectives and
  the inputs' shapes still gate.
* ``constants``: literals whose value changed (a learning rate, a dropout rate, a loss scale, an epsilon), both values
  with their type and place: a change to judge. Advisory under another environment, as ops are (another jax lowers
  an op with other constants).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from hlo_audit.compare import Structural
from hlo_audit.findings import EnvironmentChange, KernelBody, Moved, NamedChange
from hlo_audit.hlo.changes import Action, ChangeKind
from hlo_audit.policy import Rule

# The memory kinds a lost donation moves (reported with it, not as a memory finding of their own).
_DONATION_MEMORY = ("alias_bytes", "temp_bytes", "argument_bytes", "output_bytes")


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
    if not changes and _buffers_grew(structural, sizes):
        return None
    lost = any(c.action is Action.REMOVED for c in changes) or (
        "alias_bytes" in sizes and sizes["alias_bytes"][1] < sizes["alias_bytes"][0])
    return NamedChange(Rule.DONATION, lost, changes, sizes=sizes, command=command)


def _buffers_grew(structural: Structural | None, sizes: Mapping[str, tuple[int, int]]) -> bool:
    """Alias bytes that grew with no parameter newly donated: the donated buffers grew (a KV cache of twice the
    length), a change of shapes the shapes and memory rules judge, never a donation gained. Without a text compared,
    the arguments grew by as much."""
    before, after = sizes["alias_bytes"]
    if after <= before:
        return False
    if structural is not None:
        return True
    arguments = sizes.get("argument_bytes", (0, 0))
    return arguments[1] - arguments[0] >= after - before


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


def program_size(structural: Structural | None, tolerance: float, command: str,
                 moved: tuple[EnvironmentChange, ...] = ()) -> NamedChange | None:
    """The ratchet on instructions (in the text and per step) beyond ``tolerance``. Only a changed program: RNG
    state alone is the count rule's, renames are no change. A program that shrinks because it lost work the loops,
    remat, gradient or transform rules name (a loop rolled, remat removed, gradient reach lost, clipping removed) is
    no improvement: those rules judge it. ``moved``: the environment's changes where the golden's jax and this one
    write closed_calls apart (``compare.CLOSED_CALLS_AS_CALLS``): the finding is advisory there."""
    if structural is None or structural.diff.verdict != "changed":
        return None
    changes = structural.named(ChangeKind.PROGRAM_SIZE)
    sizes = structural.sizes
    grew = any(b > a * (1 + tolerance) for a, b in sizes.values())
    shrank = not grew and any(b < a * (1 - tolerance) for a, b in sizes.values())
    if not (grew or shrank) or shrank and any(structural.named(kind) for kind in _JUDGED_ELSEWHERE):
        return None
    before, after = sizes["instructions"]
    if before * (1 - tolerance) <= after <= before * (1 + tolerance) and structural.named(ChangeKind.LOOPS):
        return None  # the same program run more (or less) per step: the loops' trip counts, the loops rule's words
    # A program that shrinks is no improvement by itself (lost gradient work, a removed transform or collective
    # shrink it too): a change to judge, as growth is.
    return NamedChange(Rule.PROGRAM_SIZE, grew or shrank, changes, sizes=sizes,
                       by_opcode=structural.per_step_by_opcode, tolerance=tolerance, command=command,
                       environment=moved, moved_by=Moved.CLOSED_CALLS)


# The kinds whose rules judge a program that shrank with them (program_size).
_JUDGED_ELSEWHERE = (ChangeKind.LOOPS, ChangeKind.REMAT, ChangeKind.GRADIENT, ChangeKind.TRANSFORM,
                     ChangeKind.CONDITIONAL, ChangeKind.LOSS_SCALING, ChangeKind.LOSS_TERM)


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


def loops(structural: Structural | None, command: str, moved: tuple[EnvironmentChange, ...] = ()) -> NamedChange | None:
    """Loops added, removed, unrolled or rolled, or of another trip count: a change to judge, either way.
    ``moved``: as ``program_size``'s (a loop's body inside a call on one side only is no loop the match pairs)."""
    changes = structural.named(ChangeKind.LOOPS) if _changed(structural) else ()
    return NamedChange(Rule.LOOPS, True, changes, command=command, environment=moved,
                       moved_by=Moved.CLOSED_CALLS) if changes else None


def remat(structural: Structural | None, command: str) -> NamedChange | None:
    """Rematerialization removed or added, or its policy changed: memory against recomputation, either way."""
    changes = structural.named(ChangeKind.REMAT) if _changed(structural) else ()
    return NamedChange(Rule.REMAT, True, changes, command=command) if changes else None


def gradient(structural: Structural | None, command: str) -> NamedChange | None:
    """Weights the loss no longer reaches (or newly does) and optimizer transforms added or removed (clipping): a
    regression, never an improvement, whatever it does to the program's size."""
    changes = tuple(c for kind in (ChangeKind.GRADIENT, ChangeKind.TRANSFORM, ChangeKind.LOSS_SCALING,
                                                 ChangeKind.LOSS_TERM)
                    for c in structural.named(kind)) if _changed(structural) else ()
    return NamedChange(Rule.GRADIENT, True, changes, command=command) if changes else None


def rng_keys(structural: Structural | None, command: str) -> NamedChange | None:
    """Random bits drawn from a literal key, or one key drawn from twice, that the golden's text does not have: a
    regression whatever the text's verdict (a key drawn twice instead of split is RNG state only once stripped);
    fewer, an improvement."""
    changes = structural.named(ChangeKind.RNG_KEYS) if structural is not None else ()
    if not changes:
        return None
    return NamedChange(Rule.RNG_KEYS, any(c.action is Action.ADDED for c in changes), changes, command=command)


def conditional(structural: Structural | None, command: str) -> NamedChange | None:
    """A conditional removed or added (``lax.cond`` against ``jnp.where`` of both branches): the step now always
    computes (or skips) a branch's work, a change to judge either way."""
    changes = structural.named(ChangeKind.CONDITIONAL) if _changed(structural) else ()
    return NamedChange(Rule.CONDITIONAL, True, changes, command=command) if changes else None


def _changed(structural: Structural | None) -> bool:
    return structural is not None and structural.diff.verdict == "changed"


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
    (``CellDelta.environment``): the values' shapes move with jax and XLA, so the finding is advisory there; the
    inputs' dims do not, and gate."""
    if moved and structural is not None and any(c.subject == "inputs" for c in structural.named(ChangeKind.SHAPES)):
        moved = ()
    return _structural(Rule.SHAPES, ChangeKind.SHAPES, structural, command, moved)


def ops(structural: Structural | None, command: str, moved: tuple[EnvironmentChange, ...] = ()) -> NamedChange | None:
    """Ops added, removed or changed at equal shapes; advisory where ``moved`` (``shapes``)."""
    return _structural(Rule.OPS, ChangeKind.OPS, structural, command, moved)


def constants(structural: Structural | None, command: str,
              moved: tuple[EnvironmentChange, ...] = ()) -> NamedChange | None:
    """Literals whose value changed; advisory where ``moved`` (``ops``)."""
    return _structural(Rule.CONSTANTS, ChangeKind.CONSTANTS, structural, command, moved)
