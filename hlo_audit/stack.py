"""Which of a golden's environment is the compiler stack, and whether this run's stack is pinned (issue 37).

A golden records every version its cell's text depends on (``run.environment``): the compiler stack, which turns the
same program into other text (jax, jaxlib, XLA's plugins, libtpu, the CUDA toolchain and a GPU's target config,
Transformer Engine's compiled kernels; the platform and stage), and the code under test (MaxText for a MaxText
contributor, flax or the user's model library, optax, anything else a target records). Only a difference in the
compiler stack relaxes the text rules (the text, the op mix, the program's size): the same program printed by another
compiler. A version of the code under test is recorded and never relaxes anything: a pull request that bumps
maxtext 0.2.3 -> 0.2.4 beside a real change is judged as the change, and ``golden update`` does not rewrite a golden
for that version line alone.

Pinned or local (``stack_mode``): a CI runner's stack is pinned by its lock file, so there a golden recorded under
another stack is a mistake to re-bless, and the check fails (``MissingGolden``, naming the command); on a developer's
machine the stack may legitimately differ and the text rules stay advisory. A run is pinned where ``HLO_AUDIT_STACK``
says ``pinned``, or, unset, where ``CI`` is set true (GitHub Actions, GitLab, Buildkite and most CI set it) or
``GITHUB_ACTIONS`` is; ``HLO_AUDIT_STACK=local`` keeps a CI job local on purpose. The command reads those variables
once, at start-up, before it imports any target (``read_at_start``, the CLI's first act): code under test that sets
``HLO_AUDIT_STACK=local`` when it is imported cannot switch a CI run's pinned mode off (issue 48).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from enum import StrEnum

from hlo_audit.usage import InputError

# Environment keys that are the compiler stack (``run.environment``, ``platforms.*.toolchain``, the targets' TE
# versions): distributions that compile, and what the cell's id already fixes (platform, stage).
COMPILER_STACK = frozenset({
    "jax", "jaxlib", "libtpu", "libtpu-nightly", "jax-cuda12-plugin", "jax-cuda12-pjrt", "jax-cuda13-plugin",
    "jax-cuda13-pjrt", "gpu_target_sha256", "transformer-engine-jax", "transformer-engine", "transformer-engine-cu12",
    "platform", "stage"})
# Prefixes of compiler distributions with many names (NVIDIA's CUDA toolchain wheels: nvcc, cuDNN, cuBLAS...).
COMPILER_PREFIXES = ("nvidia-",)
STACK_VARIABLE = "HLO_AUDIT_STACK"
_TRUE = ("1", "true", "yes", "on")
# The variables that say the mode, as the command found them at start-up (``read_at_start``); None: not read yet
# (a library caller), and ``os.environ`` is read when asked.
MODE_VARIABLES = (STACK_VARIABLE, "CI", "GITHUB_ACTIONS")
_at_start: dict[str, str] | None = None


def read_at_start(environ: Mapping[str, str] | None = None) -> None:
    """Keep the mode's variables as they are now, before any target is imported: every later ``stack_mode`` /
    ``why_pinned`` reads these, whatever the code under test sets in ``os.environ`` meanwhile. Called by the CLI
    at the start of each command (and ``forget_start`` after it, so a library caller in the same process reads its
    own environment)."""
    global _at_start
    environ = os.environ if environ is None else environ
    _at_start = {name: environ[name] for name in MODE_VARIABLES if name in environ}


def forget_start() -> None:
    global _at_start
    _at_start = None


def _environment(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    if environ is not None:
        return environ
    return _at_start if _at_start is not None else os.environ


def is_compiler(key: str) -> bool:
    """Whether an environment key names part of the compiler stack (else: the code under test)."""
    return key in COMPILER_STACK or key.startswith(COMPILER_PREFIXES)


class StackMode(StrEnum):
    PINNED = "pinned"  # CI: a golden of another stack fails, re-bless under this one
    LOCAL = "local"  # a developer's machine: another stack's text differences are advisory


def stack_mode(environ: Mapping[str, str] | None = None) -> StackMode:
    """This run's mode (module doc), from ``environ`` (None: as the command found it at start-up, else
    ``os.environ``)."""
    environ = _environment(environ)
    said = environ.get(STACK_VARIABLE, "").strip().lower()
    if said in (StackMode.PINNED, StackMode.LOCAL):
        return StackMode(said)
    if said:
        raise InputError(f"{STACK_VARIABLE}={environ[STACK_VARIABLE]!r}: expected 'pinned' or 'local'")
    ci = environ.get("CI", "").strip().lower() in _TRUE or environ.get("GITHUB_ACTIONS", "").strip().lower() in _TRUE
    return StackMode.PINNED if ci else StackMode.LOCAL


def why_pinned(environ: Mapping[str, str] | None = None) -> str:
    """What made this run pinned, in words (``HLO_AUDIT_STACK=pinned``, ``CI=true``)."""
    environ = _environment(environ)
    for name in (STACK_VARIABLE, "CI", "GITHUB_ACTIONS"):
        if environ.get(name, "").strip():
            return f"{name}={environ[name].strip()}"
    return STACK_VARIABLE + "=pinned"


# What the cell's id fixes: a golden that says another is no golden of the cell (a CPU cell's golden saying
# "platform": "tpu" read as another compiler stack, and relaxed the text rules).
CELL_FIXED = ("platform", "stage")


def environment_problem(claimed: Mapping[str, str | None], running: Mapping[str, str | None]) -> str | None:
    """Why a golden's environment (``claimed``) is no record of the cell that this run's (``running``: what this
    stack records for the same cell) could be compared with, naming the key; None where it is one. The running
    stack says which keys a cell's environment holds: a key it does not record (``"libtpu"`` on a CPU cell), a
    compiler key it records and the golden lacks, or a platform or stage other than the cell's would each read as
    another compiler stack and relax the text rules on the golden's word (issue 48). Versions that differ are a
    stack moved (or code under test's), compared as such."""
    unknown = sorted(k for k in claimed if k not in running)
    if unknown:
        return (f"'environment.{unknown[0]}' is no key of this cell's environment (this stack records "
                f"{', '.join(sorted(running))})")
    missing = sorted(k for k in running if k not in claimed and is_compiler(k))
    if missing:
        return f"'environment.{missing[0]}' is missing (this stack records it for the cell: {running[missing[0]]})"
    for key in CELL_FIXED:
        if key in claimed and claimed[key] != running.get(key):
            return f"'environment.{key}' is {claimed[key]!r}: the cell's {key} is {running.get(key)!r}"
    return None
