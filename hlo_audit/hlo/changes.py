"""Every difference between two modules, named: what kind of change it is, where, and what it costs.

``explain`` (change_kinds.py) reads a structural match (match.py) and sorts its edits into the kinds of change users
pay for, each a typed record (``Change``, here) the report prints and the gate's rules read:

* ``donation``: entry parameters that stop (or start) being donated (``input_output_alias``, ``buffer_donor``;
  what ``donate_argnums`` becomes), with their bytes: each is a buffer the step now keeps besides its output;
* ``host_transfer``: host callbacks (``jax.debug.print``, ``pure_callback``, ``io_callback``), infeed / outfeed,
  send / recv to the host, added or removed, each with how often a step runs it (effects.py);
* ``rng_keys``: random bits drawn from a literal key (no entry parameter upstream: every call draws the same bits)
  or one key drawn from twice without a split or fold_in between (rng_keys.py), placed at the draws;
* ``precision``: dots and convolutions whose operand or result types or ``precision_config`` changed, with the
  converts added or removed beside them and the FLOPs that moved (from the module's own shapes); the same dot (its
  dims and its operands' dims: a dot of other dims paired is another dot), its operand types compared in either
  order (a transpose that swaps a dot's operands changes no precision);
* ``kernel``: Pallas / Mosaic / Triton kernels whose content changed (kernels.py: locations and install paths do
  not count), added or removed;
* ``constants``: literals whose value changed (a learning rate, a dropout rate, a loss scale, an epsilon), each with
  both values, its type and place; a large literal summarized: its elements, a digest, the first that differ
  (literals.py);
* ``gradient``: trainable parameters whose update no longer depends on the batch (gradient reach lost), or newly
  does (change_flow.py says how it is read);
* ``transform``: an optimizer transform added or removed: gradient clipping (a global norm over the gradients);
* ``loops``: ``while`` loops added or removed with their trip counts and bodies' size, unrolled (a loop's body
  inline), rolled (layers into a loop of as many iterations: ``nn.scan``), a trip count changed;
* ``conditional``: a ``conditional`` (``lax.cond``) removed or added, with its branches' sizes; replaced by
  computing both branches and selecting (``jnp.where``), the values selected (change_terms.py);
* ``loss_scaling``: static loss scaling removed or added: the loss times a constant, the gradients divided by it
  (change_terms.py);
* ``loss_term``: a term of the loss removed or added (an MoE aux loss): what reduced into it, its weight, its
  backward pass (change_terms.py);
* ``routing``: how the step selects (an MoE router's experts, a sampler's tokens): argmax, ``top_k`` of another k,
  a sort, added, removed or one for another, with what computes the selection (change_terms.py);
* ``remat``: rematerialization removed or added (``opt-barrier`` and its recomputation), or its policy changed
  (the barriers stay, what they keep and what the backward pass recomputes changes);
* ``collectives``, ``sharding``, ``shapes``: collectives added, removed or changed (kind, count, runs and bytes per
  step); shardings of parameters, values and outputs changed, sharding constraints added or removed; parameters and
  values whose dims changed, by factor (change_structure.py);
* ``rename``: entry parameters that are the same but for their state path;
* ``parameters``: entry parameters (RNG state aside) added, removed, or of another dtype or shape;
* ``ops``: instructions added, removed or changed in place at equal shapes, per region (a mask, a transpose, a
  reduction: change_structure.py), where the leftovers are no program-size story;
* ``program_size``: what is left, in instructions: inserted and deleted by opcode, computations added or removed,
  a subgraph repeated;
* ``header``: other module attributes, summarized (which attribute, how many entries), never printed whole;
* ``instructions``: the remaining edits, grouped (an opcode changed, a layout, a sharding, an attribute).

A change is placed (``Place``; change_places.py reads the two sides for it): the computation it sits in, jax's
``op_name`` and the source ``file:line`` from the instruction's metadata, and the state paths whose values flow
into it (through the ops that pass a value on: converts, reshapes, slices of a scanned stack, loop state, called
computations' parameters), with layer indices folded as parameters are grouped (``blocks.*``). Repeats of one change
across layers are one record with a count.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from hlo_audit.hlo.match import ModuleMatch


class ChangeKind(StrEnum):
    """The kinds of change, in the order a report lists them (module doc)."""

    DONATION = "donation"
    HOST_TRANSFER = "host_transfer"
    RNG_KEYS = "rng_keys"
    PRECISION = "precision"
    KERNEL = "kernel"
    CONSTANTS = "constants"
    GRADIENT = "gradient"
    TRANSFORM = "transform"
    LOOPS = "loops"
    CONDITIONAL = "conditional"
    LOSS_SCALING = "loss_scaling"
    LOSS_TERM = "loss_term"
    ROUTING = "routing"
    REMAT = "remat"
    COLLECTIVES = "collectives"
    SHARDING = "sharding"
    SHAPES = "shapes"
    RENAME = "rename"
    PARAMETERS = "parameters"
    OPS = "ops"
    PROGRAM_SIZE = "program_size"
    HEADER = "header"
    INSTRUCTIONS = "instructions"


class Action(StrEnum):
    ADDED = "added"
    REMOVED = "removed"
    CHANGED = "changed"


@dataclass(frozen=True, slots=True)
class Place:
    """Where a change is: its computation (``main`` for the entry, else the name's words: ``region``,
    ``checkpoint``...), jax's ``op_name`` and the source ``file:line`` (from metadata, layer indices folded), the
    state paths whose values flow into it (layer indices folded)."""

    computation: str = ""
    op_name: str = ""
    source: str = ""
    paths: tuple[str, ...] = ()
    # The source is the nearest code's that says one, not the change's own: what jax printed no place for (a loop's
    # carried values, a constant) and removed code (a golden's text keeps no lines: placed by the kept code it fed or
    # was made of, as the other side places it).
    near: bool = False
    # Whether ``source`` is one of the pull request's changed lines (``check --changes``: the places were moved to
    # them, ``locations.placed_by_change``); None where they are not known. False: none of the instruction's frames
    # is a changed line (the change reached it through the data, or from a file the diff does not hold).
    on_change: bool | None = None
    # The pull request's changed lines of config files the cell read (``configs/base.yml:636``, ``check --changes``):
    # what a change no instruction's stack passes a line of came from (a mesh axis a YAML file declares).
    config: tuple[str, ...] = ()

    @property
    def site(self) -> str:
        """What tells two changes of one kind apart: the user's line where the program says it (one line's forward
        and backward instructions, jax's ``jvp()/...`` and ``transpose(jvp())/...`` op_names, are one change
        there), else jax's op_name."""
        return self.source or self.op_name

    def to_record(self) -> dict:
        return {"computation": self.computation, "op_name": self.op_name, "source": self.source,
                "paths": list(self.paths), **({"near": True} if self.near else {}),
                **({"on_change": self.on_change} if self.on_change is not None else {}),
                **({"config": list(self.config)} if self.config else {})}

    @classmethod
    def from_record(cls, r: Mapping) -> Place:
        return cls(r["computation"], r["op_name"], r["source"], tuple(r["paths"]), r.get("near", False),
                   r.get("on_change"))


