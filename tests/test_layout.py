"""The package layout: no import circle among tridentflow's and state's modules (imports inside
functions included), and the dependency direction the guide fixes."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT

PACKAGES = ("tridentflow", "state")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def first_party_imports(path: Path, modules: set[str]) -> set[str]:
    """The first-party modules ``path`` imports anywhere in it (a package's __init__ counts
    for a module inside it only if it is imported itself)."""
    found: set[str] = set()
    package = module_name(path).rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            names = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
    return found


def import_graph() -> dict[str, set[str]]:
    paths = [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")]
    modules = {module_name(p) for p in paths}
    return {
        module_name(p): first_party_imports(p, modules) - {module_name(p)} - set(PACKAGES)
        for p in paths
    }


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return [*stack[stack.index(dep) :], dep]
            if dep not in state and (cycle := visit(dep)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_circle():
    graph = import_graph()
    assert "tridentflow.engines.base" in graph and "tridentflow.sources.base" in graph
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_the_cycle_finder_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_dependency_direction():
    """state/ imports no tridentflow, Airflow or Spark; the engines and sources import
    neither the steps (runtime, coordinator, committer...) nor Airflow; spark_jobs no Airflow."""
    graph = import_graph()
    for module, deps in graph.items():
        if module.startswith("state"):
            assert not any(d.startswith("tridentflow") for d in deps), module
        if module.startswith(("tridentflow.engines", "tridentflow.sources")):
            steps = {"tridentflow.runtime", "tridentflow.coordinator", "tridentflow.committer",
                     "tridentflow.emitter", "tridentflow.cli", "tridentflow.driver"}  # fmt: skip
            assert not deps & steps, (module, deps & steps)
    for path in [*(ROOT / "state").rglob("*.py"), *(ROOT / "spark_jobs").rglob("*.py"),
                 *(ROOT / "tridentflow").rglob("*.py")]:  # fmt: skip
        text = path.read_text()
        assert "import airflow" not in text and "from airflow" not in text, path
        if path.is_relative_to(ROOT / "state"):
            assert "pyspark" not in text, path


def test_every_user_facing_class_is_importable_from_the_package():
    """What a pipeline is written with - every source spec, built-in aggregator, aggregator
    base and static state - comes from ``tridentflow`` itself (a class added to one of those
    modules and forgotten in ``__init__`` fails here)."""
    import inspect

    import tridentflow
    from tridentflow import aggregators, static_state
    from tridentflow.sources import specs

    public = set(tridentflow.__all__)
    agg_bases = (
        aggregators.Combiner,
        aggregators.Reducer,
        aggregators.Aggregator,
        aggregators.StateUpdater,
    )
    modules = [(specs, specs.LogSource), (aggregators, agg_bases), (static_state, object)]
    wanted = {
        name
        for module, base in modules
        for name, cls in vars(module).items()
        if inspect.isclass(cls)
        and cls.__module__ == module.__name__
        and issubclass(cls, base)
        and not name.startswith(("_", "Guarded", "Function"))
        and cls.__doc__
    }
    wanted -= {"StaticQuery", "StaticState"}  # internal nodes of the graph, not user API
    assert {"LogSource", "RedisStreamSource", "Count", "RedisHashLookup"} <= wanted
    assert wanted <= public, sorted(wanted - public)
    for name in public:
        assert getattr(tridentflow, name) is not None
