"""Redis loses acknowledged commits while a sink outside it is ahead (issue 55: a cut AOF, an
older snapshot restored, a failover without ``--wait-replicas``). The pipeline recommits the
lost txids - from an opaque source, perhaps with other records - and a sink that kept its copy
of the old ones would hold rows no commit made. Before a sink applies a txid, Redis records
that it may (``allow_sink``); a sink whose own store stands past that record proves the loss:
one that can reloads from the state, one that cannot is refused in one line, every time."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from tests.postgres import table_rows
from tridentflow import (
    Count,
    DeltaSink,
    LogSource,
    Pipeline,
    PostgresSink,
    SourceMode,
    StateKind,
    StateSpec,
)
from tridentflow.devtools.chaos import RedisServer
from tridentflow.engines.local import LocalEngine
from tridentflow.sinks import SinkError
from tridentflow.sinks.base import Sink
from tridentflow.steps.driver import run_batches
from tridentflow.steps.export import export
from tridentflow.steps.query import list_state
from tridentflow.steps.runtime import Runtime, connect


class FileSink(Sink):
    """A store outside Redis that cannot be reloaded (a log its readers consumed): a JSON file
    of (txid, key, count) rows and its position."""

    def __init__(self, path: Path, name: str = "file") -> None:
        self.path, self.name = path, name

    def bind(self, fields, key_fields):
        return self

    def _load(self) -> dict:
        return json.loads(self.path.read_text()) if self.path.exists() else {"at": 0, "rows": []}

    def position(self, ctx) -> int:
        return int(self._load()["at"])

    def apply(self, ctx, txid, rows, replace_all=False) -> bool:
        held = self._load()
        if txid <= held["at"]:
            return False
        held["rows"] += [[txid, *row] for row in rows]
        held["at"] = txid
        self.path.write_text(json.dumps(held))
        return True


def pipeline(lake: Path, dsn: str) -> Pipeline:
    p = Pipeline("lossy", LogSource(fields=("line",), mode=SourceMode.OPAQUE, partitions=2))
    counts = (
        p.stream.each("line", lambda line: ((w,) for w in line.split()), "word")
        .group_by("word")
        .persistent_aggregate(StateSpec("counts", StateKind.OPAQUE), Count(), out_field="count")
    )
    counts.new_values_stream().sink(DeltaSink(lake / "counts", name="delta"))
    counts.new_values_stream().sink(FileSink(lake / "file.json"))
    counts.new_values_stream().sink(PostgresSink("lossy_counts", dsn=dsn, name="postgres"))
    return p


def _run_and_export(rt: Runtime, batches: int, batch_size: int) -> list:
    """Run txids one at a time, exporting after each commit as `tridentflow run` does; the
    export's results (a failing sink's error in place of its result)."""
    out = []
    for _ in range(batches):
        if not run_batches(rt, LocalEngine(), max_batches=1, batch_size=batch_size).results:
            break
        try:
            out.append(export(rt, sinks=["delta", "postgres"]))
        except SinkError as exc:
            out.append(exc)
        try:
            export(rt, sinks=["file"])
        except SinkError as exc:
            out.append(exc)
    return out


@pytest.fixture
def server(killable_redis):
    return killable_redis


def _back_to_the_save(server: RedisServer) -> None:
    """Redis SIGKILLed and started from its last RDB save: the commits since are lost."""
    server.kill()
    (server.directory / "appendonlydir").rename(server.directory / "aof.lost")
    server.start(appendonly=False)


def _table(lake: Path) -> dict:
    from deltalake import DeltaTable

    return {
        r["word"]: r["count"] for r in DeltaTable(lake / "counts").to_pyarrow_table().to_pylist()
    }


def _state(rt: Runtime) -> dict:
    page = list_state(rt, rt.pipeline.states["counts"], 10_000)
    return {key[0]: value for key, value in page.items}


def test_a_sink_ahead_of_a_ledger_that_lost_commits_reloads_or_is_refused(tmp_path, pg_dsn, server):
    lake = tmp_path / "lake"
    rt = Runtime(pipeline(lake, pg_dsn), connect(server.url), tmp_path / "home")
    rt.source_heads()
    first = [f"w{i % 7} x{i % 3}" for i in range(16)]
    rt.log.append_spread(first)
    _run_and_export(rt, 2, batch_size=2)
    rt.client.save()  # an RDB snapshot at txid 2: what Redis will come back with
    _run_and_export(rt, 2, batch_size=2)
    assert rt.ledger.committed_txid() == 4 and _table(lake) == _state(rt)
    _back_to_the_save(server)  # txids 3 and 4 are gone from Redis, not from the sinks
    rt = Runtime(pipeline(lake, pg_dsn), connect(server.url), tmp_path / "home")
    assert rt.ledger.committed_txid() == 2
    rt.log.append_spread([f"w{i % 5} y" for i in range(9)])
    results = _run_and_export(rt, 3, batch_size=50)  # other batches: other txids 3, 4
    reloads = [(r.sink, r.reloaded_at) for batch in results if isinstance(batch, list)
               for r in batch if r.reloaded_at is not None]  # fmt: skip
    assert sorted(reloads) == [("delta", 3), ("postgres", 3)]  # at the first export after
    assert _table(lake) == _state(rt)  # not a row of the lost txids' left
    postgres = {k: v[0] for k, v in table_rows(pg_dsn, "lossy_counts", "word").items()}
    assert postgres == _state(rt)
    words = Counter(w for line in first for w in line.split())
    assert _state(rt)["x0"] == words["x0"]  # every record counted once
    refusals = [str(r) for r in results if isinstance(r, SinkError)]
    assert refusals and all("holds txids up to 4, but Redis allowed it only up to 2" in r
                            and "\n" not in r for r in refusals)  # fmt: skip
    with pytest.raises(SinkError, match="cannot be reloaded"):
        export(rt, sinks=["file"])  # still refused: never left holding the old rows


def test_a_reload_after_a_loss_cut_short_is_redone_when_the_pipeline_recommitted_past_it(
    tmp_path, pg_dsn, server
):
    """The loss's first export decides to reload; if the pipeline has meanwhile recommitted
    past the sink's position, and the reload is cut short, the next export must still reload:
    what Redis records as allowed may not move past the sink before the reload has landed."""
    lake = tmp_path / "lake"
    rt = Runtime(pipeline(lake, pg_dsn), connect(server.url), tmp_path / "home")
    rt.source_heads()
    rt.log.append_spread([f"w{i % 7} x{i % 3}" for i in range(16)])
    _run_and_export(rt, 2, batch_size=2)
    rt.client.save()  # txid 2: what Redis will come back with
    _run_and_export(rt, 2, batch_size=2)  # the sinks hold txids 3, 4
    _back_to_the_save(server)
    rt = Runtime(pipeline(lake, pg_dsn), connect(server.url), tmp_path / "home")
    rt.log.append_spread([f"w{i % 5} y" for i in range(9)])
    run_batches(rt, LocalEngine(), max_batches=4, batch_size=3)  # past 4 before any export
    assert rt.ledger.committed_txid() > 4

    def cut_short(feed, point, txid):
        raise RuntimeError(f"the exporter died reloading at txid {txid}")

    for name in ("delta", "postgres"):
        with pytest.raises(SinkError):
            export(rt, sinks=[name], hook=cut_short)
        [result] = export(rt, sinks=[name])
        assert result.reloaded_at is not None, f"{name} was not reloaded after a cut reload"
    assert _table(lake) == _state(rt)
    postgres = {k: v[0] for k, v in table_rows(pg_dsn, "lossy_counts", "word").items()}
    assert postgres == _state(rt)


def test_a_rewind_below_the_reload_after_a_loss_never_brings_back_the_lost_timeline(
    tmp_path, server
):
    """The lost txids' rows stay in a table's history under the same stamps (Delta versions,
    Iceberg snapshots) after the reload that replaced them. A rewind to such a txid must not
    carry the table back to them: below its last reload a table goes back by the state."""
    from tridentflow import IcebergSink
    from tridentflow.ops.rewind import rewind_pipeline

    lake = tmp_path / "lake"
    lake.mkdir()
    catalog = {"type": "sql", "uri": f"sqlite:///{lake}/catalog.db",
               "warehouse": f"file://{lake}/warehouse"}  # fmt: skip

    def tables() -> Pipeline:
        p = Pipeline("lossy-lake", LogSource(fields=("line",), mode=SourceMode.OPAQUE,
                                             partitions=2), retain_txids=20)  # fmt: skip
        counts = (
            p.stream.each("line", lambda line: ((w,) for w in line.split()), "word")
            .group_by("word")
            .persistent_aggregate(StateSpec("counts", StateKind.OPAQUE), Count(), out_field="count")
        )
        counts.new_values_stream().sink(DeltaSink(lake / "counts", name="delta"))
        counts.new_values_stream().sink(IcebergSink("lake.counts", catalog, name="iceberg"))
        return p

    rt = Runtime(tables(), connect(server.url), tmp_path / "home")
    rt.source_heads()
    rt.log.append_spread([f"w{i % 7} x{i % 3}" for i in range(16)])
    for txid in range(1, 4):  # txids 1-3 exported; 2 and 3 then lost
        run_batches(rt, LocalEngine(), max_batches=1, batch_size=2)
        export(rt)
        if txid == 1:
            rt.client.save()  # what Redis will come back with
    _back_to_the_save(server)
    rt = Runtime(tables(), connect(server.url), tmp_path / "home")
    rt.log.append_spread([f"w{i % 5} y" for i in range(9)])
    run_batches(rt, LocalEngine(), max_batches=3, batch_size=5)  # other txids 2-4
    results = export(rt)
    assert {r.reloaded_at for r in results} == {4}  # the tables reloaded at txid 4
    run_batches(rt, LocalEngine(), max_batches=1, batch_size=5)
    export(rt)
    rewind_pipeline(rt, 2, force=True)  # below the reload: txid 2 is the lost one's too
    export(rt)
    want = _state(rt)
    assert _table(lake) == want
    iceberg = IcebergSink("lake.counts", catalog, name="iceberg")._table()
    got = {r["word"]: r["count"] for r in iceberg.scan().to_arrow().to_pylist()}
    assert got == want
