"""Example projects for the tests: hlo-audit.toml written from keyword arguments, so a test says only how its
project differs from the example's (the MLP of hlo_audit/examples/nnx_mlp.py, one model, L2, scan off, quant none).

    config(quant=["none", "dropout0"], layers=[2, 3], waive=[DROPOUT_WAIVER])

A value is written as TOML: strings, numbers, booleans, lists of them, a dict as an inline table (``policy =
{rng_scaling = "warn"}``), a list of dicts as an array of tables (``[[waive]]``, ``[[matrix]]``) after every key.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

EXAMPLE_TARGET = "hlo_audit.examples.nnx_mlp:lower"
# The example's dropout0 variant keeps a never-drawn stream per layer: the waiver a project of it carries.
DROPOUT_WAIVER = {"rule": "rng_scaling", "quant": "dropout0",
                  "reason": "the example keeps a never-drawn dropout stream on purpose"}


def _value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string for any text JSON escapes
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{key} = {_value(item)}" for key, item in value.items()) + "}"
    return "[" + ", ".join(_value(item) for item in value) + "]"


def _is_table_array(value) -> bool:
    return isinstance(value, (list, tuple)) and bool(value) and all(isinstance(item, Mapping) for item in value)


def config(target: str = EXAMPLE_TARGET, models=("mlp",), quant=("none",), layers=(2,), **settings) -> str:
    """The text of an hlo-audit.toml: the matrix, then ``settings`` in the order given (None: left out)."""
    keys = {"target": target, "models": models, "quant": quant, "layers": layers, **settings}
    lines = [f"{key} = {_value(value)}" for key, value in keys.items()
             if value is not None and not _is_table_array(value)]
    for key, rows in keys.items():
        if _is_table_array(rows):
            for row in rows:
                lines += ["", f"[[{key}]]", *(f"{name} = {_value(item)}" for name, item in row.items())]
    return "\n".join(lines) + "\n"


def project(folder: Path, files: Mapping[str, str] | None = None, **fields) -> Path:
    """``folder`` holding an hlo-audit.toml of ``config(**fields)`` and ``files`` (relative path -> text)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in (files or {}).items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    (folder / "hlo-audit.toml").write_text(config(**fields))
    return folder


def judged_against_base(folder: Path, module: Path, model: str, variants: Sequence[str], **settings) -> Path:
    """A project of ``module`` (a callable target, ``module:target``, whose ``cell.quant`` picks a variant) with the
    ``base`` variant's golden written by ``golden update`` and given to each of ``variants`` too: what a pull request
    that turns the base into a variant is checked against. The config is left naming the base; ``checking`` makes it
    name the variants to check."""
    folder.mkdir(parents=True)
    shutil.copy(module, folder / module.name)
    (folder / "hlo-audit.toml").write_text(config(target=f"{module.stem}:target", models=[model], quant=["base"],
                                                  scan=["off"], **settings))
    from in_process import hlo_audit_here  # the CLI, imported only by the tests that run it

    updated = hlo_audit_here(folder, "golden", "update")
    assert updated.returncode == 0, updated.stderr[-3000:]
    base = folder / "golden" / model / "scan-off" / "base"
    for variant in variants:
        for golden in base.rglob("*"):  # L2.json and L2.hlo.txt; a stage's, L2/compiled.json and its text
            if golden.is_file():
                mine = base.parent / variant / golden.relative_to(base)
                mine.parent.mkdir(parents=True, exist_ok=True)
                if golden.suffix == ".json":
                    record = json.loads(golden.read_text())
                    record["cell"] = record["cell"].replace("/base/", f"/{variant}/", 1)
                    mine.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
                else:
                    shutil.copy(golden, mine)
    return folder


def checking(folder: Path, module: Path, model: str, variants: Sequence[str], **settings) -> None:
    """``folder``'s config made to check ``variants`` (against the goldens ``judged_against_base`` gave them)."""
    (folder / "hlo-audit.toml").write_text(config(target=f"{module.stem}:target", models=[model],
                                                  quant=list(variants), scan=["off"], **settings))


def git(repo: Path, *args: str) -> str:
    """``git ARGS`` in ``repo`` as a fixed author, on a bare PATH (a test's commits alike on every machine)."""
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True,
                          env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                               "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin"}).stdout


def edit(path: Path, old: str, new: str) -> None:
    """``old`` (which must be there) replaced once by ``new``: a pull request's edit."""
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))
