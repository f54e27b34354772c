"""Stage ``lowered``: jax's module as it hands it to XLA, with jax's argument paths."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hlo_audit.attribution import arg_keys
from hlo_audit.lowering import Lowering

if TYPE_CHECKING:
    from hlo_audit.matrix import Cell


def run(lowered, cell: Cell) -> Lowering:
    return Lowering(text=hlo_text(lowered), arg_keys=arg_keys(lowered))


def hlo_text(lowered) -> str:
    """``lowered.as_text(dialect="hlo")``, except that constants of more than ten elements print as ``{...}``.

    A step that closes over model state holds it as literals, and jax prints them in full: MaxEngine's serve-mode
    decode step with real weights is ~1.93 GB of text at 2 layers. XLA's parser reads ``{...}`` back (the shape
    stays, the values go), and no analysis here reads the values of a constant that large. jax has no public
    switch for it, so its own printer is called with XLA's ``print_large_constants`` off.
    """
    from jax._src.lib import hlo  # noqa: PLC0415 (jax's HloPrintOptions; no public name)

    options = hlo.HloPrintOptions.short_parsable()  # what as_text(dialect="hlo") uses, without metadata
    options.print_metadata = False
    options.print_large_constants = False
    return lowered.compiler_ir(dialect="hlo").as_hlo_module().to_string(options)
