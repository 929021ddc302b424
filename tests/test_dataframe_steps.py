"""DataFrame and SQL steps (Stream.spark, Stream.sql): typed fields checked when a pipeline is
built, Spark's own aggregation where it is exact, the guarantee enforced from Spark's plan,
and the same counts as an independent recount under replays, crashes and aborts.

The tests without the ``spark`` mark start no JVM (the fast lane runs them)."""

from __future__ import annotations

from collections import Counter

import pytest

from tridentflow import Count, LogSource, Max, Mean, Min, Pipeline, StateKind, StateSpec, Sum
from tridentflow.engines.determinism import _called, _shape
from tridentflow.engines.local import LocalEngine
from tridentflow.errors import DataFrameStepError, PipelineError
from tridentflow.plan import compile_pipeline
from tridentflow.schemas import parse_schema
from tridentflow.sources.specs import SourceMode
from tridentflow.testing import ABORT, CollectSink, TestingError, run_batches


def words(df):
    from pyspark.sql import functions as F

    return df.select(F.explode(F.split("sentence", " ")).alias("word"))


def wordcount(kind: StateKind = StateKind.TRANSACTIONAL, step=words, **source) -> Pipeline:
    pipeline = Pipeline("dfwc", LogSource(fields=("sentence",), schema="sentence string", **source))
    (
        pipeline.stream.spark(step, schema="word string")
        .group_by("word")
        .persistent_aggregate(StateSpec("counts", kind), Count(), out_field="count")
    )
    return pipeline


def recount(batches) -> dict[str, int]:
    return dict(
        Counter(w for batch in batches for s in batch if s is not ABORT for w in s.split(" "))
    )


# -- without a JVM --------------------------------------------------------------------------


def test_schema_ddl_parses_without_a_jvm():
    schema = parse_schema(
        "word string, n bigint, `odd name` array<struct<a:int,b:map<string,double>>>"
    )
    assert schema.names == ("word", "n", "odd name")
    assert (
        schema.ddl()
        == "word string, n bigint, `odd name` array<struct<a:int,b:map<string,double>>>"
    )
    assert parse_schema("a LONG, b Integer, c varchar(3), d decimal(9,2)").ddl() == (
        "a bigint, b int, c string, d decimal(9,2)"
    )
    for bad, why in [
        ("", "no fields"),
        ("a strin", "unknown type"),
        ("a int b int", "expected ','"),
        ("a int, a string", "repeats"),
        ("a array<int", "expected >"),
    ]:
        with pytest.raises(PipelineError, match=why):
            parse_schema(bad)


def test_a_source_schema_names_every_field_and_only_json_types():
    with pytest.raises(PipelineError, match=r"no type for \['n'\]"):
        LogSource(fields=("s", "n"), schema="s string")
    with pytest.raises(PipelineError, match="cannot come from a JSON record"):
        LogSource(fields=("d",), schema="d date")
    source = LogSource(fields=("s", "n"), schema="n bigint, s string", position_field="pos")
    assert source.stream_schema.ddl() == "s string, n bigint, pos bigint"


def test_steps_are_checked_when_the_pipeline_is_built():
    untyped = Pipeline("p", LogSource(fields=("sentence",)))
    with pytest.raises(PipelineError, match="types of the stream's fields"):
        untyped.stream.spark(words, schema="word string")
    with pytest.raises(PipelineError, match="needs schema="):
        Pipeline("p", LogSource(fields=("s",), schema="s string")).stream.spark(words, None)
    with pytest.raises(PipelineError, match="reads no view named batch"):
        Pipeline("p", LogSource(fields=("s",), schema="s string")).stream.sql("SELECT 1", "a int")
    typed = Pipeline("p", LogSource(fields=("s",), schema="s string"))
    step = typed.stream.spark(words, schema="word string, d date, n string")
    with pytest.raises(PipelineError, match="no field"):
        step.group_by("nope").persistent_aggregate(StateSpec("c"), Count())
    with pytest.raises(PipelineError, match="field d of spark\\(words\\) is date"):
        step.group_by("d").persistent_aggregate(StateSpec("c"), Count())
    with pytest.raises(PipelineError, match="Sum\\(n\\) needs a number"):
        step.group_by("word").persistent_aggregate(StateSpec("c"), Sum(), in_fields="n")
    # input_schema types a stream the source did not: after a Python step
    each = untyped.stream.each("sentence", lambda s: [(len(s),)], "n")
    with pytest.raises(PipelineError, match="input_schema names"):
        each.spark(words, schema="word string", input_schema="n bigint")
    each.spark(words, schema="word string", input_schema="sentence string, n bigint")


