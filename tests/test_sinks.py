"""new_values_stream and the sinks, against a real PostgreSQL and Redis: each txid lands once,
whole, in order; a sink that fails or falls behind catches up; chained pipelines through a
Redis stream are exactly-once end to end."""

from __future__ import annotations

import threading
from pathlib import Path

import psycopg
import pytest

from tests.helpers import produce, runtime
from tests.postgres import table_rows
from tridentflow import Count, LogSource, Pipeline, PostgresSink, RedisStreamSink, StateSpec
from tridentflow.engines.local import LocalEngine
from tridentflow.errors import PipelineError
from tridentflow.faults import FaultPlan
from tridentflow.ops.reset import reset_pipeline
from tridentflow.sinks import SinkError
from tridentflow.steps.driver import run_batches
from tridentflow.steps.export import export, sink_status
from tridentflow.steps.query import list_state
from tridentflow_state.changes import change_count, logged_txids

LINES = ["a bb ccc", "set x 1", "bb ccc dddd", "set y 2", "ccc", "del x", "set y 3", "eeee a"]


@pytest.fixture
def sinked(redis_url: str, redis_client, home: Path, pg_dsn: str, monkeypatch):
    monkeypatch.setenv("TRIDENTFLOW_POSTGRES_DSN", pg_dsn)
    rt = runtime("tests.pipelines:sinked", redis_url, home)
    reset_pipeline(rt, force=True, source=True)
    produce(rt, LINES)
    return rt


def state_rows(rt, name: str) -> dict:
    page = list_state(rt, rt.pipeline.states[name], limit=10_000)
    return {key[0]: value for key, value in page.items}


def stream_entries(rt) -> list[tuple[str, dict]]:
    out = []
    for p in range(2):
        for entry_id, fields in rt.client.xrange(f"kv-changes{p}"):
            out.append((entry_id.decode(), {k.decode(): v.decode() for k, v in fields.items()}))
    return out


def test_each_sink_equals_the_state_after_every_commit(sinked, pg_dsn: str) -> None:
    rt = sinked
    for _ in range(10):
        records = run_batches(rt, LocalEngine(), max_batches=1).records
        export(rt)
        counts = {w: c * 10 for w, c in state_rows(rt, "counts").items() if len(w) > 2}
        assert table_rows(pg_dsn, "counts_x10", "word") == {w: (c,) for w, c in counts.items()}
        kv = state_rows(rt, "kv")
        assert table_rows(pg_dsn, "kv", "key") == {k: (v,) for k, v in kv.items()}
        if not records:
            break
    assert state_rows(rt, "kv") == {"y": 3}  # x was set, then removed: its row deleted
    with psycopg.connect(pg_dsn) as conn:
        progress = dict(conn.execute("SELECT sink, txid FROM tridentflow_progress").fetchall())
    committed = rt.ledger.committed_txid()
    assert progress == {"postgres-counts_x10": committed, "postgres-kv": committed}
    assert {s["sink"]: s["lag"] for s in sink_status(rt)} == dict.fromkeys(progress, 0) | {
        "stream-kv-changesP": 0
    }
    # the stream: one entry per changed key per txid, the removal as null, nothing twice
    entries = stream_entries(rt)
    values = [(fields["key"], fields["value"]) for _id, fields in entries]
    assert sorted(values) == sorted([("x", "1"), ("y", "2"), ("x", "null"), ("y", "3")])
    assert logged_txids(rt.client, rt.keyspace, "kv") == []  # every sink has them: dropped
    again = export(rt)  # nothing new: nothing applied
    assert [r.applied for r in again] == [(), (), ()]


