"""``hlo-audit init``: the files that put a user's repository under the gate, as text.

Three things, and nothing is overwritten (``existing`` says what is already there, and init stops):

* ``hlo-audit.toml`` for the user's target, made by that kind's scaffold (``KINDS``: one module each, registered
  here as platforms are: MaxText, a callable, the stock NNX target);
* ``.github/workflows/hlo-audit.yml`` (``workflow``), its install step the kind's;
* the first goldens: the CLI runs ``golden update`` once the two files are written.

The config is rendered, read back with ``tomllib`` and validated like any other before a byte is written, so what
init writes is a config hlo-audit reads.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tomllib
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from hlo_audit.config import DEFAULT_CONFIG_FILE, DEFAULTS, ConfigError, validate
from hlo_audit.files import confined
from hlo_audit.matrix import text_problem
from hlo_audit.plan import parse_layers
from hlo_audit.resolve import resolve
from hlo_audit.scaffold.base import WORKFLOW_FILE, InitRequest, Scaffold, TargetScaffold
from hlo_audit.scaffold.callable import CallableScaffold
from hlo_audit.scaffold.imports import imported_requirements, recording_imports
from hlo_audit.scaffold.maxtext import MaxTextScaffold
from hlo_audit.scaffold.nnx import NnxScaffold
from hlo_audit.scaffold.provenance import installed
from hlo_audit.scaffold.refused import Excluded, exclude_refused, named_excludes, parse_excludes
from hlo_audit.scaffold.workflow import workflow
from hlo_audit.usage import InputError

# One scaffold per target kind, in the order the usage error names their options.
KINDS: dict[str, TargetScaffold] = {s.kind: s for s in (NnxScaffold(), CallableScaffold(), MaxTextScaffold())}

__all__ = ["KINDS", "Excluded", "InitRequest", "Scaffold", "exclude_refused", "existing", "ignores_cache",
           "init_request", "init_scaffold", "notes", "stays_inside", "unwritable", "write"]


def init_request(*, nnx: str | None, nnx_config: str | None, function: str | None, maxtext: bool,
                 models: Sequence[str], quant: str | None, layers: str, inputs: Sequence[str], args: Sequence[str],
                 labels: str | None, layers_field: str | None, scan_field: str | None, optimizer: str,
                 learning_rate: float, shards: int, sets: Sequence[str] = (),
                 excludes: Sequence[str] = ()) -> InitRequest:
    """`hlo-audit init`'s options as a request: exactly one target kind, depths (no 'full': a scaffold names its
    series), ``NAME=VALUE`` pairs; a bad option is an InputError naming it."""
    given = {"nnx": nnx, "callable": function, "maxtext": maxtext}
    kinds = [kind for kind in KINDS if given[kind]]
    if len(kinds) != 1:
        raise InputError("init: name the target: one of " + ", ".join(s.option for s in KINDS.values()))
    depths = parse_layers(layers) or []
    if not depths or "full" in depths:
        raise InputError(f"init --layers: give depths such as 2,4, got {layers!r}")
    return InitRequest(
        kind=kinds[0], models=tuple(models), layers=tuple(int(d) for d in depths),
        quants=tuple(q.strip() for q in quant.split(",")) if quant else (), function=function or "",
        factory=nnx or "", factory_config=nnx_config, inputs=tuple(_pairs(inputs, "--input")),
        args=tuple((k, _toml_value(v)) for k, v in _pairs(args, "--arg")),
        fields=tuple(_field_values(_pairs(sets, "--set"))), labels=labels,
        layers_field=layers_field, scan_field=scan_field, optimizer=optimizer, learning_rate=learning_rate,
        shards=shards, excludes=parse_excludes(excludes))


def _pairs(values: Sequence[str], option: str) -> list[tuple[str, str]]:
    """``NAME=VALUE`` options as pairs; anything else is a usage error naming the option."""
    pairs = []
    for value in values:
        name, sep, rest = value.partition("=")
        if not sep or not name.strip() or not rest.strip():
            raise InputError(f"{option} expects NAME=VALUE, got {value!r}")
        pairs.append((name.strip(), rest.strip()))
    return pairs


def _toml_value(text: str):
    """``--arg width=16`` gives 16, ``rate=0.1`` 0.1, ``flag=true`` True; anything else stays a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


# A value TOML cannot read is a string only when it is a bare word (``dtype=bfloat16``, ``name=v1.2``); anything
# else (``[1,``, ``"open``, ``1e``) is a typo that would otherwise be written as a string and fail much later.
_BARE_WORD = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:/-]*$")


