"""The target interface: what the runner needs from anything that can lower a cell.

One small protocol, one file per implementation beside it (maxtext.py, callable.py), as pip-audit does
for its dependency sources.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

from hlo_audit.hlo.constants import CapturedArray
from hlo_audit.matrix import Cell


class Unavailable(Exception):
    """The cell cannot be lowered on this machine (no CUDA device, package missing...); says why.

    Raised by a target, or by a user's callable, so the cell reports ``unavailable`` with the reason
    instead of an error, and is never silently dropped.
    """


class TargetError(ValueError):
    """The target spec does not resolve, or the target misbehaves; one line naming it."""


class CellConfigError(Exception):
    """The model's own configuration system rejected the cell; its message says why (no code location needed)."""


@dataclass(frozen=True)
class Lowering:
    """What lowering one cell produced: HLO text and, when known, jax's pytree keys of each entry parameter and
    the arrays the step closes over (``hlo_audit.capture``).

    A compiled cell's text is the module after XLA's optimizations, with what only compiling tells:
    ``memory`` (bytes by kind, from ``memory_analysis()``) and ``cost`` (flops, bytes accessed...). An optimized
    cell's is the same module before codegen, with memory and cost from XLA's buffer assignment and cost analysis
    (``hlo_audit.optimized``).
    """

    text: str
    arg_keys: tuple[tuple[str, ...], ...] | None = None
    captured: tuple[CapturedArray, ...] | None = None
    # What a reader of an ok cell must know about it, e.g. a recipe cross-lowered for an architecture it cannot run on.
    note: str = ""
    memory: dict[str, int] | None = None
    cost: dict[str, float] | None = None

    @classmethod
    def of(cls, lowered, cell: Cell, captured: tuple[CapturedArray, ...] | None = None, note: str = "") -> "Lowering":
        """The text of a jax ``Lowered`` at the cell's stage ("lowered", "optimized" or "compiled"), with its argument
        paths."""
        if cell.stage == "compiled":
            from hlo_audit.compiled import compile_lowering  # noqa: PLC0415 (jax: imported only by what lowers)

            return replace(compile_lowering(lowered), captured=captured, note=note)
        if cell.stage == "optimized":
            from hlo_audit.optimized import optimize_lowering  # noqa: PLC0415 (jax: imported only by what lowers)

            return replace(optimize_lowering(lowered, cell.topology), captured=captured, note=note)
        from hlo_audit.attribution import arg_keys  # noqa: PLC0415 (jax: imported only by what lowers)

        return cls(text=hlo_text(lowered), arg_keys=arg_keys(lowered), captured=captured, note=note)

    def meta(self) -> dict:
        """Everything but the text, as the cache stores it beside the text (JSON)."""
        return {"arg_keys": [list(k) for k in self.arg_keys] if self.arg_keys is not None else None,
                "captured": [a.to_record() for a in self.captured] if self.captured is not None else None,
                "note": self.note, "memory": self.memory, "cost": self.cost}

    @classmethod
    def from_cache(cls, text: str, meta: dict) -> "Lowering":
        """The lowering ``meta()`` and its text were stored from (older entries may lack the later fields)."""
        keys, captured = meta.get("arg_keys"), meta.get("captured")
        return cls(text, arg_keys=tuple(map(tuple, keys)) if keys is not None else None,
                   captured=tuple(CapturedArray.from_record(a) for a in captured) if captured is not None else None,
                   note=meta.get("note", ""), memory=meta.get("memory"), cost=meta.get("cost"))


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


def one_line(exc: BaseException) -> str:
    """An exception as one line: its own message, or its type when it has none."""
    return " ".join(str(exc).split()) or type(exc).__name__


class Target(Protocol):
    name: str

    def check_available(self, cell: Cell) -> None:
        """Raise Unavailable if the cell cannot be lowered here (cheap: runs before any lowering)."""

    def lower(self, cell: Cell) -> Lowering:
        """Lower the cell. Raise Unavailable or a configuration error with a one-line message."""

    def full_depth(self, model: str) -> int:
        """The model's real number of layers (for `--layers full` and scaling projections)."""

    def fingerprint(self) -> str:
        """Changes whenever the target's code changes (part of the cache key)."""


def get_target(spec: str) -> Target:
    """``maxtext`` or ``package.module:function``."""
    from hlo_audit.platforms import cpu_backend_only_without_accelerators  # noqa: PLC0415 (imports this module)

    cpu_backend_only_without_accelerators()  # for library callers too, not only the processes hlo-audit owns
    if spec == "maxtext":
        from hlo_audit.targets.maxtext import MaxTextTarget  # noqa: PLC0415 (jax/maxtext import on demand)

        return MaxTextTarget()
    from hlo_audit.targets.callable import CallableTarget  # noqa: PLC0415

    return CallableTarget(spec)