def test_a_sink_that_fails_lags_and_catches_up_txid_by_txid(sinked, pg_dsn, monkeypatch) -> None:
    rt = sinked
    monkeypatch.setenv("TRIDENTFLOW_POSTGRES_DSN", "postgresql://nobody:s3cret@127.0.0.1:1/x")
    run_batches(rt, LocalEngine(), max_batches=2)
    with pytest.raises(SinkError) as failed:
        export(rt, ["postgres-kv"])
    line = str(failed.value)
    assert "\n" not in line and "s3cret" not in line and "cannot connect" in line
    assert rt.ledger.committed_txid() == 2  # the commits never waited for the sink
    monkeypatch.setenv("TRIDENTFLOW_POSTGRES_DSN", pg_dsn)
    [result] = export(rt, ["postgres-kv"])
    assert result.applied == (1, 2) and result.reloaded_at is None


def test_status_and_metrics_show_each_sinks_position_and_lag(sinked) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from tridentflow.ops import metrics
    from tridentflow.ops.status import format_status, status

    rt = sinked
    run_batches(rt, LocalEngine(), max_batches=2)
    export(rt, ["postgres-kv"])
    run_batches(rt, LocalEngine(), max_batches=1)
    info = status(rt)
    lags = {s["sink"]: (s["position"], s["lag"]) for s in info["sinks"]}
    assert lags == {
        "postgres-counts_x10": (0, 3),
        "postgres-kv": (2, 1),
        "stream-kv-changesP": (0, 3),
    }
    assert "sink           postgres-kv (kv -> PostgreSQL table kv" in format_status(info)
    assert metrics.figures(rt)["sink_lag_txids"] == 3
    [collected] = metrics.collect(
        [("sinked", lambda: runtime("tests.pipelines:sinked", rt.redis_url, rt.home))]
    )
    text = metrics.prometheus_text([collected]).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    by_sink = {
        s.labels["sink"]: s.value for s in families["tridentflow_sink_lag_txids_by_sink"].samples
    }
    assert by_sink == {"postgres-counts_x10": 3, "postgres-kv": 1, "stream-kv-changesP": 3}


def test_a_sink_behind_the_change_log_reloads_the_whole_state(sinked, pg_dsn) -> None:
    rt = sinked
    run_batches(rt, LocalEngine())  # change_log_limit=3: the first txids' logs are gone
    committed = rt.ledger.committed_txid()
    assert committed > 3 and logged_txids(rt.client, rt.keyspace, "kv")[0] > 1
    results = {r.sink: r for r in export(rt, ["postgres-kv", "postgres-counts_x10"])}
    assert results["postgres-kv"].reloaded_at == committed
    assert table_rows(pg_dsn, "kv", "key") == {"y": (3,)}
    # a stream cannot take back what it holds: it refuses, in one line
    with pytest.raises(SinkError, match="change log of txid 1 is gone"):
        export(rt, ["stream-kv-changesP"])


def test_a_reset_replaces_the_table_and_a_foreign_table_is_refused(sinked, pg_dsn) -> None:
    rt = sinked
    run_batches(rt, LocalEngine())
    export(rt, ["postgres-kv"])
    reset_pipeline(rt, force=True, source=True)
    produce(rt, ["set z 9"])
    run_batches(rt, LocalEngine())
    export(rt, ["postgres-kv"])
    assert table_rows(pg_dsn, "kv", "key") == {"z": (9,)}
    with psycopg.connect(pg_dsn) as conn:  # someone else's table of that name
        conn.execute("CREATE TABLE counts_x10 (word text PRIMARY KEY, count bigint)")
        conn.execute("INSERT INTO counts_x10 VALUES ('mine', 1)")
    with pytest.raises(SinkError, match="already holds rows that this sink did not write"):
        export(rt, ["postgres-counts_x10"])
    assert table_rows(pg_dsn, "counts_x10", "word") == {"mine": (1,)}


