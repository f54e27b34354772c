"""Whether this environment lets jax and XLA start at all, said in one line before any cell is lowered.

A value jax or XLA refuses is the environment's fault, not the program's: an environment error (exit 2), never a
failing cell (exit 1: "regression") nor a traceback.

* ``JAX_*``: jax reads its variables when it is imported and raises for a value it cannot read
  (``JAX_ENABLE_X64=maybe``, ``JAX_DEBUG_NANS=2``, ``JAX_NUM_CPU_DEVICES=abc``), naming the variable. jax is
  imported here, in the process that is about to import it for the target anyway, so this costs nothing.
* ``XLA_FLAGS``: XLA parses it the first time it needs its debug options and, for a flag it does not know or a
  value it cannot read, logs a fatal line and aborts the process (a worker, or the command itself). That is
  tried in a child process (``_XLA_PROBE``: jaxlib's ``CompileOptions()`` parses the flags; ~1 s, only when
  ``XLA_FLAGS`` is set and a cell is about to be lowered), and XLA's own line is the error.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys


class EnvironmentProblem(Exception):
    """An environment variable jax or XLA refuses; the message names it and quotes why."""


def check_jax_variables() -> None:
    """Raise ``EnvironmentProblem`` when jax cannot be imported with this environment's ``JAX_*`` values."""
    try:
        import jax  # noqa: F401, PLC0415 (jax: imported only by what lowers)
    except Exception as exc:  # noqa: BLE001 (whatever jax's import raises for a value it cannot read)
        given = ", ".join(f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith("JAX_"))
        raise EnvironmentProblem(f"jax cannot start with this environment ({given or 'no JAX_* set'}): "
                                 f"{type(exc).__name__}: {' '.join(str(exc).split())}") from None


def check_xla_flags() -> None:
    """Raise ``EnvironmentProblem`` when XLA refuses ``XLA_FLAGS`` (asked in a child process: module doc)."""
    flags = os.environ.get("XLA_FLAGS", "").strip()
    if flags:
        problem = _xla_flags_problem(flags)
        if problem:
            raise EnvironmentProblem(f"XLA_FLAGS={flags!r}: XLA refuses it: {problem}")


_XLA_PROBE = "from jax._src.lib import _jax; _jax.CompileOptions()"
# A glog line: severity letter, date, time, thread, file:line] message
_GLOG = re.compile(r"^([EF])\d{4} [\d:.]+\s+\d+ [^\]]+\] (.*)$")


@functools.cache
def _xla_flags_problem(flags: str) -> str | None:
    """XLA's own words for what it refuses in ``flags``, or None when a child process parses them fine."""
    env = {**os.environ, "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"}
    try:
        probe = subprocess.run([sys.executable, "-c", _XLA_PROBE], capture_output=True, text=True, env=env,
                               timeout=120, check=False, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None  # could not ask: the lowering will say what it says
    if probe.returncode == 0:
        return None
    said = [m for m in map(_GLOG.match, probe.stderr.splitlines()) if m]
    errors = [m.group(2) for m in said if m.group(1) == "E"] or [m.group(2) for m in said]
    if errors:
        return errors[0].strip()
    last = [line for line in probe.stderr.splitlines() if line.strip()]
    return last[-1].strip() if last else f"a process with it exited with {probe.returncode}"
