"""``hlo-audit init``: the files that put a user's repository under the gate, as text.

Three things, and nothing is overwritten (``existing`` says what is already there, and init stops):

* ``hlo-audit.toml`` for the user's target: MaxText (their models and quantizations, the train step lowered from
  the MaxText installed, which in a contributor's checkout is their branch), a callable (``package.module:function``)
  or the stock NNX target (their library's model, described from its signatures and a forward pass:
  ``targets.nnx.describe``);
* ``.github/workflows/hlo-audit.yml``: GitHub Actions running ``check --shard K/N --format json`` on N runners, each
  with its own lowering cache, and a merge job whose verdict (``hlo-audit merge``) is the gate's;
* the first goldens: the CLI runs ``golden update`` once the two files are written.

The config is rendered, read back with ``tomllib`` and validated like any other before a byte is written, so what
init writes is a config hlo-audit reads.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hlo_audit import host
from hlo_audit.config import DEFAULT_CONFIG_FILE, DEFAULTS
from hlo_audit.targets import nnx_spec

WORKFLOW_FILE = Path(".github/workflows/hlo-audit.yml")
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


@dataclass(frozen=True)
class Scaffold:
    """What init writes: the config's text, the workflow's, and where they go (relative to the repository)."""

    config: str
    workflow: str
    golden_dir: str = DEFAULTS["golden_dir"]
    files: tuple[Path, ...] = field(default=(Path(DEFAULT_CONFIG_FILE), WORKFLOW_FILE))


def toml_value(value) -> str:
    """A value as TOML writes it: strings as basic strings (JSON's escapes are TOML's), tables inline."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + " }" if value \
            else "{}"
    raise TypeError(f"no TOML for {type(value).__name__}")


def toml_key(key: str) -> str:
    return key if _BARE_KEY.match(key) else json.dumps(key, ensure_ascii=False)


def _assignments(table: Mapping) -> list[str]:
    return [f"{toml_key(k)} = {toml_value(v)}" for k, v in table.items()]


HEADER = """\
# hlo-audit's gate for this repository, written by `hlo-audit init`.
# `hlo-audit check` compares every cell with its golden (golden/); after an intended change,
# `hlo-audit golden update` (or the command a finding prints) and commit the golden diff with it.
# Every key is in hlo-audit's docs/configuration.md; `hlo-audit list` shows the cells this gives.
"""


def maxtext_config(models: Sequence[str], quants: Sequence[str], layers: Sequence[int]) -> str:
    """MaxText's train step for the user's models: the default matrix's CPU series, their models and quants."""
    lines = [HEADER, 'target = "maxtext"  # the MaxText installed: in a contributor\'s checkout, their branch',
             f"models = {toml_value(list(models))}", f"quant = {toml_value(list(quants))}",
             f"layers = {toml_value(list(layers))}", 'scan = ["on", "off"]']
    return "\n".join(lines) + "\n"


def callable_config(function: str, models: Sequence[str], layers: Sequence[int]) -> str:
    lines = [HEADER, f"target = {toml_value(function)}  # called with each cell: see docs/configuration.md",
             f"models = {toml_value(list(models))}", f"layers = {toml_value(list(layers))}",
             '# quant: a free variant axis here: the function reads cell.quant ("none" unless you name others)',
             'quant = ["none"]']
    return "\n".join(lines) + "\n"


def nnx_config(name: str, spec: Mapping, layers: Sequence[int], optimizer: str, learning_rate: float) -> str:
    """The stock NNX target for one model of a library (``spec``: ``targets.nnx.describe``'s)."""
    scan = ("# scan: on and off (the model's config has the switch below)" if "scan" in spec
            else "# scan: off only (the model names no layer-scan switch)")
    lines = [HEADER, 'target = "nnx"  # a Flax NNX model in a standard train step: docs/nnx.md',
             f"models = {toml_value([name])}", f"layers = {toml_value(list(layers))}", scan, "",
             "[nnx]  # shared by every model", f"optimizer = {toml_value(optimizer)}",
             f"learning_rate = {toml_value(learning_rate)}", "", f"[nnx.models.{toml_key(name)}]"]
    lines += _assignments({k: v for k, v in spec.items()})
    return "\n".join(lines) + "\n"


