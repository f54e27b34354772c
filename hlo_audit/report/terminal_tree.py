"""`hlo-audit explain` on a terminal: a rich tree, one node per group, largest first."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.text import Text
from rich.tree import Tree

from hlo_audit.report.escape import terminal as esc
from hlo_audit.report.escape import visible
from hlo_audit.report.terminal import print_launches, print_whole
from hlo_audit.report.words import ROLE_SHORT, against_golden_text, human_bytes

if TYPE_CHECKING:
    from hlo_audit.commands.explain import Node

def _counts(counts: dict[str, int], short: dict[str, str] | None = None) -> str:
    return " ".join(f"{(short or {}).get(k, k)}:{v}" for k, v in counts.items())


def _label(node: Node, width: int, level: int) -> Text:
    """``count  name  dtypes | roles | bytes [| dead]``; details move to lines of their own when they would not fit."""
    record = node.to_record()
    parts = [_counts(record["by_dtype"]), _counts(record["by_role"], ROLE_SHORT), human_bytes(node.bytes)]
    rng = [f"drawn:{node.drawn_rng}"] if node.drawn_rng else []  # RNG state the step draws from (`hlo-audit rng`)
    if node.dead_rng:
        rng.append(f"never drawn:{node.dead_rng}")  # dead RNG state
    if rng:
        parts.append(" ".join(rng))
    label = Text()
    label.append(f"{node.count:>5}  ", style="bold")
    room = width - 4 * level - 7  # the tree's guides and the count column
    # A name longer than the room (a file's path) breaks after a '/', under itself.
    name_lines = _fold(visible(node.name), room)
    label.append("\n       ".join(name_lines), style="bold" if level == 0 else "")
    # All details beside the name when they fit; else on the next line, wrapping at a `|` when still too long.
    line = len(name_lines[-1]) + 2
    if line + len(" | ".join(parts)) > room:
        label.append("\n       ")
        line = 0
    else:
        label.append("  ")
    for i, part in enumerate(parts):
        if i and line + 3 + len(part) > room:
            label.append("\n       ")
            line = 0
        elif i:
            label.append(" | ", style="dim")
            line += 3
        label.append(part, style="dim")
        line += len(part)
    return label


def _fold(name: str, room: int) -> list[str]:
    """``name`` in lines of at most ``room`` characters, broken after a '/' where it can be."""
    lines: list[str] = []
    while len(name) > room > 0:
        cut = name.rfind("/", 0, room) + 1 or room
        lines.append(name[:cut])
        name = name[cut:]
    return [*lines, name]


def _grow(tree: Tree, node: Node, width: int, level: int) -> None:
    for child in node.ordered():
        _grow(tree.add(_label(child, width, level + 1)), child, width, level + 1)
    if node.hidden:
        tree.add(Text(f"{node.hidden_params:>5}  ... {node.hidden} more", style="dim italic"))


def print_explain(console: Console, node: Node, captured: Node | None = None, launches=None, against=None) -> None:
    """The entry parameters' tree, then (when the step closes over state) the tree of what it captured; then, for a
    GPU program, what one step launches; then, for a cell with a golden, the cell against it (``against``: the
    ``comparison.CellDelta`` check judges by)."""
    for root in (node, captured):
        if root is None:
            continue
        if root is captured:
            console.print(Text("captured as constants: arrays the step closes over instead of taking them",
                               style="bold"))
        tree = Tree(_label(root, console.width, 0), guide_style="dim")
        _grow(tree, root, console.width, 0)
        print_whole(console, tree)
    if launches:
        print_launches(console, launches)
    if against is not None:
        console.print(esc(against_golden_text(against)))
