"""Benchmark: rows/s into PostgreSQL - PostgresSink vs the executemany upsert loop a user writes.

    python -m benchmarks.postgres_sink [--keys 1000000] [--dsn postgresql://...] [--export]

Both write the same rows (key text, count bigint) into a fresh table, twice: first every key is
new (inserts), then every key changes (updates, the steady state of a counter). Each pass is
one transaction, with the txid's progress row for PostgresSink.

* ``PostgresSink.apply``: COPY into a temporary table, one ``INSERT ... ON CONFLICT DO UPDATE``
  and the progress row (what ``export`` does per txid).
* ``executemany``: psycopg 3's ``cursor.executemany`` of ``INSERT ... ON CONFLICT (word) DO
  UPDATE`` (psycopg pipelines it: no round trip per row), then ``commit`` - the loop a user
  writes without a bulk path.

``--export`` also times the whole export of a committed txid with that many changed keys (a
word count over ``--keys`` distinct words, run on the local engine, its change log read from
Redis, decoded, applied): TRIDENTFLOW_REDIS_URL (default 127.0.0.1:6379) is used, under a
throwaway namespace. The database is created fresh (``tf_bench_...``) and dropped after.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import uuid
from pathlib import Path

import psycopg

from tridentflow.sinks import PostgresSink
from tridentflow.sinks.base import ExportContext

ADMIN_DSN = os.environ.get(
    "TRIDENTFLOW_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/postgres"
)


def fresh_database(admin: str) -> tuple[str, str]:
    name = f"tf_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return name, admin.rsplit("/", 1)[0] + "/" + name


def drop_database(admin: str, name: str) -> None:
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def rows_of(keys: int, bump: int) -> list[tuple[str, int]]:
    return [(f"word{i:08d}", i % 1000 + bump) for i in range(keys)]


def bench_sink(dsn: str, keys: int) -> tuple[float, float]:
    sink = PostgresSink("sink_counts", dsn=dsn).bind(("word", "count"), ("word",))
    ctx = ExportContext("bench", "g1", None, "")  # type: ignore[arg-type]
    times = []
    for txid, bump in ((1, 0), (2, 1)):
        rows = rows_of(keys, bump)
        started = time.perf_counter()
        sink.apply(ctx, txid, rows)
        times.append(time.perf_counter() - started)
    sink.close()
    return times[0], times[1]


def bench_executemany(dsn: str, keys: int) -> tuple[float, float]:
    times = []
    with psycopg.connect(dsn) as conn:
        conn.execute("CREATE TABLE loop_counts (word text PRIMARY KEY, count bigint)")
        conn.commit()
        for bump in (0, 1):
            rows = rows_of(keys, bump)
            started = time.perf_counter()
            with conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO loop_counts (word, count) VALUES (%s, %s) "
                    "ON CONFLICT (word) DO UPDATE SET count = EXCLUDED.count",
                    rows,
                )
            conn.commit()
            times.append(time.perf_counter() - started)
    return times[0], times[1]


def bench_export(dsn: str, keys: int) -> tuple[float, float, float]:
    """(commit s with the change log, the same commit without a sink, export s) of one txid
    that changes ``keys`` keys."""
    from tridentflow.aggregators import Count
    from tridentflow.engines.local import LocalEngine
    from tridentflow.nodes import StateSpec
    from tridentflow.ops.reset import reset_pipeline
    from tridentflow.pipeline import Pipeline
    from tridentflow.sources.specs import LogSource, SourceMode
    from tridentflow.steps.committer import commit
    from tridentflow.steps.coordinator import coordinate
    from tridentflow.steps.emitter import emit
    from tridentflow.steps.export import export
    from tridentflow.steps.runtime import Runtime, resolve_redis_url
    from tridentflow_state.maps import StateKind

    def pipeline(with_sink: bool) -> Pipeline:
        source = LogSource(fields=("word",), mode=SourceMode.TRANSACTIONAL, partitions=4)
        p = Pipeline("bench-export" if with_sink else "bench-nosink", source)
        state = p.stream.group_by("word").persistent_aggregate(
            StateSpec("counts", StateKind.OPAQUE), Count(), out_field="count"
        )
        if with_sink:
            state.new_values_stream().sink(PostgresSink("export_counts", dsn=dsn))
        return p

    home = Path(tempfile.mkdtemp(prefix="tf-bench-pg-"))
    namespace = f"bench{uuid.uuid4().hex[:6]}"
    words = [f"word{i:08d}" for i in range(keys)]
    timings = {}
    for with_sink in (False, True):
        rt = Runtime.open(pipeline(with_sink), resolve_redis_url(), home, namespace=namespace)
        reset_pipeline(rt, force=True, source=True)
        rt.source_heads()
        rt.log.append_spread(words)
        coordinate(rt, 1, keys)
        emit(rt, 1, LocalEngine())
        started = time.perf_counter()
        commit(rt, 1)
        timings[with_sink] = time.perf_counter() - started
        if with_sink:
            started = time.perf_counter()
            export(rt)
            timings["export"] = time.perf_counter() - started
        reset_pipeline(rt, force=True, source=True)
        rt.client.close()
    return timings[True], timings[False], timings["export"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--dsn", default=ADMIN_DSN, help="an admin DSN (a database is created)")
    parser.add_argument("--export", action="store_true", help="also time a whole export")
    args = parser.parse_args()
    name, dsn = fresh_database(args.dsn)
    try:
        sink_new, sink_upd = bench_sink(dsn, args.keys)
        loop_new, loop_upd = bench_executemany(dsn, args.keys)
        n = args.keys
        print(f"{n:,} rows per transaction, PostgreSQL {psycopg.connect(dsn).info.server_version}")
        print(f"{'':28}{'new keys':>18}{'changed keys':>18}")
        for label, new, upd in (
            ("PostgresSink.apply", sink_new, sink_upd),
            ("executemany upsert loop", loop_new, loop_upd),
        ):
            print(f"{label:28}{n / new:>12,.0f} rows/s{n / upd:>12,.0f} rows/s")
        print(
            f"{'PostgresSink / loop':28}{loop_new / sink_new:>17.1f}x{loop_upd / sink_upd:>17.1f}x"
        )
        if args.export:
            with_log, without, exported = bench_export(dsn, n)
            print(
                f"whole export of one txid changing {n:,} keys (change log read from Redis, "
                f"decoded, applied): {exported:.1f} s = {n / exported:,.0f} rows/s"
            )
            print(
                f"the commit of that txid: {with_log:.1f} s with the change log, "
                f"{without:.1f} s without a sink ({with_log / without:.2f}x)"
            )
    finally:
        drop_database(args.dsn, name)


if __name__ == "__main__":
    main()
