"""Benchmark: the lakehouse sinks (DeltaSink, IcebergSink) against each library's own plain
write of the same rows, side by side in one process (issue 52).

    python -m benchmarks.lakehouse_sink [--keys 1000000] [--small-txids 100] [--small-keys 1000]

* **append**: one txid of K changed keys (word, count) into a table that holds the first
  txid's row (the steady state) as the sink applies it - from the export's Python rows to
  one Delta commit with its ``txn`` / one Iceberg snapshot stamped with the txid - against
  ``write_deltalake(mode="append")`` / ``load_table`` + ``table.append`` of the same rows
  already in an Arrow table (what a user writing by hand would call). Goal: >= 0.8x their
  throughput.
* **upsert**: the same K keys again with new counts into the table that holds them (every row
  updated): the sink's MERGE / copy-on-write overwrite snapshot against delta-rs's plain
  ``merge`` (update all, insert all) / pyiceberg's ``upsert`` of the same Arrow table.
* **small files**: ``--small-txids`` txids of ``--small-keys`` keys each through the sink, one
  commit each; the data files before and after the documented compaction (``tables compact``:
  Delta OPTIMIZE, an Iceberg rewrite snapshot), its time, and a read that still finds every
  key once with its last txid's count.

* ``--export``: the whole export of one committed txid of K changed keys (a word count over K
  distinct words on the local engine; a private redis-server unless TRIDENTFLOW_REDIS_URL is
  set) into a Delta table: read from the change log in Redis straight into Arrow columns (a
  stream with no operations: what the export does for a sink that takes Arrow) against the
  same stream through one identity ``map`` (the Python tuples any stream with operations
  goes through). The first export after a commit runs slower whichever path it takes: the
  two alternate who goes first, so with ``--repeat`` >= 2 each best is a second place.

Each figure is the best of ``--repeat`` runs (pyiceberg's own upsert, minutes at 1M keys: one);
every table is a fresh directory.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa


def _ctx(pipeline: str = "bench") -> Any:
    from tridentflow.sinks.base import ExportContext

    return ExportContext(pipeline, "g1", client=None, redis_url="")  # type: ignore[arg-type]


def _rows(keys: int, bump: int) -> list[tuple[str, int]]:
    return [(f"w{i}", i % 1000 + bump) for i in range(keys)]


def _arrow(rows: list[tuple[str, int]], txid: int) -> pa.Table:
    return pa.table(
        {
            "word": [r[0] for r in rows],
            "count": pa.array([r[1] for r in rows], pa.int64()),
            "txid": pa.array([txid] * len(rows), pa.int64()),
        }
    )


def _catalog(work: Path) -> dict[str, str]:
    return {"type": "sql", "uri": f"sqlite:///{work}/catalog.db", "warehouse": f"file://{work}/wh"}


def _best(run, repeat: int) -> float:
    return min(run() for _ in range(repeat))


def _delta_sink(uri: Path, mode: str) -> Any:
    from tridentflow.sinks import DeltaSink

    return DeltaSink(uri, mode=mode, name="bench").bind(("word", "count"), ("word",))


def _iceberg_sink(work: Path, table: str, mode: str) -> Any:
    from tridentflow.sinks import IcebergSink

    return IcebergSink(f"bench.{table}", _catalog(work), mode=mode, name="bench").bind(
        ("word", "count"), ("word",)
    )


def append_figures(work: Path, keys: int, repeat: int) -> dict[str, float]:
    from deltalake import write_deltalake
    from pyiceberg.catalog import load_catalog

    rows = _rows(keys, 0)
    table = _arrow(rows, 1)
    out = {}

    # the steady state: each table exists and holds a first txid's row; the timed write is
    # the next txid's
    def sink_delta() -> float:
        uri = Path(tempfile.mkdtemp(dir=work))
        sink = _delta_sink(uri / "t", "append")
        assert sink.apply(_ctx(), 1, rows[:1])
        started = time.perf_counter()
        assert sink.apply(_ctx(), 2, rows)
        return time.perf_counter() - started

    def plain_delta() -> float:
        uri = Path(tempfile.mkdtemp(dir=work))
        write_deltalake(uri / "t", table.slice(0, 1), mode="append")
        started = time.perf_counter()
        write_deltalake(uri / "t", table, mode="append")
        return time.perf_counter() - started

    def sink_iceberg() -> float:
        name = f"a{time.monotonic_ns()}"
        sink = _iceberg_sink(work, name, "append")
        assert sink.apply(_ctx(), 1, rows[:1])
        started = time.perf_counter()
        assert sink.apply(_ctx(), 2, rows)
        return time.perf_counter() - started

    def plain_iceberg() -> float:
        catalog = load_catalog("tridentflow", **_catalog(work))
        catalog.create_namespace_if_not_exists("bench")
        iceberg = catalog.create_table(f"bench.p{time.monotonic_ns()}", schema=table.schema)
        iceberg.append(table.slice(0, 1))
        started = time.perf_counter()
        iceberg = catalog.load_table(iceberg.name())  # as the sink, which loads it to check
        iceberg.append(table)
        return time.perf_counter() - started

    columns = table.drop_columns(["txid"])  # the stream's fields, as the export hands them

    def from_arrow(sink: Any) -> float:
        """The steady-state append of the Arrow table through ``sink``."""
        assert sink.apply(_ctx(), 1, columns.slice(0, 1))
        started = time.perf_counter()
        assert sink.apply(_ctx(), 2, columns)
        return time.perf_counter() - started

    def sink_delta_arrow() -> float:
        return from_arrow(_delta_sink(Path(tempfile.mkdtemp(dir=work)) / "t", "append"))

    def sink_iceberg_arrow() -> float:
        return from_arrow(_iceberg_sink(work, f"b{time.monotonic_ns()}", "append"))

    def to_arrow() -> float:
        sink = _delta_sink(work / "unused", "append")
        started = time.perf_counter()
        sink.rows.batch(rows, 1)
        return time.perf_counter() - started

    for name, run in (("delta sink", sink_delta), ("delta plain", plain_delta),
                      ("iceberg sink", sink_iceberg), ("iceberg plain", plain_iceberg),
                      ("delta sink arrow", sink_delta_arrow),
                      ("iceberg sink arrow", sink_iceberg_arrow),
                      ("to arrow", to_arrow)):  # fmt: skip
        out[name] = _best(run, repeat)
    return out


def upsert_figures(work: Path, keys: int, repeat: int) -> dict[str, float]:
    from deltalake import DeltaTable, write_deltalake
    from pyiceberg.catalog import load_catalog

    first, again = _rows(keys, 0), _rows(keys, 1)
    table = _arrow(again, 2)
    out = {}

    def sink_delta() -> float:
        uri = Path(tempfile.mkdtemp(dir=work)) / "t"
        sink = _delta_sink(uri, "upsert")
        sink.apply(_ctx(), 1, first)
        started = time.perf_counter()
        assert sink.apply(_ctx(), 2, again)
        return time.perf_counter() - started

    def plain_delta() -> float:
        uri = Path(tempfile.mkdtemp(dir=work)) / "t"
        write_deltalake(uri, _arrow(first, 1))
        started = time.perf_counter()
        (
            DeltaTable(uri)
            .merge(table, "t.word = s.word", source_alias="s", target_alias="t")
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .execute()
        )
        return time.perf_counter() - started

    def sink_iceberg() -> float:
        sink = _iceberg_sink(work, f"u{time.monotonic_ns()}", "upsert")
        sink.apply(_ctx(), 1, first)
        started = time.perf_counter()
        assert sink.apply(_ctx(), 2, again)
        return time.perf_counter() - started

    def plain_iceberg() -> float:
        catalog = load_catalog("tridentflow", **_catalog(work))
        catalog.create_namespace_if_not_exists("bench")
        iceberg = catalog.create_table(f"bench.q{time.monotonic_ns()}", schema=table.schema)
        iceberg.append(_arrow(first, 1))
        started = time.perf_counter()
        iceberg.upsert(table, join_cols=["word"])
        return time.perf_counter() - started

    runs = {"delta sink": sink_delta, "delta plain": plain_delta,
            "iceberg sink": sink_iceberg, "iceberg plain": plain_iceberg}  # fmt: skip
    for name, run in runs.items():  # pyiceberg's upsert takes minutes: once is enough
        out[name] = _best(run, 1 if name == "iceberg plain" else repeat)
    return out


def small_files(work: Path, txids: int, keys: int) -> dict[str, dict[str, Any]]:
    """``txids`` txids of ``keys`` changed keys each appended (a change log: one small commit
    per txid), then the compaction; data files before and after, its seconds, and a read that
    finds every (key, txid) row exactly once."""
    from deltalake import DeltaTable

    out: dict[str, dict[str, Any]] = {}
    sinks = {
        "delta": _delta_sink(work / "small-delta", "append"),
        "iceberg": _iceberg_sink(work, "small", "append"),
    }
    expected = set()
    for txid in range(1, txids + 1):
        rows = [(f"w{(txid * keys // 4 + i) % (keys * 10)}", txid) for i in range(keys)]
        expected |= {(key, count, txid) for key, count in rows}
        for sink in sinks.values():
            sink.apply(_ctx(), txid, rows)
    for name, sink in sinks.items():
        if name == "delta":
            files_before = len(DeltaTable(sink.table_uri).file_uris())
        else:
            files_before = len(list(sink._files_holding(sink._table(), None)))
        started = time.perf_counter()
        sink.compact()
        took = time.perf_counter() - started
        if name == "delta":
            table = DeltaTable(sink.table_uri)
            files_after = len(table.file_uris())
            rows = table.to_pyarrow_table().to_pylist()
        else:
            table = sink._table()
            files_after = len(list(sink._files_holding(table, None)))
            rows = table.scan().to_arrow().to_pylist()
        read = [(r["word"], r["count"], r["txid"]) for r in rows]
        assert len(read) == len(set(read)) and set(read) == expected, name
        out[name] = {"files_before": files_before, "files_after": files_after, "seconds": took,
                     "rows": len(read)}  # fmt: skip
    return out


def export_figures(work: Path, keys: int, repeat: int) -> dict[str, float]:
    """Seconds to export one committed txid of ``keys`` changed keys into a Delta table:
    through the change log's columns ("columns") and through Python tuples ("rows")."""
    from tridentflow import Count, DeltaSink, LogSource, Pipeline, SourceMode, StateKind, StateSpec
    from tridentflow.devtools import devredis
    from tridentflow.engines.local import LocalEngine
    from tridentflow.ops.reset import reset_pipeline
    from tridentflow.steps.committer import commit
    from tridentflow.steps.coordinator import coordinate
    from tridentflow.steps.emitter import emit
    from tridentflow.steps.export import export
    from tridentflow.steps.runtime import Runtime

    def pipeline(tables: Path) -> Pipeline:
        source = LogSource(fields=("word",), mode=SourceMode.TRANSACTIONAL, partitions=4)
        p = Pipeline("bench-lake", source, change_log_limit=1000)
        state = p.stream.group_by("word").persistent_aggregate(
            StateSpec("counts", StateKind.OPAQUE), Count(), out_field="count"
        )
        state.new_values_stream().sink(DeltaSink(tables / "columns", name="columns"))
        state.new_values_stream().map(lambda word, count: (word, count)).sink(
            DeltaSink(tables / "rows", name="rows")
        )
        return p

    import pandas  # noqa: F401  (imported by the first Delta write either path makes: not timed)

    out: dict[str, float] = {}
    with devredis.url_or_private(work / "redis") as url:
        for attempt in range(repeat):
            tables = work / f"export-{attempt}"
            rt = Runtime.open(pipeline(tables), url, work / f"home-{attempt}", namespace="bl")
            reset_pipeline(rt, force=True, source=True)
            rt.source_heads()
            rt.log.append_spread([f"w{i}" for i in range(keys)])
            coordinate(rt, 1, keys)
            emit(rt, 1, LocalEngine())
            commit(rt, 1)
            for name in ("columns", "rows") if attempt % 2 else ("rows", "columns"):
                started = time.perf_counter()
                (result,) = export(rt, sinks=[name])
                took = time.perf_counter() - started
                assert result.rows == keys, result
                out[name] = min(out.get(name, took), took)
            reset_pipeline(rt, force=True, source=True)
            rt.client.close()
    return out


