"""What a target imports, as the installed distributions its workflow must install: ``init`` imports the target (to
describe it, or to read the callable's axes) inside ``recording_imports``, then ``imported_requirements`` names the
distributions that import brought in, with the versions installed here.

Two sources, because either alone misses some: the modules first loaded while the target was imported (what its
imports pulled in, at any depth), and the imports written in the user's own modules (read from their source: a
package hlo-audit had loaded already, optax for one, is no new module but still the target's to install). A module
of the user's repository is the repository's own (``pip install -e .`` installs it), not a distribution.
"""

from __future__ import annotations

import ast
import contextlib
import json
import re
import sys
import sysconfig
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from hlo_audit import host

# Loaded by jax when a backend starts (its platform plugins and their runtimes), not by the target: which one a
# machine uses is the platform's, installed with jax's extras (hlo-audit[tpu], jax[cuda12]), never the target's.
_REQUIREMENT_NAME = re.compile(r"[A-Za-z0-9._-]+")
_EXTRA = re.compile(r"\bextra\s*==")
_JAX_BACKENDS = ("jax_plugins", "jax_cuda12_plugin", "jax_cuda13_plugin", "libtpu", "nvidia")


@dataclass(frozen=True)
class Requirement:
    """One installed distribution the target imports: its name as installed, its version, and where it came from
    when pip cannot fetch it by version (a git URL, a local folder: ``direct_url.json``), else None."""

    name: str
    version: str
    url: str | None = None

    @property
    def pin(self) -> str:
        return f'"{self.name}=={self.version}"'


@dataclass(frozen=True)
class ImportedModules:
    """The modules loaded while the target was imported, and every module loaded then (their files are read)."""

    new: tuple[str, ...] = ()
    loaded: tuple[str, ...] = ()


@contextlib.contextmanager
def recording_imports() -> Iterator[list[ImportedModules]]:
    """A window over ``sys.modules``: on leaving it, the one-item list holds what was imported inside it."""
    before = set(sys.modules)
    found: list[ImportedModules] = []
    try:
        yield found
    finally:
        after = list(sys.modules)
        found.append(ImportedModules(new=tuple(sorted(set(after) - before)), loaded=tuple(sorted(after))))


def imported_requirements(imported: ImportedModules, folder: Path,
                          leave_out: Collection[str] = ()) -> tuple[Requirement, ...]:
    """The distributions the target's import brought in (``imported``), by name: every one the user's own modules
    import by name, and every other one first loaded then that hlo-audit's install does not bring already (what
    hlo-audit and ``leave_out``, the names pinned beside it, require, at any depth: numpy for jax, rich's Pygments).
    Never hlo-audit, the standard library or the repository's own modules under ``folder``."""
    folder = folder.resolve()
    named: dict[str, set[str]] = {}  # top-level module -> the files of it that were loaded: the user's imports
    pulled: dict[str, set[str]] = {}  # the same for what came in with them
    for name in imported.loaded:
        file = _file_of(name)
        if file is not None and _is_own(file, folder):
            for top in _imports_in(file):
                _add(named, top, folder)
    for name in imported.new:
        _add(pulled, name, folder)
    brought = _required(("hlo-audit", *leave_out))
    skipped = {_normalized(n) for n in (*leave_out, "hlo-audit")}
    found: dict[str, Requirement] = {}
    owners = metadata.packages_distributions()
    for tops, own in ((named, True), (pulled, False)):
        for top, files in tops.items():
            for dist in _owning(owners.get(top, []), files):
                key = _normalized(dist)
                if key in skipped or key in found or (not own and key in brought):
                    continue
                found[key] = Requirement(dist, host.installed_version(dist), _direct_url(dist))
    return tuple(sorted(found.values(), key=lambda r: _normalized(r.name)))


def _required(names: Collection[str]) -> set[str]:
    """``names`` and what their installed distributions require, at any depth (extras left out), normalized."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        key = _normalized(name)
        if key in seen:
            continue
        seen.add(key)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for requirement in requires:
            if not _EXTRA.search(requirement):  # ``; extra == "dev"``: only asked for by name
                todo.append(_REQUIREMENT_NAME.match(requirement).group(0))
    return seen


def _add(tops: dict[str, set[str]], name: str, folder: Path) -> None:
    top = name.partition(".")[0]
    if not top or top in sys.stdlib_module_names or top in sys.builtin_module_names or top == "hlo_audit" \
            or top in _JAX_BACKENDS or top.startswith("_"):
        return
    file = _file_of(name)
    if file is not None and (_is_own(file, folder) or _is_stdlib(file)):
        return
    tops.setdefault(top, set())
    if file is not None:
        tops[top].add(file)


def _file_of(name: str) -> str | None:
    module = sys.modules.get(name)
    file = getattr(module, "__file__", None) if module is not None else None
    return file if isinstance(file, str) else None


def _is_own(file: str, folder: Path) -> bool:
    """A file of the user's repository, not of an environment inside it (``.venv/lib/.../site-packages``)."""
    path = Path(file).resolve()
    return path.is_relative_to(folder) and not {"site-packages", "dist-packages"} & set(path.parts)


def _is_stdlib(file: str) -> bool:
    paths = sysconfig.get_paths()
    return file.startswith((paths["stdlib"], paths["platstdlib"])) and "site-packages" not in file


def _imports_in(file: str) -> set[str]:
    """The top-level names ``file``'s absolute imports name (``import optax``, ``from clu import metrics``)."""
    try:
        tree = ast.parse(Path(file).read_text(encoding="utf-8", errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return set()
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.partition(".")[0])
    return names


def _owning(dists: list[str], files: set[str]) -> list[str]:
    """The distributions of one top-level name that hold the files loaded from it: one name several share (a
    namespace package: ``google`` of protobuf and of others) is theirs only who installed those files."""
    if len(set(map(_normalized, dists))) <= 1 or not files:
        return dists[:1]
    owning = []
    for dist in dict.fromkeys(dists):
        try:
            located = {str(Path(str(f.locate())).resolve()) for f in metadata.distribution(dist).files or ()}
        except metadata.PackageNotFoundError:
            continue
        if any(str(Path(f).resolve()) in located for f in files):
            owning.append(dist)
    return owning


def _direct_url(dist: str) -> str | None:
    """Where pip installed ``dist`` from when not from an index (PEP 610's direct_url.json), else None."""
    try:
        text = metadata.distribution(dist).read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        return None
    if not text:
        return None
    try:
        return str(json.loads(text).get("url")) or None
    except (ValueError, AttributeError):
        return None


def _normalized(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")
