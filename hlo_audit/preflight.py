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
* The backend a command runs on (``measure``): ``JAX_PLATFORMS=tpu`` on a host without a TPU fails when jax
  first starts its backends. Said as the platform asked, jax's reason, and what this host has (asked of a child
  process free to choose: ``_HOST_PROBE``, ~1 s, only once the asked backend failed).
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import subprocess
import sys
import tempfile


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


def _failed_probe(script: str, settings: dict[str, str], timeout: int) -> subprocess.CompletedProcess | None:
    """``script`` run by a child Python under this environment with ``settings``: the finished process when it
    failed; None when it succeeded or could not be asked (the lowering will then say what it says)."""
    try:
        probe = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                               env={**os.environ, **settings}, timeout=timeout, check=False,
                               stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return None if probe.returncode == 0 else probe


@functools.cache
def _xla_flags_problem(flags: str) -> str | None:
    """XLA's own words for what it refuses in ``flags``, or None when a child process parses them fine."""
    probe = _failed_probe(_XLA_PROBE, {"XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"}, timeout=120)
    if probe is None:
        return None
    said = [m for m in map(_GLOG.match, probe.stderr.splitlines()) if m]
    errors = [m.group(2) for m in said if m.group(1) == "E"] or [m.group(2) for m in said]
    if errors:
        return errors[0].strip()
    last = [line for line in probe.stderr.splitlines() if line.strip()]
    return last[-1].strip() if last else f"a process with it exited with {probe.returncode}"


_HOST_PROBE = ("from jax._src import xla_bridge; import jax; "
               "print('; '.join(f'{n} ({len(jax.devices(n))} x {jax.devices(n)[0].device_kind})' "
               "for n in sorted(xla_bridge.backends())))")
# jax's advice at the end of a backend's failure (the one line says what to set instead).
_JAX_ADVICE = re.compile(r"\s*\(set JAX_PLATFORMS='' to automatically choose an available backend\)\s*$")
_UNABLE = re.compile(r"^Unable to initialize backend '[^']*': ")


def check_backend(command: str) -> None:
    """Raise ``EnvironmentProblem`` when jax cannot start the backend this environment asks for (``JAX_PLATFORMS``,
    or jax's own choice), naming the platform asked, jax's reason and what this host has (module doc). What the
    backends' start-up writes on stderr (libtpu's complaints about a VM it is not on) is held, and passed on only
    when they start: a failure is the one line."""
    import jax  # noqa: PLC0415 (jax: imported only by what lowers or runs)

    with _stderr_held() as held:
        try:
            jax.devices()
            failure = None
        except Exception as exc:  # noqa: BLE001 (jax raises RuntimeError, or asserts when no backend is left)
            failure = _UNABLE.sub("", _JAX_ADVICE.sub("", " ".join(str(exc).split()))) or "no device of it"
    if failure is None:
        _pass_on(held)
        return
    raise _unstartable(command, os.environ.get("JAX_PLATFORMS") or jax.config.jax_platforms, failure)


def check_platforms() -> None:
    """Raise ``EnvironmentProblem`` when ``JAX_PLATFORMS`` (set by the user: hlo-audit sets only ``cpu``) names a
    backend this host cannot start, asked of a child process before any cell lowers (a worker, or this process,
    would otherwise fail every cell alike: exit 1, "a failing cell", for the environment's fault)."""
    asked = os.environ.get("JAX_PLATFORMS", "").strip()
    if asked and asked != "cpu":
        failure = _platforms_problem(asked)
        if failure:
            raise _unstartable("", asked, failure)


_PLATFORMS_PROBE = "import jax; jax.devices()"


@functools.cache
def _platforms_problem(asked: str) -> str | None:
    """jax's reason for not starting ``asked`` (the last line a child process says), or None when it starts."""
    # libtpu must not ask a cloud metadata server (host.py)
    settings = {"TPU_SKIP_MDS_QUERY": os.environ.get("TPU_SKIP_MDS_QUERY", "1"), "JAX_PLATFORMS": asked}
    probe = _failed_probe(_PLATFORMS_PROBE, settings, timeout=300)
    if probe is None:
        return None
    last = [line for line in probe.stderr.splitlines() if line.strip()]
    # "RuntimeError: Unable to initialize backend 'tpu': ...", or a bare "AssertionError" (no backend left)
    said = last[-1].split(": ", 1)[1] if last and ": " in last[-1] else ""
    return _UNABLE.sub("", _JAX_ADVICE.sub("", " ".join(said.split()))) or "no device of it"


def _unstartable(command: str, asked: str | None, failure: str) -> EnvironmentProblem:
    """``measure: JAX_PLATFORMS=tpu asks for tpu, which this host cannot start (...); this host has cpu (1 x cpu)``"""
    setting = f"JAX_PLATFORMS={asked} asks for {asked}" if asked else "jax asks for its default backend"
    return EnvironmentProblem(f"{command + ': ' if command else ''}{setting}, which this host cannot start "
                              f"({failure}); this host has {_host_backends()}")


@contextlib.contextmanager
def _stderr_held():
    """File descriptor 2 pointed at a temporary file for the block (C++ libraries write there directly); yields a
    list that holds what was written once the block ends."""
    kept: list[bytes] = []
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no stderr at all: nothing to hold
        yield kept
        return
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield kept
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            kept.append(held.read())


def _pass_on(kept: list[bytes]) -> None:
    if kept and kept[0]:
        sys.stderr.flush()
        os.write(2, kept[0])


@functools.cache
def _host_backends() -> str:
    """The backends jax starts here when free to choose, with their devices: ``cpu (1 x cpu)``."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    env.setdefault("TPU_SKIP_MDS_QUERY", "1")  # libtpu must not ask a cloud metadata server (host.py)
    try:
        probe = subprocess.run([sys.executable, "-c", _HOST_PROBE], capture_output=True, text=True, env=env,
                               timeout=120, check=False, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return "backends that could not be listed"
    found = probe.stdout.strip().splitlines()
    return found[-1] if probe.returncode == 0 and found else "no backend jax can start"
