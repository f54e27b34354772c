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


def _label(node: Node, root: bool = False) -> Text:
    record = node.to_record()
    label = Text()
    label.append(f"{node.count:>5}  ", style="bold")
    label.append(node.name, style="bold" if root else "")
    label.append(f"  {_counts(record['by_dtype'])} | {_counts(record['by_role'], ROLE_SHORT)} | "
                 f"{human_bytes(node.bytes)}", style="dim")
    return label


def _grow(tree: Tree, node: Node) -> None:
    for child in node.ordered():
        _grow(tree.add(_label(child)), child)
    if node.hidden:
        tree.add(Text(f"{node.hidden_params:>5}  ... {node.hidden} more", style="dim italic"))


def print_explain(console: Console, node: Node) -> None:
    tree = Tree(_label(node, root=True), guide_style="dim")
    _grow(tree, node)
    console.print(tree)
