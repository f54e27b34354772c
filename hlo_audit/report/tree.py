"""`hlo-audit explain` on a terminal: a rich tree, one node per group, largest first."""

from __future__ import annotations

from rich.console import Console
from rich.text import Text
from rich.tree import Tree

from hlo_audit.explain import Node

ROLE_SHORT = {"rng_key": "key", "rng_count": "count", "optimizer_state": "opt"}


def human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _counts(counts: dict[str, int], short: dict[str, str] | None = None) -> str:
    return " ".join(f"{(short or {}).get(k, k)}:{v}" for k, v in counts.items())


def _label(node: Node, width: int, level: int) -> Text:
    """``count  name  dtypes | roles | bytes``; the details move to a second line when the line would not fit."""
    record = node.to_record()
    details = f"{_counts(record['by_dtype'])} | {_counts(record['by_role'], ROLE_SHORT)} | {human_bytes(node.bytes)}"
    label = Text()
    label.append(f"{node.count:>5}  ", style="bold")
    label.append(node.name, style="bold" if level == 0 else "")
    indent = 4 * level  # the tree's guides
    fits = indent + 7 + len(node.name) + 2 + len(details) <= width
    label.append("  " if fits else "\n       ")
    label.append(details, style="dim")
    return label


def _grow(tree: Tree, node: Node, width: int, level: int) -> None:
    for child in node.ordered():
        _grow(tree.add(_label(child, width, level + 1)), child, width, level + 1)
    if node.hidden:
        tree.add(Text(f"{node.hidden_params:>5}  ... {node.hidden} more", style="dim italic"))


def print_explain(console: Console, node: Node) -> None:
    tree = Tree(_label(node, console.width, 0), guide_style="dim")
    _grow(tree, node, console.width, 0)
    console.print(tree)
