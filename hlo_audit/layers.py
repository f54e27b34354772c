"""hlo-audit's modules in layers, lowest first: a module imports only from its own layer and the ones below.

The contract is checked by the test suite (``tests/test_layers.py`` walks every import, function-local ones
included) and read by the cache: the layers up to ``targets`` are hlo-audit's lowering side, whose source is
part of every cached lowering's key (``cache.lowering_fingerprint``), so a new module there is keyed without
anyone listing it. Names are module paths below ``hlo_audit``; ``name.*`` is every module of a package.
"""

from __future__ import annotations

import fnmatch

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # Shared words and leaves: records, the host process, jax's argument paths (and the user's, behind a wrapper that
    # flattens them: wrapped_args), MaxText's vocabulary.
    # report.escape: how a string from input is made safe for each sink (every layer that prints uses it).
    ("words", ("layers", "lowering", "host", "preflight", "files", "usage", "wrapped_args", "attribution", "capture",
               "targets.vocab", "report.escape")),
    ("platforms", ("platforms", "platforms.*")),
    ("cells", ("matrix",)),
    ("stages", ("stages", "stages.*")),
    ("targets", ("targets", "targets.*")),
    # Typed records of what a run produced and what the gate found, and the rules it applies: data, no behaviour
    # of the pipeline (above the targets: a record's edit re-analyses, it does not re-lower). The rules are one spec
    # each, a pure function of a cell's comparison (``rules.registry``); with them the comparison they read
    # (``comparison``: a cell against its golden, worked out once) and what it reads of a golden (its record, what it
    # lacks) and of a depth series (``scaling``): below the config, which validates a ``[policy]`` against the specs.
    ("records", ("analysed", "results", "policy", "findings", "host_cost", "stack", "ab_verdicts", "rules", "rules.*",
                 "scaling", "golden.record", "golden.health", "comparison", "patch", "coverage")),
    # Config -> cells -> results: the plan, the cache, the run and what it says on stderr while it runs.
    # This process's side of the lowering processes (workers: hlo_audit.worker runs there, started by name).
    ("running", ("defaults", "config", "resolve", "plan", "cache", "cache.*", "run", "termination", "progress",
                 "workers")),
    # Results -> an outcome: the golden store, the gate; the digest of the project tree the outcome judged
    # (provenance).
    ("judging", ("golden", "golden.*", "judging", "judging.*", "provenance")),
    # The commands' own steps over an outcome or the cells' results: golden update, measure, explain and what `rng`,
    # `explain`, `lower` and `diff` read. Below the formats, which print what they return.
    ("command steps", ("commands", "commands.*")),
    # An outcome -> text: every format, the wording they share, the check JSON both ways (merge).
    ("formats", ("report", "report.*", "merge")),
    # worker: the lowering processes' entry point (``python -m hlo_audit.worker``), the only place a target runs.
    ("entry points", ("audit", "errors", "streams", "scaffold", "scaffold.*", "cli", "pytest_plugin", "__main__", "",
                  "worker",
                  "examples", "examples.*")),
)
# The HLO core: jax-free, below everything, importing nothing outside itself.
CORE = ("hlo", "hlo.*")
LOWERING_SIDE_TOP = "targets"


def layer_of(module: str) -> int | None:
    """The layer index of a module path below hlo_audit ("" is the package itself); -1 for the HLO core; None when
    no layer names it. The most specific pattern wins (``targets.vocab`` over ``targets.*``)."""
    if any(fnmatch.fnmatchcase(module, pattern) for pattern in CORE):
        return -1
    matches = [(len(pattern), index) for index, (_, patterns) in enumerate(LAYERS) for pattern in patterns
               if fnmatch.fnmatchcase(module, pattern)]
    return max(matches)[1] if matches else None


def is_lowering_side(module: str) -> bool:
    """hlo-audit's own code between a target and the text a cell's stage hands on (not the HLO core, which
    only analyses that text)."""
    layer = layer_of(module)
    top = next(i for i, (name, _) in enumerate(LAYERS) if name == LOWERING_SIDE_TOP)
    return layer is not None and 0 <= layer <= top


# --------------------------------------------------------------------------------------------------------------
# The check: every import in the package's source, function-local ones included
# --------------------------------------------------------------------------------------------------------------

PACKAGE = "hlo_audit"


