"""The package layout: no import circle among tridentflow's and state's modules (imports inside
functions included), and the dependency direction the guide fixes."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT

PACKAGES = {"tridentflow": "tridentflow", "state": "tridentflow_state"}
"""The repo's folders and the names they are imported (and installed) as."""


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    parts[0] = PACKAGES.get(parts[0], parts[0])
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
        module_name(p): first_party_imports(p, modules) - {module_name(p)} - set(PACKAGES.values())
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


LAYERS = {
    "tridentflow_state": 0,
    "tridentflow.sources": 1,  # source logs and their specifications
    "tridentflow.sinks": 1,  # the stores new-values streams are exported to
    "tridentflow": 1,  # the user API and what it is made of: pipeline, nodes, plan, ...
    "tridentflow.examples": 1,  # the bundled pipelines: written with the user API only
    "tridentflow.engines": 2,
    "tridentflow.steps": 3,
    "tridentflow.steps.staging": 3,  # one staging interface, two places (Redis, files)
    "tridentflow.ops": 4,
    "tridentflow.devtools": 4,  # development servers, the chaos harness (the CLI's dev-*)
    "tridentflow.devtools.chaos": 4,  # the chaos harness, in rooms (drive, operators, sinks...)
    "tridentflow.testing": 4,  # the harness users test their pipelines with (no server)
}
"""Each module's layer (its longest matching package); an import may only run downwards or
sideways: ops -> steps -> engines -> sources / the API -> state."""


def layer(module: str) -> int:
    best = max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len)
    return LAYERS[best]


def wrong_way(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(module, import) pairs where a lower layer imports a higher one (the package facade
    ``tridentflow/__init__`` aside: it re-exports the user API)."""
    return sorted(
        (module, dep)
        for module, deps in graph.items()
        for dep in deps
        if module != "tridentflow" and layer(dep) > layer(module)
    )


def test_dependency_direction():
    """No import runs upwards (ops -> steps -> engines -> sources / API -> state); state/ and
    spark_jobs/ import no Airflow, state/ no Spark, tridentflow/ no Airflow."""
    graph = import_graph()
    assert {"tridentflow.steps.committer", "tridentflow.ops.cli"} <= graph.keys()
    assert not wrong_way(graph), wrong_way(graph)
    for path in [*(ROOT / "state").rglob("*.py"), *(ROOT / "spark_jobs").rglob("*.py"),
                 *(ROOT / "tridentflow").rglob("*.py")]:  # fmt: skip
        text = path.read_text()
        assert "import airflow" not in text and "from airflow" not in text, path
        if path.is_relative_to(ROOT / "state"):
            assert "pyspark" not in text, path


def test_the_direction_check_finds_an_import_running_upwards():
    graph = {
        "tridentflow.engines.local": {"tridentflow.steps.runtime"},  # engine -> step: wrong
        "tridentflow.steps.runtime": {"tridentflow.sources.filelog", "tridentflow_state.ledger"},
        "tridentflow_state.ledger": {"tridentflow.ops.cli"},  # state -> tool: wrong
        "tridentflow": {"tridentflow.ops.status"},  # the facade may
    }
    assert wrong_way(graph) == [
        ("tridentflow.engines.local", "tridentflow.steps.runtime"),
        ("tridentflow_state.ledger", "tridentflow.ops.cli"),
    ]


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


SHIPPED = ["tridentflow", "state", "spark_jobs", "plugins"]
"""The folders whose code ships (tests and benchmarks may patch what they test)."""


def module_globals_set_from_outside(source: str) -> list[str]:
    """``module.NAME = ...`` assignments in ``source`` (NAME in capitals: a setting), each as
    ``module.NAME``: a value set at run time that every user of that module then sees."""
    found = []
    for node in ast.walk(ast.parse(source)):
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            if (
                isinstance(target, ast.Attribute)
                and isinstance(target.value, ast.Name)
                and target.attr.isupper()
                and target.value.id not in ("self", "cls")
            ):
                found.append(f"{target.value.id}.{target.attr}")
    return found


def test_no_setting_is_a_module_global_assigned_from_outside():
    """What a step needs travels with it (a Runtime, an ExportContext): no shipped module sets
    another's capitalised global at run time, so two pipelines in one process (the view, a
    test) cannot see each other's settings (issue 39: kafka.CONFIG_RESOLVER,
    postgres.CONNECTION_RESOLVER and committer.IN_REDIS were)."""
    offenders = {
        str(path.relative_to(ROOT)): found
        for folder in SHIPPED
        for path in (ROOT / folder).rglob("*.py")
        if (found := module_globals_set_from_outside(path.read_text()))
    }
    assert not offenders, offenders


def test_the_global_setting_check_finds_one():
    planted = "from tridentflow.sources import kafka\n\ndef f():\n    kafka.CONFIG_RESOLVER = g\n"
    assert module_globals_set_from_outside(planted) == ["kafka.CONFIG_RESOLVER"]
    assert module_globals_set_from_outside("self.LIMIT = 3\nx.limit = 2\n") == []


def source_classes() -> set[str]:
    """The classes tridentflow/sources/ defines (the built-in specs and logs) - not the
    capability Protocols, which ask what a log can do, not which one it is."""
    return {
        node.name
        for path in (ROOT / "tridentflow" / "sources").glob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
        and "Protocol" not in {getattr(base, "id", None) for base in node.bases}
    }


def isinstance_on(source: str, names: set[str]) -> list[str]:
    """Names of ``names`` that an ``isinstance`` call in ``source`` tests against."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance":
            kinds = node.args[1] if len(node.args) == 2 else None
            for kind in kinds.elts if isinstance(kinds, ast.Tuple) else [kinds]:
                name = getattr(kind, "id", None) or getattr(kind, "attr", None)
                if name in names:
                    found.append(name)
    return found


