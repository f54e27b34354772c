"""No string-keyed record crosses a module boundary inside the pipeline: results, findings, outcomes, goldens and
views are typed (frozen dataclasses, enums), and dicts appear only at the edges where data leaves or enters the
process, each converted in one place beside its schema.

Checked on the source (``ast``): every annotation of a function's parameters and return, and of a dataclass's
fields, in every module from the ``records`` layer up (``hlo_audit.layers``; the HLO core and the lowering side
have their own records), must not be a record dict: ``dict``, ``Mapping`` or ``Any``-valued tables, containers of
them, or the edges' aliases (``Record``, ``Json``, ``CapturedRecord``). Tables keyed by data (``dict[str, int]``
counts by dtype, ``Mapping[str, Line]`` fits by role) are not records and pass. Allowed: the edge modules
(``EDGES``) and the converters (``CONVERTERS``: a record's ``to_record`` / ``from_record``, a golden's ``to_json``
/ ``from_json``, what hands the HLO core its own records back)."""

from __future__ import annotations

import ast
from pathlib import Path

import hlo_audit
from hlo_audit import layers

ROOT = Path(hlo_audit.__file__).resolve().parent

# Where data leaves or enters the process, and the module that converts it.
EDGES = {
    "cache": "results cache entries and manifests (JSON on disk, and what a lowering read, handed between processes)",
    "cache.key": "cache entries", "cache.reads": "cache entries", "cache.store": "cache entries",
    "cache.moved": "cache entries (a lowering record and a manifest variant's reads, their lines moved)",
    "cache.used": "Python's import machinery (a module's globals, what __import__ is handed)",
    "config": "the config's TOML tables in", "defaults": "the default config, as TOML tables",
    "resolve": "the config's TOML tables", "golden.record": "golden records (JSON files)",
    "golden.snapshot": "golden files read (the marker is checked on the JSON)", "merge": "the check JSON, out and in",
    "report.jsonfmt": "every JSON format out", "report.frame": "pandas rows (CSV out)",
    "scaffold": "init's TOML out", "scaffold.base": "init's TOML out", "scaffold.nnx": "init's TOML out",
    "scaffold.refused": "init's TOML out (the [[exclude]] tables of refused cells)",
    "worker": "the lowering processes' JSON out (a cell's lowering, what it read) and the jobs they are handed",
    "workers": "the lowering processes' JSON in, before run reads it into typed records",
}
# A record's own schema (to_record / from_record, a golden's to_json / from_json), what hands the HLO core its own
# records back (golden_summary, CapturedDelta.of), a series' projection as the scaling JSON prints it (projected), a
# launch change as a finding's details and `diff`'s JSON carry it (launch_change_record).
CONVERTERS = {"to_record", "from_record", "to_json", "from_json", "golden_summary", "of", "summary_of", "projected",
              "launch_change_record"}
# A finding's JSON details, the check JSON's edge, shaped by each rule's module (``RuleSpec.details``: ``details``,
# ``_rng_details``...).
CONVERTER_SUFFIX = "details"
RECORD_ALIASES = {"Record", "Json", "CapturedRecord", "Any"}
MAPPINGS = {"dict", "Dict", "Mapping", "MutableMapping"}
CONTAINERS = {"list", "tuple", "set", "frozenset", "Sequence", "Iterable", "Iterator"}


def _is_record(node: ast.expr | None) -> bool:
    """Whether an annotation is (or holds) a string-keyed record rather than a typed value or a table of them."""
    if node is None or isinstance(node, ast.Constant):
        return False
    if isinstance(node, ast.Name):
        return node.id in MAPPINGS | RECORD_ALIASES
    if isinstance(node, ast.Attribute):
        return node.attr in MAPPINGS
    if isinstance(node, ast.BinOp):  # X | Y
        return _is_record(node.left) or _is_record(node.right)
    if isinstance(node, ast.Subscript):
        base = node.value.id if isinstance(node.value, ast.Name) else getattr(node.value, "attr", "")
        args = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if base in MAPPINGS:  # a table: its values decide (counts by dtype pass, Any or dicts do not)
            return any(_is_record(a) or (isinstance(a, ast.Name) and a.id == "object") for a in args[1:])
        if base in CONTAINERS | {"Optional", "Union"}:
            return any(_is_record(a) for a in args)
    return False


def _annotations(tree: ast.Module):
    """(where, annotation) of every function signature and dataclass field, converters left out."""
    for node in ast.walk(tree):
        if (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name not in CONVERTERS
                and not node.name.endswith(CONVERTER_SUFFIX)):
            args = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs,
                    *filter(None, (node.args.vararg, node.args.kwarg))]
            yield from ((f"{node.name}({a.arg})", a.annotation) for a in args)
            yield f"{node.name} -> return", node.returns
        elif isinstance(node, ast.ClassDef) and any("dataclass" in ast.unparse(d) for d in node.decorator_list):
            yield from ((f"{node.name}.{s.target.id}", s.annotation) for s in node.body
                        if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name))


def _pipeline_modules() -> dict[str, Path]:
    first = next(i for i, (name, _) in enumerate(layers.LAYERS) if name == "records")
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        module = layers.module_name(path.relative_to(ROOT).as_posix())
        layer = layers.layer_of(module)
        if layer is not None and layer >= first and not module.startswith("examples") and module != "":
            found[module] = path
    return found


def test_no_record_dict_crosses_a_module_boundary_outside_the_edges():
    offenders = []
    for module, path in _pipeline_modules().items():
        if module in EDGES:
            continue
        for where, annotation in _annotations(ast.parse(path.read_text())):
            if _is_record(annotation):
                offenders.append(f"{module}.{where}: {ast.unparse(annotation)}")
    assert offenders == []


def test_the_check_sees_a_record_dict():
    """The check can fail: a result field, a formatter's parameter and a list of them are caught; tables pass."""
    def flagged(source: str) -> list[str]:
        return [where for where, a in _annotations(ast.parse(source)) if _is_record(a)]

    assert flagged("@dataclass\nclass R:\n    rng: dict | None\n    by_dtype: dict[str, int]\n") == ["R.rng"]
    assert flagged("def f(record: Mapping[str, Any], n: Mapping[str, Line]) -> list[dict]: ...") == [
        "f(record)", "f -> return"]
    assert flagged("def to_record(self) -> dict: ...") == []
    assert set(EDGES) <= set(_pipeline_modules()), set(EDGES) - set(_pipeline_modules())
