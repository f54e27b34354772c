"""What an instruction does besides computing its value: side effects, and round trips to the host.

An instruction with a side effect must stay even when nothing reads its value: a host callback that prints
(``jax.debug.print`` lowers to a custom call with no users), a send, an outfeed. Two passes ask: RNG-state
stripping (rng.py), which removes what nothing live reads, and the structural diff (changes.py), which names the
host round trips a step gained or lost.

How jax lowers host work (jax 0.12, ``jax/_src/callback.py``, ``buffer_callback.py``, ``jax/_src/lax/lax.py``):

* CPU and GPU: a custom call ``xla_ffi_python_cpu_callback`` / ``xla_ffi_python_gpu_callback`` (partitioned:
  ``xla_ffi_partitioned_python_*_callback``; jax before the FFI: ``xla_python_cpu_callback`` /
  ``xla_python_gpu_callback``; ``jax.experimental.buffer_callback``: ``xla_buffer_python_*_callback``), marked
  ``custom_call_has_side_effect=true`` when the callback is ordered or has no results (``jax.debug.print``);
* TPU: ``send`` / ``recv`` (and their ``-done``) with ``is_host_transfer=true``, the host side named in
  ``frontend_attributes`` (``_xla_host_transfer_handler_name``);
* infeed / outfeed: host queues, whatever the platform.
"""

from __future__ import annotations

import re

from hlo_audit.hlo.rng_flow import PASS_THROUGH_CUSTOM_CALLS
from hlo_audit.hlo.text import Instruction

# Opcodes whose effect is outside their value: kept even when nothing reads them.
SIDE_EFFECTING_OPCODES = frozenset({
    "outfeed", "send", "send-done", "recv", "recv-done", "infeed", "after-all", "all-reduce-start",
    "rng-get-and-update-state",
})
HOST_TRANSFER_OPCODES = frozenset({"infeed", "outfeed", "send", "send-done", "recv", "recv-done"})
# Every host callback target jax has emitted (module doc); a user's own `*_python_*callback` too.
_HOST_CALLBACK_TARGET = re.compile(r"python.*callback|host_callback|callback.*python", re.IGNORECASE)
_TRUE = re.compile(r"^\s*true\s*$", re.IGNORECASE)


def declares_side_effect(instr: Instruction) -> bool:
    """A custom call that says it has one (``custom_call_has_side_effect=true``)."""
    value = instr.attrs.get("custom_call_has_side_effect")
    return value is not None and _TRUE.match(value) is not None


def is_host_callback(instr: Instruction) -> bool:
    """A custom call into Python on the host (``jax.debug.print``, ``jax.pure_callback``, ``io_callback``)."""
    return instr.opcode == "custom-call" and _HOST_CALLBACK_TARGET.search(instr.custom_call_target) is not None


def is_host_transfer(instr: Instruction) -> bool:
    """A round trip to the host: a host callback, an infeed or outfeed, a send or recv to the host (a send/recv
    between devices is a collective, not a host transfer)."""
    op = instr.opcode
    if op in ("infeed", "outfeed"):
        return True
    if op in HOST_TRANSFER_OPCODES:
        return _TRUE.match(instr.attrs.get("is_host_transfer", "")) is not None
    return is_host_callback(instr)


def has_side_effect(instr: Instruction) -> bool:
    """Whether removing ``instr`` when nothing reads its value would change what the program does. A sharding
    annotation is none, whatever it declares: Shardy marks ``xla.sdy.FuncResultSharding`` side-effecting only so
    that XLA keeps it on the value it annotates, and it goes with that value (an RNG key's, stripped)."""
    if instr.opcode in SIDE_EFFECTING_OPCODES:
        return True
    if instr.opcode == "custom-call":
        if instr.custom_call_target in PASS_THROUGH_CUSTOM_CALLS:
            return False
        return declares_side_effect(instr) or is_host_callback(instr)
    return False


def host_transfer_name(instr: Instruction) -> str:
    """What a host transfer is, as a reviewer names it: ``custom-call xla_ffi_python_cpu_callback``, ``outfeed``,
    ``send (host)``."""
    if instr.opcode == "custom-call":
        return f"custom-call {instr.custom_call_target}"
    if instr.opcode in ("send", "recv", "send-done", "recv-done"):
        return f"{instr.opcode} (host)"
    return instr.opcode