@dataclass(frozen=True, slots=True)
class Change:
    """One named change (module doc), repeats folded into ``count``.

    ``subject``: what changed (an opcode, a custom call's target, a header attribute, a parameter pattern);
    ``before`` / ``after``: its two forms where it changed (``bf16 x bf16 -> bf16``, a shape, ``26 entries``);
    ``per_step``: executions in one step, loops' trip counts multiplied (host transfers, precision, size);
    ``bytes``: the parameters' bytes (donation: no longer donated, a buffer kept besides the output; parameters:
    added or removed); ``flops``: FLOPs per step that moved to ``after`` (precision); ``instructions``: instructions
    added (negative: removed; precision: converts); ``groups``: (pattern or opcode, count) of the parameters or
    instructions it covers; ``layers``: the layer instances its repeats span (distinct layers among the state paths
    read; 0 outside layers), so that ``count / layers`` is per layer."""

    kind: ChangeKind
    action: Action
    subject: str
    place: Place = Place()
    count: int = 1
    per_step: int = 0
    before: str = ""
    after: str = ""
    bytes: int = 0
    flops: int = 0
    instructions: int = 0
    groups: tuple[tuple[str, int], ...] = ()
    layers: int = 0
    # A sharding change's arrays whose split on the target mesh changed, and how (``params.wq: dim 0 split 2
    # (fsdp) -> 4 (fsdp, data)``; a value's: ``dim 1 split ...``, placed by ``place``).
    splits: tuple[str, ...] = ()

    def to_record(self) -> dict:
        return {"kind": self.kind.value, "action": self.action.value, "subject": self.subject,
                "place": self.place.to_record(), "count": self.count, "per_step": self.per_step,
                "before": self.before, "after": self.after, "bytes": self.bytes, "flops": self.flops,
                "instructions": self.instructions, "groups": [[k, n] for k, n in self.groups],
                "layers": self.layers, **({"splits": list(self.splits)} if self.splits else {})}