def _ratio(figures: dict[str, float], fmt: str, arrow: float) -> float:
    """The plain write's time / the sink's, the rows' conversion to Arrow left out."""
    return figures[f"{fmt} plain"] / max(figures[f"{fmt} sink"] - arrow, 1e-9)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--small-txids", type=int, default=100)
    parser.add_argument("--small-keys", type=int, default=1_000)
    parser.add_argument("--export", action="store_true", help="also time a whole export")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tf-bench-lake-"))
    try:
        print(f"{args.keys:,} changed keys in one txid, best of {args.repeat}:")
        appended = append_figures(work, args.keys, args.repeat)
        upserted = upsert_figures(work, args.keys, args.repeat)
        for kind, figures in (("append", appended), ("upsert", upserted)):
            for fmt in ("delta", "iceberg"):
                sink, plain = figures[f"{fmt} sink"], figures[f"{fmt} plain"]
                print(
                    f"  {kind:6} {fmt:8} sink {sink:6.2f} s ({args.keys / sink:10,.0f} rows/s)"
                    f"   plain {plain:6.2f} s ({args.keys / plain:10,.0f} rows/s)"
                    f"   sink throughput / plain = {plain / sink:.2f}x"
                )
            if "to arrow" in figures:
                for fmt in ("delta", "iceberg"):
                    sink, plain = figures[f"{fmt} sink arrow"], figures[f"{fmt} plain"]
                    print(
                        f"  {kind:6} {fmt:8} sink from an Arrow table {sink:6.2f} s "
                        f"({args.keys / sink:10,.0f} rows/s)   sink throughput / plain = "
                        f"{plain / sink:.2f}x"
                    )
                arrow = figures["to arrow"]
                print(
                    f"    of which the export's Python rows -> Arrow: {arrow:.2f} s; the sink's "
                    "commit from Arrow / plain: "
                    + ", ".join(
                        f"{fmt} {_ratio(figures, fmt, arrow):.2f}x" for fmt in ("delta", "iceberg")
                    )
                )
        if args.export:
            took = export_figures(work, args.keys, args.repeat)
            print(
                f"the export of one committed txid of {args.keys:,} changed keys into Delta: "
                f"change log -> Arrow columns {took['columns']:.2f} s, through Python tuples "
                f"(a stream with an operation) {took['rows']:.2f} s "
                f"({took['rows'] / took['columns']:.2f}x the time)"
            )
        print(f"{args.small_txids} txids of {args.small_keys:,} keys, then the compaction:")
        for fmt, f in small_files(work, args.small_txids, args.small_keys).items():
            print(
                f"  {fmt:8} data files {f['files_before']} -> {f['files_after']} in "
                f"{f['seconds']:.2f} s; a read finds all {f['rows']:,} (key, txid) rows, each "
                "once"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