def _pins(names: Sequence[str]) -> str:
    return " ".join(f'"{name}=={host.installed_version(name)}"' for name in names
                    if host.installed_version(name) != "absent")


def workflow(install: Sequence[str], shards: int, python: str = "3.12") -> str:
    """GitHub Actions: ``shards`` check jobs, each its own cache, then the merge job that gives the verdict.

    The cache is restored from any earlier run of the same shard (``restore-keys``): each entry verifies itself
    (a damaged or stale one is a miss, never a wrong answer), so a cache from another commit only saves time; the
    key names the commit, so every run saves what it lowered and the cache follows the branch.
    """
    shard_list = ", ".join(str(k) for k in range(1, shards + 1))
    steps = "\n".join(f"          {line}" for line in install)
    return f"""\
# hlo-audit's gate, written by `hlo-audit init`: `hlo-audit check` in {shards} shards, merged into one verdict.
name: hlo-audit
on:
  pull_request:
  push:
    branches: [main]
jobs:
  check:
    runs-on: ubuntu-latest
    strategy:
      fail-fast: false  # every shard reports, so the merge sees the whole matrix
      matrix:
        shard: [{shard_list}]
    steps:
      - uses: actions/checkout@v4
      - uses: actions/setup-python@v5
        with:
          python-version: "{python}"
      - name: Install
        run: |
          python -m pip install --upgrade pip
{steps}
      # Entries verify themselves (a damaged or stale one is a miss, never a wrong answer), so any earlier cache of
      # this shard is safe to start from; the key names the commit, so each run saves what it lowered.
      - uses: actions/cache@v4
        with:
          path: .hlo-audit-cache
          key: hlo-audit-${{{{ runner.os }}}}-py{python}-shard${{{{ matrix.shard }}}}-${{{{ github.sha }}}}
          restore-keys: |
            hlo-audit-${{{{ runner.os }}}}-py{python}-shard${{{{ matrix.shard }}}}-
      - name: hlo-audit check, shard ${{{{ matrix.shard }}}} of {shards}
        run: >-
          hlo-audit check --shard ${{{{ matrix.shard }}}}/{shards} --format json
          --junit junit-${{{{ matrix.shard }}}}.xml > shard-${{{{ matrix.shard }}}}.json
      - uses: actions/upload-artifact@v4
        if: always()
        with:
          name: hlo-audit-shard-${{{{ matrix.shard }}}}
          path: |
            shard-${{{{ matrix.shard }}}}.json
            junit-${{{{ matrix.shard }}}}.xml
  merge:
    needs: check
    if: always()  # a failing shard still reports: the merge says what failed, and fails the same way
    runs-on: ubuntu-latest
    steps:
      - uses: actions/setup-python@v5
        with:
          python-version: "{python}"
      - run: python -m pip install {_pins(["hlo-audit"]) or "hlo-audit"}
      - uses: actions/download-artifact@v4
        with:
          pattern: hlo-audit-shard-*
          merge-multiple: true
      # Every shard's report must be there (a runner that died before uploading is an error, exit 2); the summary
      # goes to the job summary.
      - run: hlo-audit merge shard-*.json --junit hlo-audit.xml
"""


def install_lines(target: str, folder: Path, library: Mapping[str, str] | None = None) -> list[str]:
    """The workflow's install step: hlo-audit with the versions the goldens were made with (jax, jaxlib, flax:
    under others the text rule is advisory), the model's library, and the repository's own package."""
    own_package = (folder / "pyproject.toml").is_file() or (folder / "setup.py").is_file()
    if target == "maxtext":
        lines = [f'pip install "hlo-audit[maxtext]" {_pins(["jax", "jaxlib", "flax", "maxtext"])}'.rstrip()]
        if own_package:
            # A MaxText checkout over the release: the gate lowers this branch's MaxText, the release brings
            # what its train step imports.
            lines.append("pip install --no-deps -e .  # this checkout's MaxText over the release")
        return lines
    names = ["jax", "jaxlib", "flax"] + (["optax"] if target == nnx_spec.TARGET else [])
    lines = [f"pip install hlo-audit {_pins(names)}".rstrip()]
    if library:
        lines.append("pip install " + " ".join(f'"{d}=={v}"' for d, v in library.items()) +
                     "  # the model's library, as the goldens were made")
    if own_package:
        lines.append("pip install -e .")
    elif (folder / "requirements.txt").is_file():
        lines.append("pip install -r requirements.txt")
    return lines