def test_the_local_engine_refuses_a_dataframe_step_in_one_line():
    pipeline = wordcount()
    with pytest.raises(
        PipelineError, match=r"spark\(words\): a DataFrame or SQL step runs on Spark only"
    ):
        LocalEngine().compute(compile_pipeline(pipeline), "/nonexistent", {0: (0, 0)})
    with pytest.raises(PipelineError, match="runs on Spark only"):
        run_batches(pipeline, [["a"]])


def test_the_plans_text_names_what_is_non_deterministic():
    assert _called("Project [w#0, rand(-74) AS r#2]") == "rand(-74) is non-deterministic"
    assert _called("Project [rand(1)#5 AS x#6]") is None  # an attribute named after a call
    assert _called("Project [operand(w#1) AS x#2, brand#3]") is None
    assert "current_timestamp()" in _called("Project [current_timestamp() AS t#1]")
    limit = "GlobalLimit 1\n+- LocalLimit 1\n   +- Project [w#0]\n      +- LogicalRDD [w#0]"
    assert "limit without an order" in _shape(limit)
    ordered = "GlobalLimit 1\n+- LocalLimit 1\n   +- Sort [w#0 ASC]\n      +- LogicalRDD [w#0]"
    assert _shape(ordered) is None
    rr = "Window [row_number()]\n+- Repartition 3, true\n   +- LogicalRDD [w#0]"
    assert "round robin" in _shape(rr)
    assert _shape("Aggregate [w#0]\n+- Repartition 3, true\n   +- LogicalRDD [w#0]") is None
    assert "sample" in _shape("Sample 0.0, 0.5, false, 42\n+- LogicalRDD [w#0]")


# -- on Spark -------------------------------------------------------------------------------

BATCHES = [["a b", "b"], ["b c", "c c a"], ["d"]]


@pytest.mark.spark
def test_a_dataframe_word_count_is_exact_under_replays_crashes_and_aborts(spark):
    batches = [["a b", "b", ABORT, "e"], ["b c", "c c a"], ["d"]]
    for kind in (StateKind.TRANSACTIONAL, StateKind.OPAQUE):
        states = run_batches(
            wordcount(kind), batches, replay=[1, 2], crash_mid_commit=[2, 3], spark=spark
        )
        assert states["counts"] == recount(batches), kind


@pytest.mark.spark
def test_sql_steps_aggregate_with_spark_and_python_alike(spark):
    """Count, Sum, Mean, Min, Max after a SQL step (Spark's groupBy) equal the same pipeline
    written with Python functions (the graph), state by state."""
    source = LogSource(fields=("user", "n"), schema="user string, n bigint")
    records = [[{"user": u, "n": n} for u, n in [("x", 3), ("y", -2), ("x", 10**15)]],
               [{"user": "y", "n": 7}, {"user": "z", "n": 0}]]  # fmt: skip
    aggs = {"c": (Count(), ()), "s": (Sum(), "n"), "m": (Mean(), "n"), "lo": (Min(), "n"),
            "hi": (Max(), "n")}  # fmt: skip

    def build(step) -> Pipeline:
        pipeline = Pipeline("sq", source)
        stream = step(pipeline.stream)
        for name, (agg, arg) in aggs.items():
            stream.group_by("user").persistent_aggregate(StateSpec(name), agg, in_fields=arg)
        return pipeline

    query = "WITH b AS (SELECT * FROM batch) SELECT user, n * 2 AS n FROM b WHERE user <> 'q'"
    with_sql = run_batches(
        build(lambda s: s.sql(query, schema="user string, n bigint")), records, spark=spark
    )
    with_python = run_batches(build(lambda s: s.map(lambda u, n: (u, n * 2))), records)
    for name in aggs:
        assert with_sql[name] == with_python[name], name
    assert with_sql["s"] == {"x": 2 * (3 + 10**15), "y": 10, "z": 0}
    # sums past bigint, and values at its edges, exact (Spark sums each value's two halves)
    edges = [2**63 - 1, 2**63 - 1, -(2**63), -1, 2**32, 2**32 - 1, -(2**32), 2**31, -(2**31) - 1]
    wide = [[{"user": "w", "n": n} for n in edges], [{"user": "w", "n": 2**63 - 1}]]
    as_sql = build(lambda s: s.sql("SELECT * FROM batch", schema="user string, n bigint"))
    same = run_batches(as_sql, wide, spark=spark)
    assert same["s"] == {"w": sum(edges) + 2**63 - 1} == run_batches(build(lambda s: s), wide)["s"]
    assert same["m"] == run_batches(build(lambda s: s), wide)["m"]


