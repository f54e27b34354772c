"""The target interface: what the runner needs from anything that can lower a cell.

One small protocol, one file per implementation beside it (maxtext.py, callable.py), as pip-audit does
for its dependency sources; ``hlo_audit.targets.get_target`` picks one by its spec.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from hlo_audit.lowering import Lowering, TargetError, Unavailable

if TYPE_CHECKING:
    from hlo_audit.matrix import Cell

__all__ = ["Lowering", "Target", "TargetError", "Unavailable"]  # Unavailable: what a user's callable raises


class Target(Protocol):
    name: str

    def check_available(self, cell: Cell) -> None:
        """Raise Unavailable if the cell cannot be lowered here (cheap: runs before any lowering)."""

    def lower(self, cell: Cell) -> Lowering:
        """Lower the cell and take it to its stage (``hlo_audit.stages.to_stage``). Raise Unavailable or a
        configuration error with a one-line message."""

    def full_depth(self, model: str) -> int:
        """The model's real number of layers (for `--layers full` and scaling projections)."""

    def versions(self, cell: Cell) -> dict[str, str]:
        """The installed versions the cell's exact HLO text depends on beyond jax, jaxlib and flax (the golden's
        environment): MaxText's, Transformer Engine's for a TE recipe."""
