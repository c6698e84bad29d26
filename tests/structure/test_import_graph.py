"""Imports run one way: no circle between modules, and orchestration (searchjax.experiment, the benchmark
suites) above the primitives.

Every `import` statement in the source counts, including the ones inside functions: a lazy import that runs
back up is still a dependency a reader has to hold in mind, and it is how the circles we removed were hidden
(rl/setup -> eval/benchmarks -> rl/setup; models/checkpoint_io -> sharding -> models). Circles are looked for
between modules (`from pkg import name` lands on pkg.name when that is a module, else on pkg's __init__).
The orchestration rule is checked between units: a subpackage of searchjax (searchjax.models, searchjax.rl,
...), a top-level module of searchjax (searchjax.sharding, ...), or the retrieval package.
"""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
ORCHESTRATION = {"searchjax.experiment", "searchjax.bench"}


def _unit(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] == "retrieval":
        return "retrieval"
    if parts[0] != "searchjax":
        return None
    return ".".join(parts[:2]) if len(parts) > 1 else "searchjax"


def _module_name(path: pathlib.Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: pathlib.Path) -> list[tuple[str, int]]:
    """(imported module, line) for every import statement; `from pkg import name` counts as pkg.name when that is
    a module of ours (so `from searchjax.experiment import setup` lands on the experiment unit)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, node.lineno))
    return found


def unit_graph() -> dict[str, dict[str, list[str]]]:
    """unit -> {imported unit: ["path:line", ...]} over searchjax/ and retrieval/."""
    graph: dict[str, dict[str, list[str]]] = {}
    for top in ("searchjax", "retrieval"):
        for path in sorted((ROOT / top).rglob("*.py")):
            source = _unit(_module_name(path))
            edges = graph.setdefault(source, {})
            for module, line in _imports(path):
                target = _unit(module)
                if target is not None and target != source and target != "searchjax":
                    edges.setdefault(target, []).append(f"{path.relative_to(ROOT)}:{line}")
    return graph


def module_graph() -> dict[str, dict[str, list[str]]]:
    """module -> {imported module of ours: ["path:line", ...]} over searchjax/ and retrieval/."""
    paths = {_module_name(p): p for top in ("searchjax", "retrieval") for p in sorted((ROOT / top).rglob("*.py"))}
    graph: dict[str, dict[str, list[str]]] = {}
    for source, path in paths.items():
        edges = graph.setdefault(source, {})
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names if alias.name in paths]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in paths else node.module
                           for a in node.names]
                targets = [t for t in targets if t in paths]
            for target in targets:
                if target != source:
                    edges.setdefault(target, []).append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return graph


def find_cycle(graph: dict[str, dict]) -> list[str] | None:
    """One circle of units as [a, b, ..., a], or None (depth-first search with colours)."""
    colour: dict[str, int] = {}
    stack: list[str] = []

    def visit(node):
        colour[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, {})):
            if colour.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if colour.get(nxt) is None:
                found = visit(nxt)
                if found:
                    return found
        colour[node] = 2
        stack.pop()
        return None

    for node in sorted(graph):
        if colour.get(node) is None:
            found = visit(node)
            if found:
                return found
    return None


def test_no_circle_between_modules():
    graph = module_graph()
    cycle = find_cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(
        f"{a} ({graph[a][b][0]})" for a, b in zip(cycle, cycle[1:])) + f" -> {cycle[-1]}"


def test_primitives_never_import_orchestration():
    graph = unit_graph()
    upward = [f"{source} imports {target} at {', '.join(where)}" for source, edges in sorted(graph.items())
              if source not in ORCHESTRATION for target, where in sorted(edges.items()) if target in ORCHESTRATION]
    assert not upward, "\n".join(upward)


def test_the_checks_can_fail():
    """The detectors on hand-made graphs: a circle is found and reported in order; an upward edge is seen."""
    assert find_cycle({"a": {"b": ["x:1"]}, "b": {"c": ["y:2"]}, "c": {"a": ["z:3"]}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b": ["x:1"]}, "b": {}, "c": {"a": ["z:3"]}}) is None
    assert _unit("searchjax.experiment.loop") == "searchjax.experiment" and _unit("retrieval.index") == "retrieval"
    assert _unit("searchjax.sharding") == "searchjax.sharding" and _unit("numpy") is None
