"""What each RNG stream's key does in the step: drawn, carried, or unknown (``classify_streams``).

An NNX ``Rngs`` stream is a (key, count) pair of entry parameters under one path. Seed 000's finding was
that three places held streams they never drew from: the key only flowed back to the outputs and the
count was only incremented, yet both cost a parameter per step and a counter kernel per layer. This
module reads that from the HLO by following every RNG parameter through the entry computation's dataflow
(rng_flow.py: each key and count is one bit of a forward taint).

At the entry ROOT, *s*'s own state (the returned key, the incremented count) is the output leaves that reuse
the buffers of *s*'s key and count parameters (``input_output_alias``: jax aliases a donated train state's new
value to the old, as MaxText's and NNX's steps donate it). An output aliased to no parameter is *s*'s own state
if it depends only on *s*'s own key and count, not through random bits; a key of its own (no count) that no
output is aliased to hands back a split of itself (``key, sub = jax.random.split(key)``), so there an output of its
shape computed from it alone, through random bits too, is its next key. (Aliases say it where dataflow cannot: a
count advanced in one branch of a ``conditional`` on the data depends on every stream the data drew from.) Any
other output that depends on *s* decides its verdict: through random bits, ``drawn``; through something not
understood, ``unknown``; without random bits at all (the key used as plain data), ``unknown`` too, saying where. A
stream that reaches no other output is ``carried``: dead state.

This is what the numerical oracle in the tests checks: change one stream's key, run the step, compare
every output but the stream's own state.
"""

from __future__ import annotations

from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from hlo_audit.hlo.header import output_aliases
from hlo_audit.hlo.params import EntryParam, rng_owner
from hlo_audit.hlo.rng_flow import FlowEvents, entry_flow, first_site
from hlo_audit.hlo.shapes import Shape
from hlo_audit.hlo.text import HloModule

VERDICTS = ("drawn", "carried", "unknown")


@dataclass(frozen=True)
class Stream:
    """One RNG stream of the module and what its key does."""

    path: str  # state path of the stream: the key's path without NNX's ``.key`` (stream_path)
    pattern: str  # the path with layer indices collapsed: ``decoder.layers_*.mlp.wi_0...to_nnx__rngs.aqt``
    key: EntryParam | None
    count: EntryParam | None
    verdict: str  # drawn | carried | unknown
    where: str  # drawn: the random-bit site first reached; unknown: where the flow left the analysis
    # Count elements incremented per step: every increment the step executes, loop trip counts included. Each is a
    # scalar kernel (seed 000's 673 per step), so one that a rematerialized layer's backward pass recomputes counts
    # twice.
    increments: float

    @property
    def params(self) -> int:
        return (self.key is not None) + (self.count is not None)

    @property
    def bytes(self) -> int:
        return sum(p.bytes for p in (self.key, self.count) if p is not None)

    def to_record(self) -> dict:
        return {"path": self.path, "pattern": self.pattern, "verdict": self.verdict, "where": self.where,
                "key": self.key.index if self.key else None, "count": self.count.index if self.count else None,
                "params": self.params, "bytes": self.bytes, "increments": _number(self.increments)}