@pytest.mark.spark
def test_steps_mix_with_python_functions_and_keep_keys_exact(spark):
    """A DataFrame step, then Python functions, then another step; double keys (0.0 and -0.0
    are two keys here, one in Spark's groupBy) and None keys go through the graph."""
    from pyspark.sql import functions as F

    pipeline = Pipeline("mix", LogSource(fields=("v",), schema="v double"))
    doubled = pipeline.stream.spark(lambda df: df.select((F.col("v") * 2).alias("v")), "v double")
    sink = CollectSink()
    doubled.group_by("v").persistent_aggregate(
        StateSpec("by_value"), Count(), out_field="n"
    ).new_values_stream().sink(sink)
    (
        doubled.each("v", lambda v: [("neg" if v is not None and v < 0 else None,)], "sign")
        .spark(
            lambda df: df.groupBy("sign").count(),
            "sign string, count bigint",
            input_schema="v double, sign string",
        )
        .group_by("sign")
        .persistent_aggregate(StateSpec("signs"), Sum(), in_fields="count")
    )
    batches = [[{"v": 0.0}, {"v": -0.0}, {"v": -1.5}, {"v": None}], [{"v": 0.0}]]
    states = run_batches(pipeline, batches, replay=[2], spark=spark)
    last = {(repr(v),): n for v, n in sink.rows()}  # repr: 0.0 and -0.0 apart
    assert last == {("0.0",): 2, ("-0.0",): 1, ("-3.0",): 1, ("None",): 1}  # two zero keys
    assert states["signs"] == {"neg": 1, None: 4}


@pytest.mark.spark
def test_a_record_that_does_not_fit_its_type_is_quarantined(spark):
    source = LogSource(fields=("user", "n"), schema="user string, n int")
    pipeline = Pipeline("typed", source)
    pipeline.stream.sql("SELECT user, n FROM batch", "user string, n int").group_by(
        "user"
    ).persistent_aggregate(StateSpec("s"), Sum(), in_fields="n")
    batch = [{"user": "a", "n": 1}, {"user": "a", "n": "2"}, {"user": "a", "n": 2**40},
             {"user": 5, "n": 1}, {"user": "a", "n": 4}]  # fmt: skip
    states = run_batches(pipeline, [batch], on_bad="quarantine", spark=spark)
    assert states["s"] == {"a": 5}
    errors = [q["error"] for q in states.quarantined]
    assert len(errors) == 3 and "field n is declared int, got '2'" in errors[0]