def test_no_code_outside_sources_asks_which_source_a_pipeline_has():
    """Sources plug in (issue 39): outside tridentflow/sources/, nothing tests a pipeline's
    source or log against a built-in class - it asks the spec (``open_log``) and the log's
    declared capabilities instead."""
    names = source_classes() - {"LogScan", "SourceContext", "ChaosTraits", "SourceMode"}
    assert {"FileLog", "KafkaLog", "RedisStreamLog", "KafkaSource", "CustomSource"} <= names
    assert not {"Trims", "Produces", "SourceLog"} & names  # capabilities may be asked
    offenders = {
        str(path.relative_to(ROOT)): found
        for folder in SHIPPED
        for path in (ROOT / folder).rglob("*.py")
        if not path.is_relative_to(ROOT / "tridentflow" / "sources")
        if (found := isinstance_on(path.read_text(), names))
    }
    assert not offenders, offenders
    planted = "def f(rt):\n    return isinstance(rt.log, (FileLog, specs.KafkaSource))\n"
    assert isinstance_on(planted, names) == ["FileLog", "KafkaSource"]


def test_the_architecture_page_lists_every_module():
    """docs/architecture.md names every module of the shipped folders (``name.py``, or with
    its folder), and the
    layering test places every package of tridentflow/."""
    page = (ROOT / "docs" / "architecture.md").read_text()
    unnamed = [
        str(path.relative_to(ROOT))
        for folder in SHIPPED
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path.name != "__init__.py" and f"{path.name}`" not in page  # `x.py` or `dir/x.py`
    ]
    assert not unnamed, f"docs/architecture.md does not name: {unnamed}"
    packages = {
        module_name(path.parent / "__init__.py")
        for path in (ROOT / "tridentflow").rglob("__init__.py")
    }
    assert packages <= set(LAYERS), packages - set(LAYERS)


REDIS_CLIENTS = {"Redis", "RedisCluster", "StrictRedis"}


