"""Sinks at their edges (issue 33): any failure of a sink lags it and never stops the commits;
names and values a store cannot take are refused in one line that says what to do; a sink of
several parts is judged part by part."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import psycopg
import pytest

from tests.helpers import produce
from tests.pipelines import FlakySink, summed
from tests.postgres import table_rows
from tridentflow import Count, LogSource, Pipeline, PostgresSink, RedisStreamSink, StateSpec
from tridentflow.engines.local import LocalEngine
from tridentflow.errors import PipelineError
from tridentflow.ops import metrics
from tridentflow.ops.cli import main
from tridentflow.ops.status import format_status, status
from tridentflow.sinks import SinkError
from tridentflow.steps.driver import backlog, run_batches
from tridentflow.steps.export import export, sink_status
from tridentflow.steps.query import list_state
from tridentflow.steps.runtime import Runtime

FLAKY = "tests.pipelines:flaky_sinked"
LINES = ["a b", "b c", "c d", "a a"]
FOREIGN = ["KeyError", "OverflowError", "RuntimeError", "ZeroDivisionError", "UnicodeError"]


def cli(redis_url: str, home: Path, *args: str) -> tuple[int, str]:
    out = io.StringIO()
    code = main([*args, "--redis-url", redis_url, "--home", str(home)], out)
    return code, out.getvalue()


def flaky_rows(rt: Runtime) -> dict[str, int]:
    raw = rt.client.hgetall(FlakySink().key(rt.pipeline.name))
    return {json.loads(k)[0]: json.loads(v) for k, v in raw.items() if k != b"__txid__"}


def counts(rt: Runtime) -> dict[str, int]:
    page = list_state(rt, rt.pipeline.states["counts"], limit=1000)
    return {key[0]: value for key, value in page.items}


# -- 1. a sink's failure never stops the commits ----------------------------------------------
@pytest.mark.parametrize("where", ["apply", "position", "close"])
@pytest.mark.parametrize("kind", FOREIGN)
def test_any_exception_of_a_sink_lags_it_and_the_commits_go_on(
    redis_url, redis_client, home, monkeypatch, capsys, kind, where
):
    """`run` commits every txid whatever the sink raises, says it in one line naming the
    sink, the txid and the cause, exits 1 naming the sink behind; status, the metrics and
    the next export (once the sink is healthy) agree."""
    rt = Runtime.open(FLAKY_PIPELINE(), redis_url, home)
    produce(rt, LINES)
    monkeypatch.setenv("TF_FLAKY_SINK", kind)
    monkeypatch.setenv("TF_FLAKY_AT", where)
    code, out = cli(redis_url, home, "run", FLAKY, "--engine", "local", "--batch-size", "1")
    err = capsys.readouterr().err
    assert backlog(rt) == 0 and rt.ledger.committed_txid() == 2, err  # the commits went on
    if where == "close":  # a sink failing to close exported fine: nothing behind
        assert code == 0 and err == "", err
        return
    assert code == 1, (out, err)
    (line,) = err.splitlines()  # said once, not once per txid, and no traceback
    assert line.startswith("sink flaky (flaky): txid 1 not applied, " if where == "apply"
                           else "sink flaky (flaky): "), line  # fmt: skip
    assert f"{kind}: the flaky sink's {where} failed" in line and "commits go on" in line
    assert out.splitlines()[-1].startswith("sink flaky is behind: sink flaky"), out
    info = status(rt)
    (sink,) = info["sinks"]
    assert (sink["position"], sink["lag"]) == (0, 2)
    assert sink["error"] == line
    assert f"  FAILING      {line}" in format_status(info)
    reopen = lambda: Runtime.open(FLAKY_PIPELINE(), redis_url, home)  # noqa: E731
    [collected] = metrics.collect([(rt.pipeline.name, reopen)])
    assert collected.sinks_failing == {"flaky": 1.0}
    assert b'tridentflow_sink_failing{pipeline="flaky-sinked",sink="flaky"} 1.0' in (
        metrics.prometheus_text([collected])
    )
    monkeypatch.delenv("TF_FLAKY_SINK")  # the sink is healthy again: it catches up
    code, out = cli(redis_url, home, "export", FLAKY)
    assert code == 0, capsys.readouterr().err
    assert flaky_rows(rt) == counts(rt)
    assert [s["error"] for s in sink_status(rt)] == [None]


def test_the_documented_mid_export_fault_lags_the_sink(redis_url, redis_client, home, capsys):
    rt = Runtime.open(FLAKY_PIPELINE(), redis_url, home)
    produce(rt, LINES)
    args = ("run", FLAKY, "--engine", "local", "--batch-size", "1")
    code, _ = cli(redis_url, home, *args, "--faults", "mid-export@2=raise")
    err = capsys.readouterr().err
    assert code == 1 and backlog(rt) == 0 and rt.ledger.committed_txid() == 2
    assert "txid 2 not applied, InjectedFaultError: injected fault mid-export@2" in err
    assert len(err.splitlines()) == 1
    assert cli(redis_url, home, *args)[0] == 0  # no fault: the sink catches up
    assert flaky_rows(rt) == counts(rt)


def FLAKY_PIPELINE() -> Pipeline:  # the pipeline the CLI loads as FLAKY
    from tests.pipelines import flaky_sinked

    return flaky_sinked()


# -- 2. names and values a store may not take ---------------------------------------------------
def _pipeline_with(sink, name: str = "named") -> Pipeline:
    p = Pipeline(name, LogSource(fields=("line",)))
    words = p.stream.each("line", lambda line: ((w,) for w in line.split()), "Word")
    state = words.group_by("Word").persistent_aggregate(StateSpec("c"), Count(), out_field="N")
    state.new_values_stream().sink(sink)
    return p


@pytest.mark.parametrize(
    "table",
    ["MixedCase", "with space", 'quo"te', ("My Schema", "Dotted.Name"), "Upper.Lower"],
)
def test_names_postgresql_must_quote_are_created_and_found(
    redis_url, redis_client, home, pg_dsn, table
):
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for schema in ("My Schema", "Upper"):
            conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
    sink = PostgresSink(table, dsn=pg_dsn, progress_table="Progress Of Sinks")
    rt = Runtime.open(_pipeline_with(sink), redis_url, home)
    for lines in (["a b"], ["b c", "c"]):  # the second txid finds the table it created
        produce(rt, lines)
        run_batches(rt, LocalEngine())
        export(rt)
    parts = table if isinstance(table, tuple) else tuple(table.split("."))
    quoted = ".".join('"' + p.replace('"', '""') + '"' for p in parts)
    with psycopg.connect(pg_dsn) as conn:
        got = dict(conn.execute(f'SELECT "Word", "N" FROM {quoted}').fetchall())
    assert got == {"a": 1, "b": 2, "c": 2}


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda: PostgresSink("x" * 64), "longer than PostgreSQL's 63 bytes"),
        (lambda: PostgresSink("a.b.c"), "is not NAME or SCHEMA.NAME"),
        (lambda: PostgresSink(""), "must be a non-empty string"),
        (lambda: PostgresSink("bad\x00name"), "holds a NUL character"),
        (lambda: PostgresSink("tridentflow_stage_upsert"), "tridentflow's staging tables"),
        (lambda: PostgresSink("t", progress_table="p" * 70), "progress_table"),
        (lambda: PostgresSink("t", columns={"N": "bigint; DROP TABLE t"}), "not a SQL type"),
        (lambda: RedisStreamSink(""), "non-empty key"),
        (lambda: RedisStreamSink("tf:{named}:ledger"), "tridentflow's own keys"),
        (lambda: RedisStreamSink("s:tridentflow-sink"), "companion hashes"),
    ],
)
def test_identifiers_a_store_cannot_take_are_refused_at_build_time(make, needle):
    with pytest.raises(ValueError, match=needle) as refused:
        make()
    assert "\n" not in str(refused.value)


def test_a_column_name_postgresql_would_cut_is_refused_when_bound():
    p = Pipeline("long", LogSource(fields=("line",)))
    words = p.stream.each("line", lambda line: ((w,) for w in line.split()), "w" * 64)
    state = words.group_by("w" * 64).persistent_aggregate(StateSpec("c"), Count())
    with pytest.raises(PipelineError, match=r"column 'w+'\.\.\. is longer than PostgreSQL's"):
        state.new_values_stream().sink(PostgresSink("t"))


@pytest.mark.parametrize(
    "second",
    [
        lambda dsn: PostgresSink("same", dsn=dsn, name="other"),
        lambda dsn: RedisStreamSink("out", name="other"),
    ],
)
def test_two_sinks_of_one_target_are_refused(second):
    dsn = "postgresql://u:secret@h/db"
    first = PostgresSink("same", dsn=dsn) if "Postgres" in repr(second(dsn)) else (
        RedisStreamSink("out"))  # fmt: skip
    p = Pipeline("two", LogSource(fields=("line",)))
    state = (
        p.stream.each("line", lambda line: ((w,) for w in line.split()), "w")
        .group_by("w")
        .persistent_aggregate(StateSpec("c"), Count())
    )
    state.new_values_stream().sink(first)
    with pytest.raises(PipelineError, match="both write") as refused:
        state.new_values_stream().sink(second(dsn))
    assert "secret" not in str(refused.value)


def _summed_rt(redis_url, home, sink, transform=None, name="summed") -> Runtime:
    return Runtime.open(summed(name, sink, transform), redis_url, home)


def test_a_sum_past_bigint_names_key_txid_column_and_the_way_out(
    redis_url, redis_client, home, pg_dsn
):
    rt = _summed_rt(redis_url, home, PostgresSink("totals", dsn=pg_dsn))
    produce(rt, ["big 4611686018427387904", "small 1"])
    run_batches(rt, LocalEngine())
    export(rt)  # 2^62 fits: the table is made bigint
    produce(rt, ["big 4611686018427387904", "small 1"])  # 2^63: past bigint
    run_batches(rt, LocalEngine())
    with pytest.raises(SinkError) as failed:
        export(rt)
    line = str(failed.value)
    assert "\n" not in line and not failed.value.retry_helps  # a person's fix: fail at once
    for needle in ("txid 2", "key ['big']", "column total is bigint", "outside its range",
                   'ALTER TABLE "totals" ALTER COLUMN "total" TYPE numeric'):  # fmt: skip
        assert needle in line, line
    assert rt.ledger.committed_txid() == 2
    assert table_rows(pg_dsn, "totals", "key") == {"big": (2**62,), "small": (1,)}  # txid 1
    with psycopg.connect(pg_dsn) as conn:  # the way out, as said
        conn.execute('ALTER TABLE "totals" ALTER COLUMN "total" TYPE numeric')
    export(rt)
    assert table_rows(pg_dsn, "totals", "key") == {"big": (2**63,), "small": (2,)}


@pytest.mark.parametrize(
    ("transform", "needles"),
    [
        (lambda k, v: (k, v if v < 2 else float("nan")), ["txid 2", "total is bigint", "float"]),
        (lambda k, v: (k, v if v < 2 else "many"), ["txid 2", "is a str", "columns={'total'"]),
        (lambda k, v: (k, f"v\x00{v}"), ["holds a NUL character", "map the values"]),
        (lambda k, v: (k, "\ud800"), ["lone surrogate"]),
        (lambda k, v: (k, {"x": float("inf")} if v > 1 else {"x": 1}), ["is not JSON"]),
    ],
    ids=["nan-into-bigint", "type-changes", "nul-in-text", "surrogate", "infinity-in-jsonb"],
)
def test_values_a_column_cannot_take_are_one_line_naming_the_key(
    redis_url, redis_client, home, pg_dsn, transform, needles
):
    rt = _summed_rt(redis_url, home, PostgresSink("odd", dsn=pg_dsn), transform)
    produce(rt, ["k 1"])
    run_batches(rt, LocalEngine())
    first = None
    try:
        export(rt)
    except SinkError as exc:
        first = exc
    produce(rt, ["k 1"])
    run_batches(rt, LocalEngine())
    failed = first
    if failed is None:
        with pytest.raises(SinkError) as raised:
            export(rt)
        failed = raised.value
    line = str(failed)
    assert "\n" not in line and "key ['k']" in line and not failed.retry_helps, line
    for needle in needles:
        assert needle in line, line
    assert rt.ledger.committed_txid() == 2  # nothing committed was lost or held back


@pytest.mark.parametrize(
    ("kind", "value"), [("smallint", 40000), ("integer", 2**31), ("real", 1e39)]
)
def test_a_narrower_column_never_takes_a_value_past_its_range(
    redis_url, redis_client, home, pg_dsn, kind, value
):
    """A table made by hand with a narrower type: binary COPY would wrap 40000 into a
    smallint as -25536 without a word; the export refuses it in one line instead."""
    with psycopg.connect(pg_dsn) as conn:
        conn.execute(f"CREATE TABLE narrow (key text PRIMARY KEY, total {kind})")
    sink = PostgresSink("narrow", dsn=pg_dsn, columns={"total": kind})
    rt = _summed_rt(redis_url, home, sink, lambda k, v: (k, v if v == 1 else value))
    produce(rt, ["k 1", "other 1"])
    run_batches(rt, LocalEngine())
    export(rt)
    produce(rt, ["k 1"])
    run_batches(rt, LocalEngine())
    with pytest.raises(SinkError, match=rf"txid 2 .* key \['k'\]: column total is {kind}, but "
                       ".* outside its range"):  # fmt: skip
        export(rt)
    assert table_rows(pg_dsn, "narrow", "key") == {"k": (1,), "other": (1,)}


def test_a_columns_override_the_table_does_not_have_is_one_line(
    redis_url, redis_client, home, pg_dsn
):
    rt = _summed_rt(redis_url, home, PostgresSink("totals", dsn=pg_dsn))
    produce(rt, ["k 1"])
    run_batches(rt, LocalEngine())
    export(rt)
    widened = _summed_rt(
        redis_url, home, PostgresSink("totals", dsn=pg_dsn, columns={"total": "numeric"})
    )
    produce(widened, ["k 1"])
    run_batches(widened, LocalEngine())
    with pytest.raises(SinkError, match="columns= declares total as numeric, but table totals "
                       "has it as bigint: ALTER TABLE"):  # fmt: skip
        export(widened)


# -- 3. a sink of several parts is judged part by part ------------------------------------------
def test_a_stream_sink_cut_between_its_streams_refuses_a_rewind_below_any_part(
    redis_url, redis_client, home, monkeypatch
):
    """Killed after the first stream took txid 2: the position (the slowest stream) says 1,
    but a reader of the first stream may have read txid 2; a rewind to 1 is refused naming
    2, and the export resumes on the other stream only (each entry once)."""
    from tridentflow.faults import SimulatedCrash
    from tridentflow.ops.rewind import RewindRefusedError, rewind_pipeline

    monkeypatch.setenv("TRIDENTFLOW_RETAIN_TXIDS", "5")
    sink = RedisStreamSink("parts-{partition}", partitions=2)
    rt = _summed_rt(redis_url, home, sink, name="parted")
    produce(rt, [f"k{i} 1" for i in range(20)])
    run_batches(rt, LocalEngine(), max_batches=1)
    export(rt)
    produce(rt, [f"k{i} 1" for i in range(20)])
    run_batches(rt, LocalEngine(), max_batches=1)

    def crash_between(feed, point, txid):
        if point == "between-parts":
            raise SimulatedCrash("killed between the streams")

    with pytest.raises(SimulatedCrash):
        export(rt, hook=crash_between)
    feed = rt.pipeline.feeds[0]
    from tridentflow.steps.export import context

    assert feed.sink.position(context(rt, feed)) == 1
    assert feed.sink.written_through(context(rt, feed)) == 2
    with pytest.raises(RewindRefusedError, match=r"up to 2 \(in whole or in part\)"):
        rewind_pipeline(rt, 1)
    assert rt.ledger.committed_txid() == 2
    export(rt)
    seen: dict[tuple[str, str], int] = {}
    for p in range(2):
        for entry_id, fields in rt.client.xrange(f"parts-{p}"):
            txid_key = (entry_id.decode().split("-")[0], fields[b"key"].decode())
            seen[txid_key] = seen.get(txid_key, 0) + 1
    assert set(seen.values()) == {1} and len(seen) == 40  # 20 keys x 2 txids, once each
    for p in range(2):  # a consumer following a key finds it where stream_of says
        for _id, fields in rt.client.xrange(f"parts-{p}"):
            key = [fields[f.encode()].decode() for f in feed.sink.key_fields]
            assert feed.sink.stream_of(key) == f"parts-{p}"


def test_a_postgresql_export_overtaken_by_a_rewind_writes_nothing(
    redis_url, redis_client, home, pg_dsn, monkeypatch
):
    """An export that waits on the table's lock (another exporter holds it) while the
    pipeline is rewound finds the generation moved once it gets the lock and writes nothing;
    the next export reloads the table as of the rewound state."""
    import threading

    from tridentflow.ops.rewind import rewind_pipeline

    monkeypatch.setenv("TRIDENTFLOW_RETAIN_TXIDS", "5")
    rt = _summed_rt(redis_url, home, PostgresSink("overtaken", dsn=pg_dsn), name="overtaken")
    produce(rt, ["k 1"])
    run_batches(rt, LocalEngine())
    export(rt)
    produce(rt, ["k 1"])
    run_batches(rt, LocalEngine())
    holder = psycopg.connect(pg_dsn, autocommit=True)  # another exporter, mid-transaction
    holder.execute("SELECT pg_advisory_lock(hashtext(%s))", ('tridentflow:"overtaken"',))
    stale = _summed_rt(redis_url, home, PostgresSink("overtaken", dsn=pg_dsn), name="overtaken")
    failures: list[BaseException] = []

    def waiting_export() -> None:
        try:
            export(stale)
        except BaseException as exc:
            failures.append(exc)

    waiter = threading.Thread(target=waiting_export)
    waiter.start()
    with psycopg.connect(pg_dsn, autocommit=True) as admin:  # it waits on the table's lock
        for _ in range(200):
            waiting = admin.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            ).fetchone()[0]
            if waiting:
                break
            time.sleep(0.05)
        assert waiting, "the export never reached the table's lock"
    rewind_pipeline(rt, 1)
    holder.execute("SELECT pg_advisory_unlock_all()")
    holder.close()
    waiter.join(60)
    (failure,) = failures
    assert isinstance(failure, SinkError), failure
    assert "reset or rewound while this export waited" in str(failure)
    assert table_rows(pg_dsn, "overtaken", "key") == {"k": (1,)}  # txid 2 never landed
    fresh = _summed_rt(redis_url, home, PostgresSink("overtaken", dsn=pg_dsn), name="overtaken")
    [result] = export(fresh)
    assert result.reloaded_at == 1
    assert table_rows(pg_dsn, "overtaken", "key") == {"k": (1,)}


def test_a_multi_stream_sink_must_know_the_key_to_spread_by():
    """A stream that renamed the state's key fields cannot be spread by them: refused at
    build time without key=..., so one key's changes never go to two streams."""
    p = Pipeline("spread", LogSource(fields=("line",)))
    state = (
        p.stream.each("line", lambda line: ((w,) for w in line.split()), "w")
        .group_by("w")
        .persistent_aggregate(StateSpec("c"), Count())
    )
    renamed = state.new_values_stream().map(lambda w, c: (w.upper(), c), ["k", "n"])
    with pytest.raises(PipelineError, match=r"2 partitions spread keys by the key fields.*key="):
        renamed.sink(RedisStreamSink("spread-{partition}", partitions=2))
    renamed.sink(RedisStreamSink("spread-{partition}", partitions=2, key=["k"]))
    assert p.feeds[0].sink.key_fields == ("k",)
    with pytest.raises(PipelineError, match=r"key field\(s\) \['nope'\] are not fields"):
        renamed.sink(RedisStreamSink("other", key=["nope"]))