def test_exporters_killed_mid_txid_or_racing_apply_each_txid_once(sinked, pg_dsn) -> None:
    rt = sinked
    run_batches(rt, LocalEngine(), max_batches=3)  # change_log_limit=3: all kept
    rt = rt.with_(faults=FaultPlan.parse("mid-export@1,mid-export@2"))
    for _ in range(6):
        try:
            export(rt, ["postgres-kv", "stream-kv-changesP"])
            break
        except SinkError as exc:  # the injected fault, said as the sink's one line
            assert "InjectedFaultError: injected fault mid-export@" in str(exc), exc
            continue
    rt = rt.with_(faults=FaultPlan())
    run_batches(rt, LocalEngine())
    committed = rt.ledger.committed_txid()
    errors: list[BaseException] = []

    def exporter() -> None:
        other = runtime("tests.pipelines:sinked", rt.redis_url, rt.home)
        try:
            export(other)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=exporter) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    with psycopg.connect(pg_dsn) as conn:
        rows = dict(conn.execute("SELECT sink, rows_total FROM tridentflow_progress").fetchall())
    assert rows["postgres-kv"] == 4  # x, y, x (removed), y: each change applied once
    assert table_rows(pg_dsn, "kv", "key") == {"y": (3,)}
    assert len(stream_entries(rt)) == 4
    assert rt.ledger.committed_txid() == committed


def test_chained_pipelines_through_a_stream_are_exactly_once(sinked, home: Path) -> None:
    rt = sinked
    run_batches(rt, LocalEngine(), max_batches=2)
    export(rt, ["stream-kv-changesP"])
    follower = runtime("tests.pipelines:kv_follower", rt.redis_url, home / "follower")
    run_batches(follower, LocalEngine())
    run_batches(rt, LocalEngine())
    rt = rt.with_(faults=FaultPlan.parse("mid-export@3"))
    with pytest.raises(SinkError, match="injected fault mid-export@3"):
        export(rt, ["stream-kv-changesP"])
    run_batches(follower, LocalEngine())  # reads a txid's first part, then the rest
    rt = rt.with_(faults=FaultPlan())
    export(rt, ["stream-kv-changesP"])
    run_batches(follower, LocalEngine())
    assert state_rows(follower, "changes") == {"x": 2, "y": 2}


def test_a_rewind_reloads_the_tables_and_the_stream_goes_on_once(
    sinked, pg_dsn, monkeypatch
) -> None:
    """A rewind below what a stream sink appended is refused in one line (its readers saw
    it), nothing changed; one to the stream's position takes back a txid the PostgreSQL
    tables had: their next export reloads them in one transaction, and after the replay
    every table equals the state and the stream holds each change once."""
    from tridentflow.ops.rewind import RewindRefusedError, rewind_pipeline

    monkeypatch.setenv("TRIDENTFLOW_RETAIN_TXIDS", "8")
    rt = sinked
    run_batches(rt, LocalEngine(), max_batches=2)
    export(rt, ["stream-kv-changesP"])
    run_batches(rt, LocalEngine(), max_batches=1)  # txid 3: "del x"
    export(rt, ["postgres-kv", "postgres-counts_x10"])
    assert table_rows(pg_dsn, "kv", "key") == {"y": (2,)}
    refusal = r"sink stream-kv-changesP .* up to 2 \(in whole or in part\), which"
    with pytest.raises(RewindRefusedError, match=refusal):
        rewind_pipeline(rt, 1)
    assert rt.ledger.committed_txid() == 3
    rewind_pipeline(rt, 2)
    assert state_rows(rt, "kv") == {"x": 1, "y": 2}
    results = {r.sink: r for r in export(rt)}
    assert results["postgres-kv"].reloaded_at == 2
    assert table_rows(pg_dsn, "kv", "key") == {"x": (1,), "y": (2,)}
    run_batches(rt, LocalEngine())
    export(rt)
    assert (
        table_rows(pg_dsn, "kv", "key")
        == {"y": (3,)}
        == {k: (v,) for k, v in state_rows(rt, "kv").items()}
    )
    counts = {w: c * 10 for w, c in state_rows(rt, "counts").items() if len(w) > 2}
    assert table_rows(pg_dsn, "counts_x10", "word") == {w: (c,) for w, c in counts.items()}
    values = [(fields["key"], fields["value"]) for _id, fields in stream_entries(rt)]
    assert sorted(values) == sorted([("x", "1"), ("y", "2"), ("x", "null"), ("y", "3")])