@dataclass(frozen=True, slots=True)
class MatchSummary:
    """The match in numbers: what `diff` prints as its one line for everything that did not change."""

    instructions: tuple[int, int]
    matched: int
    unchanged: int
    changed: int
    inserted: int
    deleted: int
    computations: tuple[int, int]
    computations_inserted: int
    computations_deleted: int

    def to_record(self) -> dict:
        return {"instructions": list(self.instructions), "matched": self.matched, "unchanged": self.unchanged,
                "changed": self.changed, "inserted": self.inserted, "deleted": self.deleted,
                "computations": list(self.computations), "computations_inserted": self.computations_inserted,
                "computations_deleted": self.computations_deleted}


def summary(match: ModuleMatch) -> MatchSummary:
    counts = match.counts()
    return MatchSummary(instructions=match.instructions, matched=match.matched,
                        unchanged=match.matched - counts["changed"], changed=counts["changed"],
                        inserted=counts["inserted"], deleted=counts["deleted"],
                        computations=(len(match.old.computations), len(match.new.computations)),
                        computations_inserted=len(match.computations_inserted),
                        computations_deleted=len(match.computations_deleted))


# Words the report reads off a change's subject (change_kinds.py writes them).
# Shardings changed that split every array as before on the target mesh (an axis of size 1 added, renamed or
# reordered: hlo.mesh), the mesh's change with them; and the mesh's change beside shardings whose split did change.
NO_SPLIT_CHANGE = "no effect on how any array is split"
MESH = "mesh"
# A paired instruction that only reads other values now (rewired to inserted or deleted code).
REWIRED = "rewired"
# A program size change made mostly of jax.random's own computations (dropout turned off or on).
RANDOM_BITS = "random-bit generation (jax.random's own computations)"
# RNG derivation (fold_in salts, splits, draws) that differs beside a rename: a change a rename does not explain.
RNG_DERIVATION = "RNG derivation calls (keys folded, split or drawn)"
# Subjects of the dataflow kinds' changes (change_flow.py writes them; the gate's rules and the words read them).
GRADIENT_REACH, CLIPPING, SCALING = "gradient reach", "gradient clipping", "update scaling"
WEIGHT_DECAY = "weight decay"  # a scaling of each weight itself, added to its update (adamw's add_decayed_weights)
UNROLLED, ROLLED, LOOP, TRIP_COUNT = "unrolled", "rolled", "loop", "trip count"
REMAT, REMAT_POLICY = "rematerialization", "remat policy"
# Subjects of rng_keys' changes (rng_keys.py writes them).
LITERAL_KEY, REUSED_KEY, LOOP_KEY = "literal key", "reused key", "key reused across loop iterations"
CONDITIONAL, BOTH_BRANCHES = "conditional", "both branches computed"
LOSS_SCALING, LOSS_TERM = "loss scaling", "loss term"
ROUTING = "routing"  # which values a step selects: argmax (top-1), top_k, sort (change_terms.routing)
