"""A change's place is the user's call site, not a wrapper both sides share.

An instruction's place is the innermost frame outside the frameworks (``locations``). Where that frame is a
project's own wrapper (MaxText's ``maybe_shard_with_logical`` around ``with_sharding_constraint``, a team's
``shard(x)``), every constraint of the program is placed at the wrapper's one line, and a pull request that adds a
call of it anywhere reads "at sharding.py:43": the frame says nothing of where the change is. Its caller does.

When is a frame a wrapper of one change, and not the place of what it computes? Read off both programs, from the
instructions of the change's kind (opcode; a custom call's target) whose stacks pass through the frame: where the
change is the frame's own (its code changed), every caller's instructions of that kind through it change with it;
where it is one caller's (a new call, another argument), some other caller's pass through it unchanged. So a frame is
climbed past, to the changed instruction's caller, when instructions of the kind pass through it unchanged from a
caller none of the changed ones comes from; and the first frame where that does not hold is the place. A helper two
layers call stays the place of a change made inside it; a line computing ``a * b * c`` whose one multiply changed
in every caller stays the place; a wrapper's new call moves to the call.

The frames above the traced function (whatever called ``jax.jit(...).lower``: a trainer, a test, hlo-audit's own
target) are every stack's common outer part and never a place. jax records the forward ops of a checkpointed
function with a stack cut short (``BLOCK < the caller of lower()``, the layer loop missing: the body is traced
again after the step's trace returned): those frames are left out of the callers compared, so a remat's copy of a
constraint is placed in the block, where the original is.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable

from hlo_audit.hlo.text import HloModule, Instruction

# One instruction's frames, innermost first: its source ``file:line`` and the user's frames that called it.
Chain = tuple[str, ...]


def kind_of(instr: Instruction) -> str:
    """What two instructions must share to be the same kind of work here: a custom call's target, else the opcode."""
    return f"custom-call {instr.custom_call_target}" if instr.opcode == "custom-call" else instr.opcode


class CallSites:
    """One module's instructions' frames, split into those a match kept and those it changed (``changed``), and the
    call site each changed instruction is placed at (module doc)."""

    def __init__(self, module: HloModule, chain: Callable[[Instruction, str], Chain],
                 changed: Callable[[Instruction, str], bool]):
        chains = [(kind_of(instr), c, changed(instr, comp.name)) for comp in module.computations.values()
                  for instr in comp.instructions if (c := chain(instr, comp.name))]
        self.outer = _common_outer(c for _, c, _ in chains)
        # (kind, frame) -> the paths (the frames above it, inner ones) instructions of the kind reach it by: the
        # changed ones', then the kept ones' at the frames a changed one passes through (all a place reads).
        self._changed: dict[tuple[str, str], set[Chain]] = defaultdict(set)
        self._kept: dict[tuple[str, str], set[Chain]] = defaultdict(set)
        for kind, c, is_changed in chains:
            if is_changed:
                inner = self.inner(c)
                for at, frame in enumerate(inner[:-1]):
                    self._changed[kind, frame].add(inner[at + 1:])
        for kind, c, is_changed in chains:
            if not is_changed:
                inner = self.inner(c)
                for at, frame in enumerate(inner[:-1]):
                    if (kind, frame) in self._changed:
                        self._kept[kind, frame].add(inner[at + 1:])

    def inner(self, chain: Chain) -> Chain:
        """The chain less the frames above the traced function (``outer``), each frame once: jax's transforms of a
        checkpointed function trace it again from within, so its frames recur above themselves
        (``block:12 < block:12 < loop:19``), which says no more of where an op is than once does."""
        cut = len(chain) - len(self.outer)
        inner = chain[:cut] if self.outer and cut > 0 and chain[cut:] == self.outer else chain
        return tuple(dict.fromkeys(inner)) if len(set(inner)) < len(inner) else inner

    def place(self, instr: Instruction, chain: Chain) -> str:
        """The frame of ``chain`` (a changed instruction's) that is the change's place: past every wrapper."""
        if not chain:
            return ""
        inner, kind = self.inner(chain), kind_of(instr)
        at = 0
        while at + 1 < len(inner) and self._shared(kind, inner[at]):
            at += 1
        return inner[at] if inner else chain[0]

    def _shared(self, kind: str, frame: str) -> bool:
        """Instructions of ``kind`` pass through ``frame`` unchanged by a path of callers no changed one comes by.
        A path is compared as far as it goes: jax cuts a checkpointed function's forward stack short, and a kept
        path that is the start of a changed one's is that one's (none at all says nothing)."""
        changed = self._changed.get((kind, frame), set())
        return any(path and not any(other[:len(path)] == path for other in changed)
                   for path in self._kept.get((kind, frame), ()))


def _common_outer(chains: Iterable[Chain]) -> Chain:
    """The longest tail the whole stacks end with (the frames above the traced function): the stacks of at least two
    frames that end where most do (what jax traced again later, a custom gradient's rule, a checkpointed function's
    forward, starts its stack inside the model and ends elsewhere), less each one's own innermost frame; none where no
    stack has two."""
    whole = [c for c in chains if len(c) >= 2]
    if not whole:
        return ()
    top = Counter(c[-1] for c in whole).most_common(1)[0][0]
    common: Chain | None = None
    for chain in whole:
        if chain[-1] != top:
            continue
        if common is None:
            common = chain[1:]
            continue
        n = 0
        while n < len(common) and n < len(chain) - 1 and common[-1 - n] == chain[-1 - n]:
            n += 1
        common = common[len(common) - n:]
    return common or ()