def redis_clients_with_the_default_timeout(source: str) -> list[int]:
    """The lines of ``source`` that make a redis-py client (``Redis(...)``,
    ``Redis.from_url(...)``, the cluster's) without saying ``socket_timeout`` (nor passing
    ``**options`` that may)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "from_url":
            func = func.value
        name = getattr(func, "attr", None) or getattr(func, "id", None)
        if name not in REDIS_CLIENTS:
            continue
        said = {kw.arg for kw in node.keywords}
        if "socket_timeout" not in said and None not in said:
            found.append(node.lineno)
    return found


def test_every_redis_client_says_how_long_it_waits_for_a_reply():
    """redis-py 8 gives up on a reply after 5 s by default, and a FLUSHALL, a SHUTDOWN that
    saves, a commit script or a SCAN over millions of keys can take longer: the 8M-key staging
    benchmark died on its own FLUSHALL (2026-11-26). Every client the project makes - shipped
    code, dev tools and benchmarks - states its read timeout (or goes through
    ``redisconn.CLIENT_OPTIONS``)."""
    offenders = {
        str(path.relative_to(ROOT)): lines
        for folder in [*SHIPPED, "benchmarks", "dags"]
        for path in (ROOT / folder).rglob("*.py")
        if (lines := redis_clients_with_the_default_timeout(path.read_text()))
    }
    assert not offenders, offenders


def test_the_timeout_check_finds_a_client_with_the_default():
    planted = (
        "import redis\n"
        "a = redis.Redis.from_url(url)\n"
        "b = redis.Redis(port=1, socket_connect_timeout=0.5)\n"
        "c = RedisCluster.from_url(url, socket_timeout=None)\n"
        "d = redis.Redis.from_url(url, **OPTIONS)\n"
    )
    assert redis_clients_with_the_default_timeout(planted) == [2, 3]


def test_every_redis_key_is_named_in_state_keys():
    """No module builds a Redis key from a KeySpace name with an f-string of its own (``f"{ks.
    base}:x"``): every key is a named, documented member of tridentflow_state.keys.KeySpace,
    where ACL patterns, resets and reshards find them all."""
    import inspect
    import re

    from tridentflow_state.keys import KeySpace

    members = inspect.getmembers(KeySpace)
    properties = "|".join(sorted(n for n, v in members if isinstance(v, property)))
    methods = "|".join(sorted(n for n, v in members
                              if inspect.isfunction(v) and not n.startswith("_")))  # fmt: skip
    built = re.compile(rf"\{{[A-Za-z_][\w.]*\.(({properties})|({methods})\([^)]*\))\}}:")
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for folder in SHIPPED
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path != ROOT / "state" / "keys.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if built.search(line)
    ]
    assert not found, found


def protocol_gaps(protocol: type, implementation: type) -> list[str]:
    """The methods of ``protocol`` that ``implementation`` lacks or takes other parameters
    for (names and kinds; annotations aside)."""
    import inspect

    gaps = []
    for name, member in vars(protocol).items():
        if name.startswith("_") or not callable(member):
            continue
        theirs = getattr(implementation, name, None)
        if theirs is None:
            gaps.append(f"{implementation.__name__}.{name} is missing")
            continue
        want = [(p.name, p.kind) for p in inspect.signature(member).parameters.values()]
        have = [(p.name, p.kind) for p in inspect.signature(theirs).parameters.values()]
        if want != have:
            gaps.append(f"{implementation.__name__}.{name}{inspect.signature(theirs)}")
    return gaps


def test_both_staging_places_answer_one_interface():
    """Issue 67: the Redis and file staging are ``StagingArea``s, method for method, their
    batches are ``StagedBatch``es with nothing abstract left, only the Redis one is
    ``InBlocks``; the package holds no ``assert`` standing in for a type."""
    import inspect

    from tridentflow.steps import staging

    areas = (staging.FileStagingArea, staging.RedisStagingArea)
    assert all(issubclass(a, staging.StagingArea) and not inspect.isabstract(a) for a in areas)
    assert [gap for area in areas for gap in protocol_gaps(staging.StagingArea, area)] == []
    for batch in (staging.FileStagedBatch, staging.RedisStagedBatch):
        assert issubclass(batch, staging.StagedBatch) and not inspect.isabstract(batch)
    assert protocol_gaps(staging.InBlocks, staging.RedisStagedBatch) == []
    assert not hasattr(staging.FileStagedBatch, "blocks")
    asserts = [
        f"{path.name}:{node.lineno}"
        for path in sorted((ROOT / "tridentflow" / "steps" / "staging").glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Assert)
    ]
    assert asserts == []


def test_the_interface_check_finds_a_method_that_differs():
    from tridentflow.steps import staging

    class Partial:
        def load(self, txid, attempts):  # another parameter name
            return None

    gaps = protocol_gaps(staging.StagingArea, Partial)
    assert "Partial.load(self, txid, attempts)" in gaps and "Partial.write is missing" in gaps


def probes_of_a_sink(source: str) -> list[int]:
    """Lines of ``source`` that ask a sink for a capability by name (``hasattr(sink, ...)``,
    ``getattr(feed.sink, "...", default)``) instead of an ``isinstance`` of a Protocol."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("hasattr", "getattr")
            and node.args
            and "sink" in ast.unparse(node.args[0]).lower()
            and (node.func.id == "hasattr" or len(node.args) == 3)
        ):
            lines.append(node.lineno)
    return lines