def module_name(relative: str) -> str:
    """``platforms/tpu.py`` -> ``platforms.tpu``; ``platforms/__init__.py`` -> ``platforms``; the package's -> ""."""
    parts = relative.removesuffix(".py").split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports(module: str, source: str, modules: set[str]) -> set[str]:
    """The hlo_audit modules ``source`` imports, at any depth of its code; a ``from`` import of a name that is a
    module counts as importing that module. Imports under ``if TYPE_CHECKING:`` count as well: a type named from a
    higher layer is that layer's record read from below, which is what the layers keep out."""
    import ast  # noqa: PLC0415 (the check runs in tests and `python -m hlo_audit.layers` only)

    tree = ast.parse(source)
    package = module if _is_package(module, modules) else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(_own(alias.name, modules) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, package)
            for alias in node.names:
                # `from hlo_audit import platforms` imports a module; `from hlo_audit.lowering import Lowering`, a name.
                submodule = _own(f"{base}.{alias.name}", modules)
                named_module = submodule is not None and submodule.endswith(alias.name)
                found.add(submodule if named_module else _own(base, modules))
    found.discard(None)
    found.discard(module)
    return found


def _is_package(module: str, modules: set[str]) -> bool:
    return module == "" or any(m.startswith(module + ".") for m in modules)


def _absolute(node, package: str) -> str:
    """The absolute module a ``from`` import names (relative imports resolved against ``package``)."""
    if not node.level:
        return node.module or ""
    parts = ([PACKAGE] + package.split(".")) if package else [PACKAGE]
    parts = parts[: len(parts) - (node.level - 1)]
    return ".".join(parts + ([node.module] if node.module else []))


def _own(dotted: str, modules: set[str]) -> str | None:
    """The hlo_audit module ``dotted`` names (its longest existing prefix), None outside the package."""
    if dotted != PACKAGE and not dotted.startswith(PACKAGE + "."):
        return None
    parts = dotted.removeprefix(PACKAGE).lstrip(".").split(".") if dotted != PACKAGE else []
    while parts and ".".join(parts) not in modules:
        parts.pop()
    return ".".join(parts)


def import_graph(root) -> dict[str, set[str]]:
    """module -> the hlo_audit modules it imports, for every module under ``root`` (the package folder)."""
    from pathlib import Path  # noqa: PLC0415

    root = Path(root)
    sources = {module_name(str(p.relative_to(root))): p.read_text() for p in sorted(root.rglob("*.py"))}
    return graph_of(sources)


def graph_of(sources: dict[str, str]) -> dict[str, set[str]]:
    modules = set(sources)
    return {module: imports(module, source, modules) for module, source in sources.items()}


def violations(graph: dict[str, set[str]]) -> list[str]:
    """What breaks the contract: a module in no layer, an import from a higher layer, the HLO core importing
    anything outside it, and every import cycle."""
    problems = []
    for module, targets in sorted(graph.items()):
        layer = layer_of(module)
        if layer is None:
            problems.append(f"{_name(module)}: in no layer of hlo_audit.layers.LAYERS")
            continue
        for target in sorted(targets):
            target_layer = layer_of(target)
            if target_layer is None:
                continue  # reported as its own module
            if layer == -1 and target_layer != -1:
                problems.append(f"{_name(module)} -> {_name(target)}: the HLO core imports nothing outside hlo/")
            elif target_layer > layer:
                problems.append(f"{_name(module)} ({_layer_name(layer)}) -> {_name(target)} "
                                f"({_layer_name(target_layer)}): an import from a higher layer")
    problems += [f"import cycle: {' -> '.join(map(_name, cycle))}" for cycle in cycles(graph)]
    return problems


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each strongly connected component of more than one module, as a closed path through it (Tarjan's; the
    package's graph is ~100 modules deep at most, so recursion is fine)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = stack[stack.index(node):]
            del stack[stack.index(node):]
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [[*component, component[0]] for component in components]


def _name(module: str) -> str:
    return f"{PACKAGE}.{module}" if module else PACKAGE


def _layer_name(layer: int) -> str:
    return "hlo core" if layer == -1 else LAYERS[layer][0]


def main() -> int:
    """``python -m hlo_audit.layers``: the import graph, one ``module -> module`` edge a line, then any
    violation; exit 1 when there is one."""
    from pathlib import Path  # noqa: PLC0415

    graph = import_graph(Path(__file__).resolve().parent)
    for module in sorted(graph):
        for target in sorted(graph[module]):
            print(f"{_name(module)} -> {_name(target)}")
    problems = violations(graph)
    for problem in problems:
        print(f"violation: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