def _field_values(pairs: Sequence[tuple[str, str]]) -> list[tuple[str, object]]:
    """``--set`` pairs with TOML's types (int, float, bool, string, arrays); a name given twice or a value that is
    neither TOML nor a bare word is an InputError naming it."""
    fields: dict[str, object] = {}
    for name, text in pairs:
        if name in fields:
            raise InputError(f"--set {name}: given twice")
        # Raw, TOML refuses it in a string (it would be "not a value"); escaped, the config's validation refuses it.
        if problem := text_problem(text):
            raise InputError(f"--set {name}: the value {problem}; a config's values hold none")
        try:
            fields[name] = tomllib.loads(f"v = {text}")["v"]
        except tomllib.TOMLDecodeError:
            if not _BARE_WORD.match(text):
                raise InputError(f"--set {name}={text}: not a value (an int, float, true/false, or a string: "
                                 "quote one with spaces or symbols)") from None
            fields[name] = text
        if not isinstance(fields[name], (int, float, str, list)):  # a date or a table: no config field's kind
            raise InputError(f"--set {name}={text}: a {type(fields[name]).__name__}: give an int, float, true/false "
                             "or a string")
    return list(fields.items())


def init_scaffold(folder: Path, request: InitRequest) -> Scaffold:
    """The config and workflow for ``request``, the config read back and resolved as any config is (a bad option
    is a ConfigError or InputError naming it, before anything is written). Nothing is overwritten: a file init
    would write that exists already is an InputError naming it."""
    found = existing(folder)
    if found:
        raise InputError(f"init: {', '.join(found)} already there in {folder}: init writes only what is not "
                         "(edit the config by hand, or remove them first)")
    if problem := unwritable(folder):  # every path checked before any is written
        raise InputError(f"init: {problem}; nothing was written")
    stays_inside(folder)
    kind = KINDS[request.kind]
    # Describing the target (nnx) and resolving the config (a callable's axes) import it: what that import brings
    # in is what the workflow's runner must install (a target's optax, clu, grain ...), not only jax and flax.
    with recording_imports() as imported:
        config = kind.config(request)
        if request.excludes:  # what the user left out outright, validated with the rest
            config = replace(config, text=config.text + named_excludes(request.excludes))
        try:
            cells = resolve(validate(tomllib.loads(config.text), DEFAULT_CONFIG_FILE, folder)).cells()
        except ConfigError as exc:
            raise InputError(f"init: the config it would write is refused: {exc}") from None
    requirements = imported_requirements(imported[0], folder, leave_out=(*kind.pinned, *(config.library or {})))
    # `check --shard` deals whole depth series (the scaling rule needs every depth of one): more shards than
    # series would leave some with no cell, a runner spent on nothing.
    shards = min(request.shards, len({c.series for c in cells}))
    install = kind.install(folder, config.library, requirements)
    return Scaffold(config=config.text, workflow=workflow(install, shards, python=running_python()), shards=shards,
                    imported=requirements)


def running_python() -> str:
    """The Python the goldens are made with (``3.11``): the workflow's runners set up the same."""
    return f"{sys.version_info.major}.{sys.version_info.minor}"


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


def notes(folder: Path, scaffold: Scaffold, request: InitRequest) -> list[str]:
    """What init tells besides the files it wrote: fewer check jobs than asked, a cache folder git would track."""
    said = []
    if scaffold.shards < request.shards:
        said.append(f"the workflow checks in {scaffold.shards} shard{'s' if scaffold.shards > 1 else ''}, not "
                    f"{request.shards}: one per depth series at most (a series is never split)")
    if scaffold.imported:
        said.append("the workflow installs what the target imports, at the versions installed here: " +
                    ", ".join(f"{r.name} {r.version}" for r in scaffold.imported))
    if not ignores_cache(folder):
        said.append(f"{DEFAULTS['cache_dir']}/ will hold the lowering cache: add it to .gitignore")
    if advice := installed().advice():  # the workflow's comment says the same where it is edited
        said.append(f"the workflow needs an edit before it runs: {advice}")
    return said


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


def stays_inside(folder: Path, files: Sequence[Path] = (Path(DEFAULT_CONFIG_FILE), WORKFLOW_FILE),
                 folders: Sequence[str] = (DEFAULTS["golden_dir"], DEFAULTS["cache_dir"])) -> None:
    """Refuse (``files.LinkedOut``: one line, exit 2) every path init writes, or its golden update right after, that
    a symbolic link leads out of the project folder (``.github`` linked to a folder elsewhere): checked for all of
    them before any is written."""
    for relative in (*files, *folders):
        confined(folder / relative, folder, f"init's {relative}")


def write(folder: Path, scaffold: Scaffold) -> list[Path]:
    """Write the scaffold's files, each created anew (``x``: a file that appeared since ``existing`` looked is
    not overwritten either): all of them or, when one cannot be written, none (what was made is removed). A path
    a link leads out of the project is refused before any (``stays_inside``)."""
    stays_inside(folder, scaffold.files, ())
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
