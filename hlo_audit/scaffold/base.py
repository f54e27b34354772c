"""What every ``hlo-audit init`` scaffold shares: the request, the files it writes, TOML rendering, and the shape of
a target kind's scaffold (``TargetScaffold``: its config and its workflow's install step)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hlo_audit import host
from hlo_audit.config import DEFAULT_CONFIG_FILE, DEFAULTS
from hlo_audit.scaffold.imports import Requirement
from hlo_audit.scaffold.provenance import installed
from hlo_audit.usage import InputError

WORKFLOW_FILE = Path(".github/workflows/hlo-audit.yml")
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
# What JSON's escapes leave raw that TOML refuses in a basic string (DEL), with the C1 controls beside it: JSON
# escapes U+0000-U+001F, TOML also refuses U+007F (``TOMLDecodeError: Illegal character '\x7f'``, issue 34).
_RAW_CONTROLS = re.compile("[\x7f-\x9f]")


@dataclass(frozen=True)
class InitRequest:
    """What `hlo-audit init` was asked for: one target kind and its options."""

    kind: str  # a key of scaffold.KINDS: "maxtext", "callable" or "nnx"
    models: tuple[str, ...] = ()
    layers: tuple[int, ...] = (2, 4)
    quants: tuple[str, ...] = ()  # maxtext: its quantizations
    function: str = ""  # callable: package.module:function
    factory: str = ""  # nnx: package.module:Factory
    factory_config: str | None = None  # nnx: package.module:callable returning the model's config object
    inputs: tuple[tuple[str, str], ...] = ()  # nnx: argument -> DTYPE[DIMS]
    args: tuple[tuple[str, object], ...] = ()  # nnx: constructor keyword arguments
    fields: tuple[tuple[str, object], ...] = ()  # --set: the model's config fields (nnx: its config object's)
    labels: str | None = None
    layers_field: str | None = None
    scan_field: str | None = None
    optimizer: str = "adamw"
    learning_rate: float = 1e-4
    shards: int = 2
    excludes: tuple[tuple[tuple[str, object], ...], ...] = ()  # --exclude: [[exclude]] rules, each its key/values


@dataclass(frozen=True)
class Scaffold:
    """What init writes: the config's text, the workflow's, and where they go (relative to the repository)."""

    config: str
    workflow: str
    shards: int = 1  # the workflow's check jobs: as asked, at most one per depth series
    imported: tuple[Requirement, ...] = ()  # what the target's import brought in: the workflow installs it
    golden_dir: str = DEFAULTS["golden_dir"]
    files: tuple[Path, ...] = field(default=(Path(DEFAULT_CONFIG_FILE), WORKFLOW_FILE))


@dataclass(frozen=True)
class KindConfig:
    """A target kind's config text, and the versions of the model's library its goldens depend on (if any)."""

    text: str
    library: Mapping[str, str] | None = None


class TargetScaffold:
    """One target kind's scaffold: the option that asks for it, its config, its workflow's install lines."""

    kind: str
    option: str  # as the usage error names it: "--nnx package.module:Factory"
    pinned: tuple[str, ...] = ("jax", "jaxlib", "flax")  # what the goldens were made with

    def config(self, request: InitRequest) -> KindConfig:
        raise NotImplementedError

    def install(self, folder: Path, library: Mapping[str, str] | None,
                imported: Sequence[Requirement] = ()) -> list[str]:
        """The workflow's install step: hlo-audit with the versions the goldens were made with (jax, jaxlib, flax:
        under others the text rule is advisory), the model's library, what the target imports (``imported``, at
        the versions installed here), and the repository's own package."""
        lines = [f"pip install {tool_pin()} {pins(self.pinned)}".rstrip()]
        if library:
            lines.append("pip install " + " ".join(f'"{d}=={v}"' for d, v in library.items()) +
                         "  # the model's library, as the goldens were made")
        lines += imported_lines(folder, imported, leave_out=(*self.pinned, *(library or {})))
        if owns_package(folder):
            lines.append("pip install -e .")
        elif (folder / "requirements.txt").is_file():
            lines.append("pip install -r requirements.txt")
        return lines


def imported_lines(folder: Path, imported: Sequence[Requirement], leave_out: Sequence[str] = ()) -> list[str]:
    """The install lines of what the target imports: pinned to the versions installed when init ran (the goldens'
    own); one installed from a URL or a folder, which no index serves by version, is named in a comment."""
    left_out = {name.lower() for name in leave_out}
    wanted = [r for r in imported if r.name.lower() not in left_out and not _is_folder(r.url, folder)]
    lines = []
    indexed = [r for r in wanted if r.url is None]
    if indexed:
        lines.append("pip install " + " ".join(r.pin for r in indexed) +
                     "  # what the target imports, as installed when the goldens were made")
    lines += [f"# {r.name} {r.version} was installed from {r.url}: install it here too" for r in wanted if r.url]
    return lines


def _is_folder(url: str | None, folder: Path) -> bool:
    """Whether ``url`` is this repository itself (``pip install .`` of it: the install step's last line)."""
    return url is not None and url.startswith("file://") and Path(url.removeprefix("file://")) == folder


def owns_package(folder: Path) -> bool:
    return (folder / "pyproject.toml").is_file() or (folder / "setup.py").is_file()


def tool_pin(extra: str = "") -> str:
    """hlo-audit as every job of the workflow installs it: the one that wrote the workflow (the code running init:
    its version from an index, or the git URL and commit it was installed from: ``scaffold.provenance``), so the
    check and the merge read the same report schema and the goldens' text rule is the one they were written
    under."""
    return installed().requirement(extra)


def pins(names: Sequence[str]) -> str:
    return " ".join(f'"{name}=={host.installed_version(name)}"' for name in names
                    if host.installed_version(name) != "absent")


def toml_value(value) -> str:
    """A value as TOML writes it: strings as basic strings (JSON's escapes are TOML's), tables inline."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + " }" if value \
            else "{}"
    raise TypeError(f"no TOML for {type(value).__name__}")


def toml_string(text: str) -> str:
    """``text`` as a TOML basic string, every control character escaped (JSON's escapes are TOML's; DEL and the C1
    controls, which JSON leaves raw, as ``\\u007f``): the one way strings are written into TOML here. A string
    holding bytes that were not UTF-8 (an argument decoded with surrogate escapes) has no TOML: an InputError."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(f"init: {ascii(text)} is not UTF-8 text (an option given bytes that are not UTF-8); "
                         "nothing was written") from None
    return _RAW_CONTROLS.sub(lambda m: f"\\u{ord(m.group()):04x}", json.dumps(text, ensure_ascii=False))


def toml_key(key: str) -> str:
    return key if _BARE_KEY.match(key) else toml_string(key)


def assignments(table: Mapping) -> list[str]:
    return [f"{toml_key(k)} = {toml_value(v)}" for k, v in table.items()]


HEADER = """\
# hlo-audit's gate for this repository, written by `hlo-audit init`.
# `hlo-audit check` compares every cell with its golden (golden/); after an intended change,
# `hlo-audit golden update` (or the command a finding prints) and commit the golden diff with it.
# Every key is in hlo-audit's docs/configuration.md; `hlo-audit list` shows the cells this gives.
"""