@pytest.mark.spark
def test_a_transactional_state_over_a_non_deterministic_step_is_refused(spark):
    """Refused at emit before any write, naming the expression; an opaque state takes it."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    jitter = F.udf(lambda w: w, StringType()).asNondeterministic()
    stable = F.udf(lambda w: w.upper(), StringType())
    cases = {
        "rand(": lambda df: words(df).where(F.rand() < 2),
        "uuid(": lambda df: words(df).withColumn(
            "word", F.concat("word", F.expr("left(uuid(), 0)"))
        ),
        "current_timestamp()": lambda df: words(df).where(F.current_timestamp().isNotNull()),
        "limit without an order": lambda df: words(df).limit(1000),
        "UDF <lambda>": lambda df: words(df).select(jitter("word").alias("word")),
        "sample": lambda df: words(df).sample(fraction=1.0, seed=1),
    }
    for expected, step in cases.items():
        with pytest.raises(DataFrameStepError, match="feeds transactional state counts") as err:
            run_batches(wordcount(step=step), BATCHES, spark=spark)
        assert expected in str(err.value) and "StateKind.OPAQUE" in str(err.value), expected
        assert "\n" not in str(err.value)
    opaque = run_batches(wordcount(StateKind.OPAQUE, step=cases["rand("]), BATCHES, spark=spark)
    assert opaque["counts"] == recount(BATCHES)
    ordered = lambda df: words(df).orderBy("word").limit(1000)  # noqa: E731
    upper = lambda df: words(df).select(stable("word").alias("word"))  # noqa: E731
    assert run_batches(wordcount(step=ordered), BATCHES, spark=spark)["counts"] == recount(BATCHES)
    assert run_batches(wordcount(step=upper), BATCHES, spark=spark)["counts"] == {
        k.upper(): v for k, v in recount(BATCHES).items()
    }

    @F.pandas_udf("string")
    def doubled(words):  # a pandas UDF runs as Spark runs it, in Arrow batches
        return words + words

    twice = lambda df: words(df).select(doubled("word").alias("word"))  # noqa: E731
    assert run_batches(wordcount(step=twice), BATCHES, spark=spark)["counts"] == {
        k * 2: v for k, v in recount(BATCHES).items()
    }


@pytest.mark.spark
def test_a_step_that_breaks_its_schema_fails_in_one_line(spark):
    from pyspark.sql import functions as F

    cases = {
        "no word, which its schema declares": lambda df: df,
        "column word is int, its schema declares string": lambda df: df.select(
            F.length("sentence").alias("word")
        ),
        "returned list, not a DataFrame": lambda df: [df],
    }
    for expected, step in cases.items():
        with pytest.raises(DataFrameStepError, match=expected):
            run_batches(wordcount(step=step), BATCHES, spark=spark)
    with pytest.raises(DataFrameStepError, match=r"sql step: .*nope"):
        pipeline = Pipeline("bad", LogSource(fields=("s",), schema="s string"))
        pipeline.stream.sql("SELECT nope FROM batch", "nope string").group_by(
            "nope"
        ).persistent_aggregate(StateSpec("c"), Count())
        run_batches(pipeline, [["x"]], spark=spark)


@pytest.mark.spark
def test_a_null_summed_by_spark_fails_as_python_sum_does(spark):
    pipeline = Pipeline("nulls", LogSource(fields=("k", "n"), schema="k string, n bigint"))
    pipeline.stream.sql("SELECT k, n FROM batch", "k string, n bigint").group_by(
        "k"
    ).persistent_aggregate(StateSpec("s"), Sum(), in_fields="n")
    with pytest.raises(Exception, match="Sum\\(n\\) got null in 1 row"):
        run_batches(pipeline, [[{"k": "a", "n": None}, {"k": "a", "n": 1}]], spark=spark)


@pytest.mark.spark
def test_testing_refuses_state_queries_on_spark(spark):
    pipeline = wordcount()
    other = Pipeline("q", LogSource(fields=("word",)))
    other.stream.state_query(pipeline.state("counts"), "word", "n").group_by(
        "word"
    ).persistent_aggregate(StateSpec("c", StateKind.OPAQUE), Count())
    with pytest.raises(TestingError, match="state_query"):
        run_batches(other, [["a"]], spark=spark)


@pytest.mark.spark
def test_dataframe_steps_over_spark_connect(connect_url):
    """Over Connect: the word count, a SQL step, and the refusals decided from the plan."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    from tridentflow.engines.spark import spark_session

    session = spark_session(remote=connect_url)
    try:
        states = run_batches(wordcount(), BATCHES, replay=[1], crash_mid_commit=[2], spark=session)
        assert states["counts"] == recount(BATCHES)
        jitter = F.udf(lambda w: w, StringType()).asNondeterministic()
        for expected, step in {
            "rand(": lambda df: words(df).where(F.rand() < 2),
            "the UDF <lambda> is declared non-deterministic": lambda df: words(df).select(
                jitter("word").alias("word")
            ),
            "limit without an order": lambda df: words(df).limit(5),
        }.items():
            with pytest.raises(DataFrameStepError, match="feeds transactional state") as err:
                run_batches(wordcount(step=step), BATCHES, spark=session)
            assert expected in str(err.value)
        pipeline = Pipeline("cq", LogSource(fields=("sentence",), schema="sentence string",
                                             mode=SourceMode.OPAQUE))  # fmt: skip
        pipeline.stream.sql(
            "SELECT word FROM batch LATERAL VIEW explode(split(sentence, ' ')) t AS word",
            "word string",
        ).group_by("word").persistent_aggregate(StateSpec("counts"), Count())
        assert run_batches(pipeline, BATCHES, spark=session)["counts"] == recount(BATCHES)
    finally:
        session.stop()