def test_sinks_declare_their_optional_capabilities_as_protocols():
    """Issue 67: outside tridentflow/sinks/ no code probes a sink with hasattr/getattr; the
    lakehouse sinks satisfy the Protocols they are found by, method for method."""
    from tridentflow.sinks.base import CarriesBack, MaintainsTable
    from tridentflow.sinks.delta import DeltaSink
    from tridentflow.sinks.iceberg import IcebergSink
    from tridentflow.sinks.postgres import PostgresSink

    probes = [
        f"{path.relative_to(ROOT)}:{line}"
        for folder in SHIPPED
        for path in sorted((ROOT / folder).rglob("*.py"))
        if "sinks" not in path.relative_to(ROOT).parts[:2]
        for line in probes_of_a_sink(path.read_text())
    ]
    assert probes == []
    for sink in (DeltaSink, IcebergSink):
        assert protocol_gaps(CarriesBack, sink) == protocol_gaps(MaintainsTable, sink) == []
    assert not issubclass(PostgresSink, CarriesBack | MaintainsTable)


def test_the_sink_probe_check_finds_one():
    source = 'ok = hasattr(feed.sink, "vacuum")\nrewind = getattr(sink, "rewind_to", None)\n'
    assert probes_of_a_sink(source) == [1, 2]
    assert probes_of_a_sink('name = getattr(sink, "name")\n') == []


ERRORS_ELSEWHERE = {
    "tridentflow/faults.py": {"InjectedFaultError", "SimulatedCrash"},  # stand for foreign ones
    "plugins/tridentflow_airflow/view.py": {"NotConfiguredHTTPError"},  # an HTTP answer
}
"""Exception classes defined outside a package's errors.py, on purpose."""


def exception_classes(source: str) -> list[str]:
    """The public classes of ``source`` that derive from a name ending in Error, Exception
    or BaseException (private control-flow ones, ``_Name``, aside)."""
    return [
        node.name
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ClassDef)
        and not node.name.startswith("_")
        and any(ast.unparse(b).endswith(("Error", "Exception")) for b in node.bases)
    ]


def test_errors_live_in_one_place_per_package_and_end_in_error():
    """Issue 67: every exception class of the shipped code is defined in its package's
    errors.py (tridentflow, the state layer, the Airflow integration) and named ...Error."""
    elsewhere, misnamed = [], []
    for folder in SHIPPED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            where = str(path.relative_to(ROOT))
            for name in exception_classes(path.read_text()):
                allowed = ERRORS_ELSEWHERE.get(where, set())
                if path.name != "errors.py" and name not in allowed:
                    elsewhere.append(f"{where}:{name}")
                if not name.endswith("Error") and name not in allowed:
                    misnamed.append(name)
    assert elsewhere == [] and misnamed == []


def test_the_error_check_finds_a_class_elsewhere():
    source = "class Refused(TridentflowError):\n    pass\nclass _Stop(Exception):\n    pass\n"
    assert exception_classes(source) == ["Refused"]


def test_the_in_memory_twins_answer_every_method_production_calls():
    """The family 'the harness's twin lacks what the production path calls' (the testing
    harness met MemoryExpiryIndex without build_if_empty once it ran the production commit):
    the in-memory backing map and expiry index have every public method of Redis's."""
    from tridentflow_state.backing import MemoryBackingMap, MemoryExpiryIndex
    from tridentflow_state.expiry import ShardedExpiryIndex
    from tridentflow_state.redis_backing import RedisBackingMap

    def public(cls: type) -> set[str]:
        return {n for n in dir(cls) if not n.startswith("_") and callable(getattr(cls, n))}

    assert public(RedisBackingMap) - public(MemoryBackingMap) == set()
    assert public(ShardedExpiryIndex) - public(MemoryExpiryIndex) == set()