def test_sink_definitions_are_checked_when_the_pipeline_is_built() -> None:
    pipeline = Pipeline("p", LogSource(fields=("w",)))
    counts = pipeline.stream.group_by("w").persistent_aggregate(
        StateSpec("c"), Count(), out_field="n"
    )
    with pytest.raises(PipelineError, match=r"key column\(s\) \['w'\] are not fields"):
        counts.new_values_stream().project("n").sink(PostgresSink("t"))
    with pytest.raises(PipelineError, match="not partition_persist"):
        _ = counts.new_values_stream().partition_persist
    with pytest.raises(ValueError, match="need a stream template"):
        RedisStreamSink("s", partitions=2)
    counts.new_values_stream().sink(PostgresSink("t"))
    with pytest.raises(PipelineError, match="two sinks are named"):
        counts.new_values_stream().sink(PostgresSink("t"))
    total = pipeline.stream.persistent_aggregate(StateSpec("total"), Count(), out_field="n")
    with pytest.raises(PipelineError, match="needs key column"):
        total.new_values_stream().sink(PostgresSink("total"))


def test_a_float_after_integers_widens_the_column_the_sink_typed(pg_dsn) -> None:
    """JSON's ``3`` before ``12.5``: the value column the sink made bigint from txid 1 becomes
    double precision in the transaction of the txid that brings a float - unless an integer
    it holds is not exact as a double (refused in one line, nothing written); an integer past
    2^53 into a double column is refused, never rounded."""
    from tridentflow.sinks.base import ExportContext

    ctx = ExportContext("p", "g", None, "")  # type: ignore[arg-type]
    sink = PostgresSink("widened", dsn=pg_dsn).bind(("k", "n"), ("k",))
    assert sink.apply(ctx, 1, [("a", 3), ("b", 2**53)])
    assert sink.apply(ctx, 2, [("c", 12.5)])
    assert table_rows(pg_dsn, "widened", "k") == {"a": (3,), "b": (2**53,), "c": (12.5,)}
    assert type(table_rows(pg_dsn, "widened", "k")["a"][0]) is float
    assert sink.apply(ctx, 3, [("a", 4)])  # ints again, into the double column
    with pytest.raises(SinkError) as refused:
        sink.apply(ctx, 4, [("d", 2**53 + 1)])
    line = str(refused.value)
    assert "\n" not in line and "not exact as a double" in line and "numeric" in line
    sink.close()

    big = PostgresSink("not_widened", dsn=pg_dsn).bind(("k", "n"), ("k",))
    assert big.apply(ctx, 1, [("a", 2**60)])
    with pytest.raises(SinkError) as refused:
        big.apply(ctx, 2, [("c", 0.5)])
    line = str(refused.value)
    assert "\n" not in line and "column n is bigint, but the value 0.5 is a float" in line
    assert table_rows(pg_dsn, "not_widened", "k") == {"a": (2**60,)}  # as it was, exact
    big.close()


