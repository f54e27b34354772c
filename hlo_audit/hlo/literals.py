"""A constant's value in words, for a change of it: ``77 -> 1``, or, for a literal too long to print, its size, a
digest and the first elements that differ.

A learning rate, a dropout rate, a loss scale or an epsilon changed is one literal changed (``constant(0.001)`` ->
``constant(0.002)``), and its two values are what a reviewer needs. A large literal (a table, weights baked in) is
summarized: its elements, a digest of its text (or of the values behind it where the text elides them as ``{...}``:
``constants.LITERAL_DIGEST_KEY``) and the first ``DIFFERING_SHOWN`` elements that differ, each at its index.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass

from hlo_audit.hlo.constants import literal_digest
from hlo_audit.hlo.text import Instruction

LITERAL_SHOWN = 40  # characters of a literal printed whole; a longer one is summarized
DIFFERING_SHOWN = 3  # differing elements a summary names
_SPACES = re.compile(r"\s+")


@dataclass(frozen=True)
class LiteralChange:
    """One constant's two values in words (``before`` / ``after``), its type (``f32[]``)."""

    shape: str
    before: str
    after: str


def literal_change(old: Instruction, new: Instruction) -> LiteralChange | None:
    """The values of two paired constants, when they differ (their literal, or the digest of an elided one)."""
    old_text, new_text = _tidy(old.literal), _tidy(new.literal)
    old_digest, new_digest = literal_digest(old), literal_digest(new)
    if old_text == new_text and old_digest == new_digest:
        return None
    shape = new.shape.text.split("{")[0] if "{" in new.shape.text else new.shape.text
    if old.shape.dtype != new.shape.dtype:
        shape = f"{old.shape.dtype} -> {shape}"
    if len(old_text) <= LITERAL_SHOWN and len(new_text) <= LITERAL_SHOWN and old_text != "{...}" \
            and new_text != "{...}":
        return LiteralChange(shape, old_text, new_text)
    old_values, new_values = elements(old_text), elements(new_text)
    differing = [i for i, (a, b) in enumerate(zip(old_values, new_values)) if a != b]
    differing += range(min(len(old_values), len(new_values)), max(len(old_values), len(new_values)))
    dims = tuple(new.shape.dims)
    return LiteralChange(shape, _summary(old_text, old_digest, old_values, differing, dims),
                         _summary(new_text, new_digest, new_values, differing, dims, of=len(differing)))


def elements(text: str) -> list[str]:
    """The elements of a literal as printed, in order (``{{1, 2}, {3, 4}}`` -> 1, 2, 3, 4); none for ``{...}``."""
    if text == "{...}":
        return []
    return [e for e in (part.strip() for part in re.split(r"[{},]", text)) if e]


def _summary(text: str, digest: str, values: Sequence[str], differing: Sequence[int], dims: tuple[int, ...],
             of: int | None = None) -> str:
    """``{1,024 elements, digest 3f2a9b1c; [3] 0.1, [7] 0.5}``; with ``of`` (the new side), how many differ."""
    digest = (digest or hashlib.sha256(text.encode()).hexdigest())[:8]
    size = f"{len(values):,} elements, " if values else ""
    shown = [f"[{_index(i, dims)}] {values[i]}" for i in differing[:DIFFERING_SHOWN] if i < len(values)]
    said = f"{{{size}digest {digest}" + (f"; {', '.join(shown)}" if shown else "") + "}"
    if of is not None and values:
        said += f" ({of:,} of {len(values):,} differ)"
    return said


def _index(flat: int, dims: tuple[int, ...]) -> str:
    """A flat element number as its index in row-major ``dims``: 7 of (2, 4) -> ``1,3``."""
    if len(dims) <= 1:
        return str(flat)
    index = []
    for d in reversed(dims):
        index.append(flat % d if d else 0)
        flat = flat // d if d else 0
    return ",".join(map(str, reversed(index)))


def _tidy(literal: str) -> str:
    return _SPACES.sub(" ", literal.strip())