@dataclass(frozen=True)
class RngReport:
    streams: list[Stream]
    increments_exact: bool  # False when a loop's trip count was unknown (increments then count one iteration)

    def counts(self) -> dict[str, int]:
        return {v: len(self.by_verdict(v)) for v in VERDICTS}

    def to_record(self, with_streams: bool = True) -> dict:
        """What results, the cache and ``--format json`` keep: totals, per pattern, and (optionally) per stream.

        Counter increments per step are given by verdict, in total (``dead_increments`` for the carried streams,
        ``drawn_increments``, ``unknown_increments``) and per pattern with the paths of its streams: what a ratchet
        on them compares, and what a finding names when they grow (seed 000's throughput loss was 672 dead ones at
        32 layers, with no entry parameter added where a stream was forced onto a shared one).
        """
        record = {"streams": len(self.streams), **self.counts(), "dead_params": self.dead_params,
                  "dead_bytes": sum(s.bytes for s in self.dead),
                  "dead_increments": _number(self.dead_increments),
                  "drawn_increments": _number(self.increments_of("drawn")),
                  "unknown_increments": _number(self.increments_of("unknown")),
                  "increments_exact": self.increments_exact,
                  "patterns": [p.to_record() for p in self.patterns()]}
        if with_streams:
            record["stream_list"] = [s.to_record() for s in self.streams]
        return record

    def by_verdict(self, verdict: str) -> list[Stream]:
        return [s for s in self.streams if s.verdict == verdict]

    @property
    def dead(self) -> list[Stream]:
        return self.by_verdict("carried")

    @property
    def dead_params(self) -> int:
        return sum(s.params for s in self.dead)

    @property
    def dead_increments(self) -> float:
        return self.increments_of("carried")

    def increments_of(self, verdict: str) -> float:
        """Counter increments per step of the streams with ``verdict``."""
        return sum(s.increments for s in self.by_verdict(verdict))

    def patterns(self) -> list["PatternCount"]:
        """Per stream pattern: streams by verdict and what the carried ones cost, most dead state first."""
        grouped: dict[str, PatternCount] = {}
        for s in self.streams:
            p = grouped.setdefault(s.pattern, PatternCount(s.pattern))
            p.add(s)
        return sorted(grouped.values(), key=lambda p: (-p.dead_params, -p.streams, p.pattern))


@dataclass
class PatternCount:
    pattern: str
    drawn: int = 0
    carried: int = 0
    unknown: int = 0
    dead_params: int = 0
    dead_increments: float = 0
    drawn_increments: float = 0
    unknown_increments: float = 0
    where: str = ""  # for unknown streams, the first place the analysis lost them
    paths: dict[str, list[str]] = field(default_factory=lambda: {v: [] for v in VERDICTS})  # verdict -> streams

    @property
    def streams(self) -> int:
        return self.drawn + self.carried + self.unknown

    def add(self, s: Stream) -> None:
        setattr(self, s.verdict, getattr(self, s.verdict) + 1)
        self.paths[s.verdict].append(s.path)
        if s.verdict == "carried":
            self.dead_params += s.params
            self.dead_increments += s.increments
        elif s.verdict == "drawn":
            self.drawn_increments += s.increments
        else:
            self.unknown_increments += s.increments
            self.where = self.where or s.where

    def to_record(self) -> dict:
        return {"pattern": self.pattern, "streams": self.streams, "drawn": self.drawn, "carried": self.carried,
                "unknown": self.unknown, "dead_params": self.dead_params,
                "dead_increments": _number(self.dead_increments), "drawn_increments": _number(self.drawn_increments),
                "unknown_increments": _number(self.unknown_increments), "where": self.where,
                "paths": {v: list(paths) for v, paths in self.paths.items()}}


def _number(x: float) -> int | float:
    return int(x) if float(x).is_integer() else x


def stream_path(param: EntryParam, rng_paths: AbstractSet[str] = frozenset()) -> str:
    """The stream an RNG parameter belongs to. NNX's ``RngStream`` holds a key and a count as ``<stream>.key`` /
    ``<stream>.count`` (``state.layers_0.dropout.rngs.key`` -> ``state.layers_0.dropout.rngs``): a count, one of
    NNX's types, a key beside its count or under an owner named ``rngs`` is such a leaf. Any other key (a linen
    ``TrainState``'s ``key`` field, a plain pytree's ``rng``, a typed key) is a stream of its own, named by its own
    path. ``rng_paths``: the paths of the module's RNG parameters."""
    head, _, last = param.path.rpartition(".")
    if not head:
        return param.path
    if param.role == "rng_count" or (param.kind or "").startswith("nnx.Rng"):
        return head
    if last == "key" and (f"{head}.count" in rng_paths or rng_owner(head.split(".")) is not None):
        return head
    return param.path


def pair_streams(params: Sequence[EntryParam]) -> list[tuple[str, EntryParam | None, EntryParam | None]]:
    """(path, key, count) for every stream, in entry parameter order of the first of the pair."""
    rng_paths = {p.path for p in params if p.is_rng}
    streams: dict[str, list] = {}
    for p in params:
        if p.is_rng:
            pair = streams.setdefault(stream_path(p, rng_paths), [None, None])
            pair[0 if p.role == "rng_key" else 1] = p
    return [(path, key, count) for path, (key, count) in streams.items()]