@pytest.mark.spark
def test_the_docs_pytest_example_passes_on_the_suites_session(spark):
    """docs/examples/test_my_dataframe_pipeline.py (shown in docs/pipelines.md), its tests
    called with the suite's SparkSession (one JVM for the suite)."""
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    example = root / "docs" / "examples" / "test_my_dataframe_pipeline.py"
    assert example.read_text() in (root / "docs" / "pipelines.md").read_text()
    spec = importlib.util.spec_from_file_location("test_my_dataframe_pipeline", example)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    tests = [getattr(module, n) for n in dir(module) if n.startswith("test_")]
    assert tests
    for test in tests:
        test(spark)


KILL_SENTENCES = [f"w{i % 7} w{i % 3} shared  w{i % 5}" for i in range(40)]  # a double space


@pytest.mark.soak  # six runs of a JVM each (~2 min); the suite has the chaos test below
@pytest.mark.spark
def test_a_dataframe_pipeline_killed_at_every_step_point_counts_each_word_once(tf):
    """`tridentflow run wordcount-df` on classic Spark, the process killed (SIGKILL) at each
    point of a txid's steps in turn - after the coordinator, in the emit, mid-commit, before
    the ledger, after the mark - each time resumed by the next run: every word counted once
    against an independent recount. (An attempt is counted per step: the emit
    after a kill after the coordinator is still the emit's first.)"""
    tf("produce", "wordcount-df", "-", input="\n".join(KILL_SENTENCES) + "\n")
    kills = ["after-coordinate@1", "in-emit@1", "mid-commit@1", "before-ledger@2", "after-mark@2#2"]
    for fault in kills:
        killed = tf("run", "wordcount-df", "--batch-size", "8", "--faults", f"{fault}=kill")
        assert killed.returncode in (-9, 137), (fault, killed.stderr[-2000:])
    done = tf("run", "wordcount-df", "--batch-size", "8")
    assert done.returncode == 0, done.stderr[-2000:]
    expected = Counter(w for s in KILL_SENTENCES for w in s.split())
    out = tf("query", "wordcount-df", *sorted(expected))
    assert out.stdout.splitlines() == [f"{w}\t{expected[w]}" for w in sorted(expected)]
    # audit re-counts on the local engine, which runs no DataFrame step: it says so
    assert tf("audit", "wordcount-df").stdout.strip() == "lost=0 doubled=0 unaudited=counts"


@pytest.mark.spark
def test_chaos_over_spark_connect_keeps_dataframe_and_sql_pipelines_exact(connect_url, tf):
    """The chaos harness (`tridentflow chaos --remote`) on the DataFrame and the SQL word count,
    and on the SQL word count of Parquet files (read in columns: engines.columnar): faults at
    every step (crashes, raises, a lost tuple), dark partitions, Redis restarts, clears,
    rewinds, duplicate commits and exports; every word counted once. (Seeds 1148-1150: one
    schedule of each pipeline, a crash and a Redis restart among them.)"""
    from tridentflow.devtools.chaos.files import FILES_DF_PIPELINE

    names = ("wordcount-df", "wordcount-sql", FILES_DF_PIPELINE)
    out = tf(
        "chaos", "--schedules", "3", "--seed", "1148", "--pipelines", ",".join(names),
        "--remote", connect_url, "--verbose", timeout=900,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = [line for line in out.stdout.splitlines() if line.startswith("seed=")]
    assert len(lines) == 3 and all(line.endswith("lost=0 doubled=0") for line in lines), lines
    assert {line.split()[1] for line in lines} == {f"pipeline={name}" for name in names}
    for event in ("=crash", "redis-restart", "rewind-to:", "dark:"):
        assert event in out.stdout, event


@pytest.mark.spark
def test_the_harness_catches_a_columnar_read_that_leaves_a_frozen_file_out(
    connect_url, monkeypatch
):
    """The family 'a txid's frozen files not all read', on the columnar path: planted, the
    read plans its file groups without the txid's last file. The Parquet word count's first
    schedule finds words missing (a count stored below the count produced)."""
    from tridentflow.devtools.chaos.drive import run_chaos
    from tridentflow.devtools.chaos.files import FILES_DF_PIPELINE
    from tridentflow.engines import columnar
    from tridentflow.engines.spark import SparkEngine, spark_session

    original = columnar.file_groups
    monkeypatch.setattr(columnar, "file_groups", lambda files, most: original(files[:-1], most))
    session = spark_session(remote=connect_url)
    try:
        (result,) = run_chaos(
            1, seed=1150, pipelines=(FILES_DF_PIPELINE,), engine=SparkEngine(session)
        )
    finally:
        session.stop()
    assert not result.ok, result.line()
    assert result.lost or "stored" in (result.difference or ""), result.line()  # words missing