def test_values_of_the_wrong_type_and_keys_equal_but_different_are_refused(pg_dsn) -> None:
    """The family "keys equal but different": 1, 1.0 and True are one key to Python's dict
    and to PostgreSQL's jsonb, three to tridentflow. A typed key column takes exactly its
    type; mixed key types are refused before the table is made; nothing half-applied."""
    from tridentflow.sinks.base import ExportContext

    ctx = ExportContext("p", "g", None, "")  # type: ignore[arg-type]
    sink = PostgresSink("typed", dsn=pg_dsn).bind(("k", "n"), ("k",))
    with pytest.raises(SinkError, match="key column k holds float/int values"):
        sink.apply(ctx, 1, [(1, 5), (1.0, 6)])
    assert sink.apply(ctx, 1, [(1, 5), (2, 6)])
    with pytest.raises(SinkError, match=r"column k is bigint, but the value True is a bool"):
        sink.apply(ctx, 2, [(3, 1), (True, 1)])
    declared = PostgresSink("typed_declared", dsn=pg_dsn, columns={"n": "bigint"})
    declared = declared.bind(("k", "n"), ("k",))
    assert declared.apply(ctx, 1, [(1, 5)])
    with pytest.raises(SinkError, match=r"column n is bigint, but the value 2.5 is a float"):
        declared.apply(ctx, 2, [(3, 2.5)])  # a declared type is the user's: never widened
    declared.close()
    assert table_rows(pg_dsn, "typed", "k") == {1: (5,), 2: (6,)}  # txid 2 never landed
    assert sink.apply(ctx, 2, [(1, None), (3, 7)])  # 1 removed, 3 added
    assert not sink.apply(ctx, 2, [(9, 9)])  # already applied: nothing changes
    assert table_rows(pg_dsn, "typed", "k") == {2: (6,), 3: (7,)}
    with pytest.raises(SinkError, match="is at txid 2, so txid 4 cannot be applied yet"):
        sink.apply(ctx, 4, [(4, 4)])
    sink.close()


@pytest.mark.parametrize("sink_class", [RedisStreamSink, PostgresSink])
def test_an_exporter_whose_position_a_racer_passed_goes_on_from_the_sink(
    sinked, pg_dsn, monkeypatch, sink_class
) -> None:
    """The family 'racing exporters meet a dropped change log': exporter B reads a sink's
    position (3); exporter A then applies txid 4 to every sink of the state, which drops txid
    4's change log. B must find the sink past it - neither a refusal ('the change log of txid
    4 is gone', which CI met as a flaky race) nor a needless reload of the whole table."""
    rt = sinked
    run_batches(rt, LocalEngine(), max_batches=3)
    export(rt)
    run_batches(rt, LocalEngine(), max_batches=1)
    entries_before = len(stream_entries(rt))
    changed_in_4 = change_count(rt.client, rt.keyspace, "kv", 4)
    racer_ran: list[int] = []
    real = sink_class.position

    def position_then_a_racer(self, ctx):
        seen = real(self, ctx)
        if not racer_ran and self.describe().startswith(("Redis stream", "PostgreSQL table kv")):
            racer_ran.append(seen)
            export(runtime("tests.pipelines:sinked", rt.redis_url, rt.home))
        return seen

    monkeypatch.setattr(sink_class, "position", position_then_a_racer)
    results = {r.sink: r for r in export(runtime("tests.pipelines:sinked", rt.redis_url, rt.home))}
    assert racer_ran == [3]
    assert 4 not in logged_txids(rt.client, rt.keyspace, "kv")  # the racer dropped it
    assert all(r.position == 4 and r.reloaded_at is None for r in results.values()), results
    assert table_rows(pg_dsn, "kv", "key") == {k: (v,) for k, v in state_rows(rt, "kv").items()}
    assert len(stream_entries(rt)) == entries_before + changed_in_4  # txid 4 appended once


def test_an_empty_list_of_sinks_exports_none(sinked, pg_dsn) -> None:
    """``export(rt, [])`` exports no sink (None is every sink): the chaos harness's resync of
    "every sink that can reload" once passed an empty list and resynced every stream sink."""
    rt = sinked
    run_batches(rt, LocalEngine(), max_batches=2)
    assert export(rt, []) == []
    assert {s["sink"]: s["position"] for s in sink_status(rt)} == dict.fromkeys(
        ("postgres-counts_x10", "postgres-kv", "stream-kv-changesP"), 0
    )
    assert {r.sink for r in export(rt)} == {
        "postgres-counts_x10",
        "postgres-kv",
        "stream-kv-changesP",
    }
