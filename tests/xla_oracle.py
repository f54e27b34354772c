"""XLA's own HLO parser as the judge: what it builds from a text, counted the way hlo-audit counts.

jaxlib ships XLA's parser (``jax._src.lib.hlo.hlo_module_from_text``). It is private API, so hlo-audit's core
does not use it; the tests do, to hold hlo-audit's parser to XLA's: the same entry parameters by dtype, the
same computations, the same instructions per opcode.
"""

from __future__ import annotations

import re
from collections import Counter

from jax._src.lib import hlo

from hlo_audit.hlo.analysis import analyze

# HloOpcode kind -> the opcode as HLO text spells it (``cosine`` for kCos), read off the first instruction of
# that kind XLA prints. XLA prints async instructions in their shorthand (``custom-call-start``); hlo-audit,
# like XLA's IR, calls them ``async-start``.
_OPCODE_NAMES = {"Constant": "constant", "AsyncStart": "async-start", "AsyncUpdate": "async-update",
                 "AsyncDone": "async-done"}


def _opcode(instr) -> str:
    kind = str(instr.opcode).split(".k", 1)[1]
    name = _OPCODE_NAMES.get(kind)
    if name is None:
        after_shape = instr.to_string().split(" = ", 1)[1]
        if after_shape.startswith("("):  # a tuple shape: skip to its closing parenthesis
            depth = 0
            for end, c in enumerate(after_shape):
                depth += {"(": 1, ")": -1}.get(c, 0)
                if depth == 0:
                    break
            after_shape = after_shape[end + 1:]
        else:
            after_shape = after_shape.split(" ", 1)[1]
        name = _OPCODE_NAMES[kind] = after_shape.lstrip().split("(", 1)[0]
    return name


def _dtype(instr) -> str:
    """An instruction's element type as HLO text spells it (``f32``; ``tuple``, ``token``)."""
    shape = getattr(instr, "shape", None)
    if shape is not None:
        return str(shape.xla_element_type()).split(".", 1)[1].lower()
    after = instr.to_string().split(" = ", 1)[1]  # jaxlib 0.11's instructions have no shape: read XLA's own print
    if after.startswith("b("):  # a buffer type, b(f32[32]): its element type is its array's
        after = after[2:]
    return "tuple" if after.startswith("(") else re.match(r"[a-z0-9]+", after).group(0)


def xla_counts(text: str, entry: str | None = None) -> dict:
    """What XLA's parser built from ``text`` (raises if XLA rejects it). ``entry`` names the entry computation
    (else it is read off XLA's reprint)."""
    module = hlo.hlo_module_from_text(text)
    computations = module.computations()
    if entry is None:
        entry = module.to_string().split("\nENTRY %", 1)[1].split(" ", 1)[0]
    params = [i for i in next(c for c in computations if c.name == entry).instructions()
              if str(i.opcode) == "HloOpcode.kParameter"]
    return {
        "entry_params": len(params),
        "by_dtype": dict(Counter(_dtype(p) for p in params)),
        "computations": len(computations),
        "opcodes": dict(Counter(_opcode(i) for c in computations for i in c.instructions())),
    }


def our_counts(text: str, source: str = "<text>") -> dict:
    """The same numbers from hlo-audit's parser."""
    analysis = analyze(text, source)
    return {
        "entry_params": analysis.summary.entry_params,
        "by_dtype": dict(analysis.summary.by_dtype),
        "computations": len(analysis.module.computations),
        "opcodes": dict(Counter(i.opcode for i in analysis.module.instructions())),
    }
