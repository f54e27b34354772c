"""The words every layer shares: what a cell's stage produced, what can go wrong producing it, memory kinds.

A leaf: it imports nothing of hlo-audit but ``hlo/`` and no jax, so a platform, a stage, a target, the cache and
a formatter can all name these without importing each other's behaviour.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import traceback
from dataclasses import dataclass
from pathlib import Path

from hlo_audit.hlo.constants import CapturedArray
from hlo_audit.hlo.locations import Metadata
from hlo_audit.hlo.params import ArgLeaf
from hlo_audit.hlo.rng_keys import PlacedHazard


class Unavailable(Exception):
    """The cell cannot be lowered on this machine (no CUDA device, package missing...); says why.

    Raised by a platform, a target, or a user's callable, so the cell reports ``unavailable`` with the reason
    instead of an error, and is never silently dropped.
    """


class TargetError(ValueError):
    """The target spec does not resolve, or the target misbehaves; one line naming it."""


class CellConfigError(Exception):
    """The model's own configuration system rejected the cell; its message says why (no code location needed)."""


def one_line(exc: BaseException) -> str:
    """An exception as one line: its own message, or its type when it has none (or cannot say one: a ``__str__``
    that raises is a user's bug too, never a traceback here)."""
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001
        text = ""
    return " ".join(text.split()) or type(exc).__name__


# The libraries a lowering runs through: a failure raised inside them is the user's call's fault, said first.
_MACHINERY = ("jax", "jaxlib", "flax", "hlo_audit")


# The cache's import hook (cache/used.py, which records what a lowering imports) wraps ``__import__``: a failure
# passes through it as through the import machinery, and is never "raised in" it.
_IMPORT_HOOK = str(Path(__file__).resolve().parent / "cache" / "used.py")


def where_raised(exc: BaseException) -> str:
    """Where a failure happened, for a user to act on: the innermost frame that is the user's (not Python's own
    machinery: ``<frozen importlib.util>``, the standard library; not jax, jaxlib, flax or hlo-audit), then, when
    the failure was raised deeper, the innermost frame of all: ``trainer.py:7, raised in
    jax/_src/numpy/tensor_contractions.py:124``. A syntax error is placed at its own file and line (its traceback
    ends in the import machinery, never in the file that does not compile)."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return _frame_place(traceback.FrameSummary(exc.filename, exc.lineno, ""))
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not f.filename.startswith(("<", sysconfig.get_paths()["stdlib"])) and f.filename != _IMPORT_HOOK] or \
        traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "no traceback"
    machinery = _machinery_roots()
    user = [f for f in frames if not f.filename.startswith(machinery)]
    innermost = frames[-1]
    if not user or user[-1] is innermost:
        return _frame_place(innermost)
    return f"{_frame_place(user[-1])}, raised in {_frame_place(innermost)}"


def import_failure(module_name: str, exc: BaseException) -> str:
    """Why importing a user's module failed, in one line: the module not found (``cannot import 'x': No module
    named 'x'``), else what its own code raised and where (``importing 'model' failed: SyntaxError: expected ':'
    (model.py:3)``; ``... KeyError: 'missing' (model.py:4)``), a module it imports that is missing included."""
    if isinstance(exc, ModuleNotFoundError) and exc.name and (module_name == exc.name or
                                                               module_name.startswith(exc.name + ".")):
        return f"cannot import {module_name!r}: {one_line(exc)}"
    message = exc.msg if isinstance(exc, SyntaxError) and exc.msg else one_line(exc)
    if isinstance(exc, SyntaxError) and not exc.filename:  # a null byte: Python names no file, the module is it
        exc.filename = _origin(module_name)
    return f"importing {module_name!r} failed: {type(exc).__name__}: {' '.join(message.split())} ({where_raised(exc)})"


def _origin(module_name: str) -> str | None:
    """The file a module is loaded from, found without running it (its parent packages imported already)."""
    import importlib.util  # noqa: PLC0415

    try:
        spec = importlib.util.find_spec(module_name)
    except Exception:  # noqa: BLE001 (nothing more to name)
        return None
    return spec.origin if spec is not None else None


def _machinery_roots() -> tuple[str, ...]:
    """The folders of jax, jaxlib, flax and hlo-audit as loaded here (each with a trailing separator)."""
    roots = []
    for name in _MACHINERY:
        module = sys.modules.get(name)
        if module is not None and getattr(module, "__file__", None):
            roots.append(os.path.join(os.path.dirname(module.__file__), ""))
    return tuple(roots)


def _frame_place(frame: traceback.FrameSummary) -> str:
    """``file:line``: below its installed package (``jax/_src/api.py``), else below the working folder, else the
    file's name."""
    filename = frame.filename
    if "site-packages/" in filename:
        path = filename.split("site-packages/", 1)[-1]
    else:
        try:
            path = str(Path(filename).resolve().relative_to(Path.cwd().resolve()))
        except (ValueError, OSError):  # outside the working folder, or no working folder any more
            path = Path(filename).name
    return f"{path}:{frame.lineno}" if frame.lineno else path


@dataclass(frozen=True)
class MemoryKind:
    """One kind of bytes XLA's memory analysis reports per device."""

    key: str  # the record's key (JSON, goldens)
    label: str  # its column heading in the report views
    gated: bool  # the memory rule ratchets on it (more alias bytes means less memory, so those are not)
    xla_stat: str  # the jax ``CompiledMemoryStats`` attribute it is read from