def existing(folder: Path, golden_dir: str = DEFAULTS["golden_dir"]) -> list[str]:
    """What init would overwrite or shadow: its two files, the golden folder, a [tool.hlo-audit] table. A symbolic
    link counts wherever it points, nowhere included (init never writes through one)."""
    found = [str(p) for p in (Path(DEFAULT_CONFIG_FILE), WORKFLOW_FILE) if os.path.lexists(folder / p)]
    if os.path.lexists(folder / golden_dir):
        found.append(f"{golden_dir}/")
    pyproject = folder / "pyproject.toml"
    if pyproject.is_file() and re.search(r"^\s*\[\s*tool\s*\.\s*(?:\"hlo-audit\"|hlo-audit)\s*[\].]",
                                         pyproject.read_text(errors="replace"), re.M):
        found.append("pyproject.toml [tool.hlo-audit]")
    return found


def ignores_cache(folder: Path) -> bool:
    """Whether the repository's .gitignore already names the cache folder (init never edits it)."""
    ignore = folder / ".gitignore"
    cache = DEFAULTS["cache_dir"]
    return ignore.is_file() and any(line.strip().strip("/") == cache
                                    for line in ignore.read_text(errors="replace").splitlines())


def unwritable(folder: Path, files: Sequence[Path] = (Path(DEFAULT_CONFIG_FILE), WORKFLOW_FILE),
               folders: Sequence[str] = (DEFAULTS["golden_dir"], DEFAULTS["cache_dir"])) -> str | None:
    """Why init could not write every path it would (its files; the golden and cache folders ``golden update``
    makes right after), checked for all of them before any is written, or None. For each: every part of the path
    that exists must be a folder (``.github`` a file cannot hold ``.github/workflows/``), and the deepest folder
    that exists must let files be created in it (a read-only folder, a read-only filesystem)."""
    folder_paths = [Path(f) for f in folders]
    for relative in (*files, *folder_paths):
        deepest = folder
        for part in relative.parts[:-1]:
            if not os.path.lexists(deepest / part):
                break
            if not (deepest / part).is_dir():
                return f"{(deepest / part).relative_to(folder)} is not a folder, where init writes {relative}"
            deepest = deepest / part
        else:
            if relative in folder_paths and os.path.lexists(folder / relative) and not (folder / relative).is_dir():
                return f"{relative} is not a folder, where init's golden update writes"
        if not os.access(deepest, os.W_OK | os.X_OK):
            where = folder if deepest == folder else deepest.relative_to(folder)
            return f"cannot create {relative} in {where}: permission denied (a read-only folder or filesystem)"
    return None


def write(folder: Path, scaffold: Scaffold) -> list[Path]:
    """Write the scaffold's files, each created anew (``x``: a file that appeared since ``existing`` looked is
    not overwritten either): all of them or, when one cannot be written, none (what was made is removed)."""
    written: list[Path] = []
    made: list[Path] = []
    try:
        for relative, text in zip(scaffold.files, (scaffold.config, scaffold.workflow)):
            path = folder / relative
            missing = [p for p in reversed(path.parents) if p.is_relative_to(folder) and not os.path.lexists(p)]
            for parent in missing:
                parent.mkdir()
                made.append(parent)
            with open(path, "x", encoding="utf-8") as handle:
                written.append(path)
                handle.write(text)
    except BaseException:
        for path in reversed(written):
            with contextlib.suppress(OSError):
                path.unlink()
        for parent in reversed(made):
            with contextlib.suppress(OSError):
                parent.rmdir()
        raise
    return written
