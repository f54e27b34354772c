"""Example projects for the tests: hlo-audit.toml written from keyword arguments, so a test says only how its
project differs from the example's (the MLP of hlo_audit/examples/nnx_mlp.py, one model, L2, scan off, quant none).

    config(quant=["none", "dropout0"], layers=[2, 3], waive=[DROPOUT_WAIVER])

A value is written as TOML: strings, numbers, booleans, lists of them, a dict as an inline table (``policy =
{rng_scaling = "warn"}``), a list of dicts as an array of tables (``[[waive]]``, ``[[matrix]]``) after every key.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
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