def classify_streams(module: HloModule, params: Sequence[EntryParam]) -> RngReport:
    """Classify every RNG stream of ``module`` (``params`` are its entry parameters, as ``entry_params`` gives)."""
    streams = pair_streams(params)
    bit_of: dict[int, int] = {}  # parameter number -> its bit: stream i's key is bit 2i, its count bit 2i+1
    for i, (_, key, count) in enumerate(streams):
        for bit, param in ((1 << 2 * i, key), (1 << 2 * i + 1, count)):
            if param is not None:
                bit_of[param.index] = bit
    count_bits = sum(1 << (2 * i + 1) for i, (_, _, count) in enumerate(streams) if count is not None)
    leaves, events = entry_flow(module, bit_of, count_bits)
    outputs = list(zip(leaves, module.entry.root.shape.leaves()))
    aliased = _aliased_leaves(module)  # output leaf -> the parameter number whose new value it is
    result = []
    for i, (path, key, count) in enumerate(streams):
        key_bit, count_bit = 1 << (2 * i), 1 << (2 * i + 1)
        own = (key_bit if key is not None else 0) | (count_bit if count is not None else 0)
        own_params = {p.index for p in (key, count) if p is not None}
        own_shapes = {p.shape.text.split("{")[0] for p in (key, count) if p is not None}
        renewed = count is None and key is not None and key.index not in aliased.values()
        verdict, where = _verdict(outputs, own, own_params, own_shapes, aliased,
                                  key_bit if key is not None else count_bit, events, renewed)
        leaf = key or count
        pattern = (leaf.folded_path if path == leaf.path else leaf.folded_path.rsplit(".", 1)[0]).removeprefix("state.")
        result.append(Stream(path=path, pattern=pattern, key=key, count=count, verdict=verdict, where=where,
                             increments=events.increments.get(count_bit, 0) if count is not None else 0))
    return RngReport(streams=result, increments_exact=not events.unknown_trips)


def _aliased_leaves(module: HloModule) -> dict[int, int]:
    """Leaf of the root's shape (in ``Shape.leaves`` order) -> the entry parameter number it is aliased to."""
    root_shape = module.entry.root.shape
    leaves = {}
    for output, parameter in output_aliases(module.header_attrs):
        shape, first = root_shape, 0
        try:
            for i in output:
                first += sum(len(e.leaves()) for e in shape.elements[:i])
                shape = shape.elements[i]
        except IndexError:
            continue
        if not shape.is_tuple:
            leaves[first] = parameter
    return leaves


def _verdict(outputs: list[tuple[tuple[int, int, int], Shape]], own: int, own_params: set[int], own_shapes: set[str],
             aliased: dict[int, int], key_bit: int, events: FlowEvents, renewed: bool) -> tuple[str, str]:
    """``renewed``: the stream is a key of its own whose next value no alias names (module doc)."""
    influenced = []  # (output index, leaf) of outputs that are not this stream's own state
    for index, ((k, b, u), shape) in enumerate(outputs):
        if not k & own:
            continue
        if index in aliased:
            if aliased[index] in own_params:
                continue  # the stream's new key or count, in the old one's buffer
        elif not k & ~own and (renewed or not b & own) and not u & own and shape.text.split("{")[0] in own_shapes:
            continue  # the stream's own key or count, handed back
        influenced.append((index, (k, b, u)))
    if not influenced:
        return "carried", ""
    if any(b & key_bit for _, (_, b, _) in influenced):
        return "drawn", first_site(events.draws, key_bit) or ""
    if any(u & own for _, (_, _, u) in influenced):
        return "unknown", f"passes through {first_site(events.opaque, own) or 'an operation not understood'}"
    index, (k, b, _) = influenced[0]
    what = "key" if k & key_bit else "count"
    return "unknown", f"the {what} reaches output {index} without random-bit generation"