MEMORY_KINDS = (
    MemoryKind("argument_bytes", "argument", True, "argument_size_in_bytes"),
    MemoryKind("output_bytes", "output", True, "output_size_in_bytes"),
    MemoryKind("alias_bytes", "alias", False, "alias_size_in_bytes"),
    MemoryKind("temp_bytes", "temp", True, "temp_size_in_bytes"),
    MemoryKind("generated_code_bytes", "code", True, "generated_code_size_in_bytes"),
)


@dataclass(frozen=True)
class Lowering:
    """What one cell's stage produced (``hlo_audit.stages``): its HLO text and what the stage knows besides.

    ``stage`` says which module ``text`` is: ``lowered`` (jax's module before XLA), ``optimized`` (after XLA's
    optimization passes and buffer assignment, before codegen) or ``compiled`` (after codegen). ``arg_keys`` are
    jax's pytree keys of each entry parameter, when known and checked against the module's parameters;
    ``arg_leaves`` each one's argument name and kind (``hlo_audit.attribution.arg_leaves``), alike;
    ``captured`` the arrays the step closes over (``hlo_audit.capture``). ``memory`` (bytes by
    ``MEMORY_KINDS`` key) and ``cost`` (flops, transcendentals, bytes accessed) exist from stage optimized on.
    ``dump`` is what the stage kept of XLA's dump besides the module, by kind: a GPU program's ``thunk_sequence``
    and ``thunk_metadata`` (stage compiled: what one step launches); empty for a GPU program of stage optimized,
    which ends before codegen writes them (launches are then counted from the module); None for other programs.
    """

    text: str
    stage: str = "lowered"
    arg_keys: tuple[tuple[str, ...], ...] | None = None
    arg_leaves: tuple[ArgLeaf, ...] | None = None
    captured: tuple[CapturedArray, ...] | None = None
    # What a reader of an ok cell must know about it, e.g. a recipe cross-lowered for an architecture it cannot run on.
    note: str = ""
    memory: dict[str, int] | None = None
    cost: dict[str, float] | None = None
    # (computation, instruction, sha256 of the literal) of each constant the text prints as `{...}`.
    literal_digests: tuple[tuple[str, str, str], ...] = ()
    # What the stage kept of XLA's dump, by the platform's name for it (a GPU's thunk sequence and metadata).
    dump: dict[str, str] | None = None
    # The instructions' metadata ``text`` is printed without (stage lowered): op_names, sources, stack frames; where
    # in the model each instruction comes from, for the places of its changes.
    metadata: Metadata | None = None
    # How many leaves the call's arguments have (jax's ``args_info``), those it pruned from the entry included: the
    # arrays the host flattens per call (the ``host_cost`` rule's count); None where jax did not say.
    call_leaves: int | None = None
    # The sizes the cell's config gives its target mesh, by axis (``hlo.mesh``: a size None is the rest of the
    # devices): what a sharding is judged on where the module lowered on the host's one device. None: the target
    # said none (a callable's), and the module's own mesh is all there is.
    mesh_sizes: dict[str, int | None] | None = None
    # The literal and reused keys of jax's module before XLA's passes, where ``text`` is XLA's (stages optimized and
    # compiled: ``stages.program.keys_before_xla``); None where the text shows its own draws (stage lowered).
    key_hazards: tuple[PlacedHazard, ...] | None = None

    def meta(self) -> dict:
        """Everything but the text, as the cache stores it beside the text (JSON)."""
        return {"stage": self.stage,
                "arg_keys": [list(k) for k in self.arg_keys] if self.arg_keys is not None else None,
                "arg_leaves": [a.to_record() for a in self.arg_leaves] if self.arg_leaves is not None else None,
                "captured": [a.to_record() for a in self.captured] if self.captured is not None else None,
                "note": self.note, "memory": self.memory, "cost": self.cost, "dump": self.dump,
                "literal_digests": [list(d) for d in self.literal_digests], "call_leaves": self.call_leaves,
                "mesh_sizes": self.mesh_sizes,
                **({"key_hazards": [h.to_record() for h in self.key_hazards]} if self.key_hazards is not None else {}),
                **({"metadata": self.metadata.to_record()} if self.metadata is not None else {})}

    @classmethod
    def from_cache(cls, text: str, meta: dict) -> "Lowering":
        """The lowering ``meta()`` and its text were stored from."""
        keys, captured, leaves = meta.get("arg_keys"), meta.get("captured"), meta.get("arg_leaves")
        return cls(text, stage=meta.get("stage", "lowered"),
                   arg_keys=tuple(map(tuple, keys)) if keys is not None else None,
                   arg_leaves=tuple(map(ArgLeaf.from_record, leaves)) if leaves is not None else None,
                   captured=tuple(CapturedArray.from_record(a) for a in captured) if captured is not None else None,
                   note=meta.get("note", ""), memory=meta.get("memory"), cost=meta.get("cost"),
                   dump=meta.get("dump"), literal_digests=tuple(tuple(d) for d in meta.get("literal_digests", ())),
                   metadata=Metadata.from_record(meta["metadata"]) if meta.get("metadata") is not None else None,
                   call_leaves=meta.get("call_leaves"), mesh_sizes=meta.get("mesh_sizes"),
                   key_hazards=None if meta.get("key_hazards") is None else tuple(
                       PlacedHazard.from_record(h) for h in meta["key_hazards"]))
