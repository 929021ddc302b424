"""The concurrent reader (as the ``read_committed`` consumer in Kafka's transaction tests):
while a schedule runs, a thread with a connection of its own - as another process would -
lists every recountable state again and again, each listing at the committed txid it names,
with the ledger history that txid stands on, and compares it with the recount of the source
as of that txid (``recount_txid_by_txid``): a listing
that shows txid T's values for some keys and T-1's for others - a half-committed txid, a
pending attempt's writes, values of a txid a rewind or a lost write took back - differs.

It reads the new-values streams too, as a ``read_committed`` consumer of a stream sink
does: each stream up to the position its companion hash names (the txids whose every entry
is in), and each txid there must hold exactly what that txid's commit wrote for the keys
that go to that stream (the harness's ``committed_changes``) - no entry missing, none extra,
none with another value. A position moved ahead of a txid's entries shows here even where
the export finishes later and the final comparison finds nothing.

It reads the sinks' tables outside Redis too (PostgreSQL, Delta, Iceberg), as their own
readers do: one snapshot of each table - PostgreSQL's REPEATABLE READ transaction reading the
progress row and the rows, a Delta version or an Iceberg snapshot carrying its own stamp -
must be the state exactly as of the txid it says it holds (the recount at that txid): a
table half-way between two txids, a reload seen part-way, or the rows of txids Redis lost
differ. A table is compared only while what it says it holds is this generation's, at most
what Redis committed and allowed it (before and after the read), and Redis was not
restarted meanwhile (a loss takes the allowed record back: rows past it are the lost
timeline's until the next export reloads them).

Each listing is checked at once, in the reader's thread, against the source as it is then,
and counted only if the pipeline's generation was the same before the listing and after its
check (a reset or a rewind meanwhile: nothing to compare with) and it came back whole (a
reshard or a restart meanwhile refuses it: another try). Reading is bounded: at most
``limit`` listings a schedule, one round of every state each PAUSE seconds.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from tridentflow.devtools.chaos.sinks import jsonish, lake_rows
from tridentflow.devtools.chaos.typed import KEY_FIELDS, VALUE_FIELD
from tridentflow.ops.audit import recount_txid_by_txid
from tridentflow.sinks import DeltaSink, IcebergSink, PostgresSink
from tridentflow.sinks.delta import delta_position
from tridentflow.sinks.iceberg import stamped
from tridentflow.sinks.lakehouse import app_id
from tridentflow.sinks.redisstream import RedisStreamSink, companion_key
from tridentflow.steps.query import list_state
from tridentflow.steps.runtime import Runtime
from tridentflow_state.changes import sink_allowed
from tridentflow_state.codec import encode_key
from tridentflow_state.ledger import HISTORY_LENGTH

if TYPE_CHECKING:
    from tridentflow.devtools.chaos.config import ScheduleResult

LIMIT = 40
"""Listings kept per schedule."""
Noted = tuple[str | None, dict[str, dict[int, dict[str, str]]]]
"""(the lineage, sink -> txid -> key -> value text) the harness noted at each commit."""
PAUSE = 0.03
"""Seconds between two rounds of listings."""


@dataclass(frozen=True)
class Listing:
    """State ``state`` as one listing read it at committed txid ``txid`` (key -> the value
    as presented, by encoded key), and the history entries of txids 1..txid it stood on."""

    state: str
    txid: int
    values: dict[str, Any]
    history: dict[int, dict[str, Any]]

    def fingerprint(self) -> str:
        """The history's ranges: listings standing on the same history share a recount."""
        return json.dumps({t: e.get("ranges") for t, e in sorted(self.history.items())})


class ConcurrentReader:
    """Lists states in a thread of its own while the schedule runs (a context manager), and
    checks each listing at once against the recount as of its txid - the source as it is
    then (a reset may delete and rewrite it later)."""

    def __init__(
        self,
        open_runtime: Callable[[], Runtime],
        limit: int = LIMIT,
        changes: Callable[[], Noted] | None = None,
        postgres_dsn: str | None = None,
    ) -> None:
        """``changes``: the lineage they were noted in (None: none yet) and what each stream
        sink's txids wrote, as the harness noted it at each commit (sink -> txid -> key ->
        value text; asked again each time: it is replaced when Redis goes back to a
        snapshot, and cleared by a reset). ``postgres_dsn``: where the PostgreSQL sinks'
        tables are (None: those are not read)."""
        self.open_runtime = open_runtime
        self.limit = limit
        self.changes = changes
        self.stream_reads = 0
        """Stream reads checked: (stream, txid) pairs compared with what the txid wrote."""
        self.postgres_dsn = postgres_dsn
        self.table_reads = 0
        """Table snapshots compared with the recount at the txid they hold."""
        self.lake_reads = 0
        """Of those, Delta and Iceberg tables' (the rest: PostgreSQL's)."""
        self.listings = 0
        self.verified = 0
        self.refused = 0
        self.problems: list[str] = []
        self._recounts: dict[tuple[bytes | None, int, str], dict[str, dict[str, Any]]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-reader", daemon=True)

    def __enter__(self) -> ConcurrentReader:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def first_difference(self) -> str | None:
        """The first listing that was not a committed txid's state, whole, in one line."""
        return self.problems[0] if self.problems else None

    def report(self, result: ScheduleResult) -> None:
        """Into the schedule's result: the first difference (if the schedule had none) and
        how many listings, stream, table and lakehouse reads were checked."""
        result.difference = result.difference or self.first_difference()
        result.events.append(f"reader:{self.verified}")
        result.events.append(f"reader-streams:{self.stream_reads}")
        result.events.append(f"reader-tables:{self.table_reads}")
        result.events.append(f"reader-lakes:{self.lake_reads}")

    def _run(self) -> None:
        rt = None
        try:
            while not self._stop.is_set() and self.listings < self.limit and not self.problems:
                try:
                    rt = rt or self.open_runtime()
                    for name in sorted(n for n, p in rt.pipeline.states.items() if p.recountable):
                        self._check(rt, name)
                    if self.changes is not None:
                        self._check_streams(rt)
                    for feed in rt.pipeline.feeds:
                        if self.table_reads < self.limit and _table_reader(feed.sink):
                            self._check_table(rt, feed)
                except Exception:  # Redis restarted, a reshard, "list it again": next round
                    self.refused += 1
                self._stop.wait(PAUSE)
        finally:
            if rt is not None:
                rt.client.close()

    def _check(self, rt: Runtime, name: str) -> None:
        generation = rt.client.get(rt.keyspace.generation)
        page = list_state(rt, rt.pipeline.states[name], limit=100_000)
        history = {e["txid"]: e for e in rt.ledger.history(HISTORY_LENGTH)
                   if e["txid"] <= page.committed}  # fmt: skip
        if page.next is not None or page.committed == 0:
            return
        values = {encode_key(key): value for key, value in page.items}  # True == 1 as tuples
        listing = Listing(name, page.committed, values, history)
        expected = self._recount(rt, generation, listing)
        if rt.client.get(rt.keyspace.generation) != generation or expected is None:
            self.refused += 1  # a reset or rewind meanwhile, or the history is gone
            return
        self.listings += 1
        problem = _differs(rt, listing, expected[name])
        if problem:
            self.problems.append(problem)
        else:
            self.verified += 1

    def _check_streams(self, rt: Runtime) -> None:
        """Every stream sink's streams read as a ``read_committed`` consumer reads them (up
        to the position), each txid there against what its commit wrote; counted only if the
        pipeline's generation stood still meanwhile."""
        generation = rt.client.get(rt.keyspace.generation)
        lineage, noted = self.changes()
        wrote = {name: dict(by_txid) for name, by_txid in list(noted.items())}
        if lineage is None or self.changes()[0] != lineage:
            return  # a reset meanwhile: the notes are another lineage's
        problems, reads = [], 0
        for feed in rt.pipeline.feeds:
            if isinstance(feed.sink, RedisStreamSink) and feed.name in wrote:
                for stream in feed.sink.streams():
                    found = _stream_problem(rt, feed, stream, lineage, wrote[feed.name])
                    reads += found[0]
                    problems += found[1:]
        if rt.client.get(rt.keyspace.generation) != generation:
            self.refused += 1  # a reset or rewind meanwhile: nothing to compare with
            return
        self.stream_reads += reads
        self.problems += problems

    def _check_table(self, rt: Runtime, feed: Any) -> None:
        """One snapshot of ``feed``'s table against the recount at the txid it holds, if
        that is a txid of this generation Redis committed and allowed it, and Redis went on
        (no restart) while it was read."""
        persist = rt.pipeline.states[feed.state]
        if not persist.recountable:
            return
        before = _redis_now(rt, feed)
        generation = before[0]
        if generation is None:
            return
        held, rows = _table_snapshot(feed.sink, rt.pipeline.name, generation.decode(),
                                     self.postgres_dsn)  # fmt: skip
        after = _redis_now(rt, feed)
        history = {e["txid"]: e for e in rt.ledger.history(HISTORY_LENGTH) if e["txid"] <= held}
        committed = rt.ledger.committed_txid()
        allowed = min(before[2] or 0, after[2] or 0)
        if held == 0 or after[:2] != before[:2] or not held <= min(allowed, committed):
            return  # nothing yet, a reset, rewind or restart meanwhile, or the lost timeline's
        listing = Listing(feed.state, held, {}, history)
        expected = self._recount(rt, generation, listing)
        if _redis_now(rt, feed)[:2] != before[:2] or expected is None:
            self.refused += 1
            return
        self.table_reads += 1
        self.lake_reads += not isinstance(feed.sink, PostgresSink)
        agg = persist.aggregator
        typed = feed.name.startswith("typed-")  # compared as numbers: see _typed
        want = {k: jsonish(float(agg.present(v)) if typed else agg.present(v))
                for k, v in expected[feed.state].items()}  # fmt: skip
        for key in sorted(want.keys() | rows.keys()):
            if want.get(key) != rows.get(key):
                self.problems.append(
                    f"a reader of sink {feed.name}'s table saw txid {held} (its own stamp) "
                    f"with {key} = {rows.get(key, 'no row')}; that txid committed "
                    f"{want.get(key, 'no such key')}"
                )
                return

    def _recount(
        self, rt: Runtime, generation: bytes | None, listing: Listing
    ) -> dict[str, dict[str, Any]] | None:
        """The recountable states right after the listing's txid, from its history (kept per
        generation, txid and history: listings mostly repeat a txid); None if the history
        lacks a txid up to it (the entry is written just after the mark)."""
        key = (generation, listing.txid, listing.fingerprint())
        if key not in self._recounts:
            names = sorted(n for n, p in rt.pipeline.states.items() if p.recountable)
            recounts = recount_txid_by_txid(rt, names, listing.history, listing.txid)
            last = None
            for txid, values in recounts:
                if txid == listing.txid:
                    last = {n: dict(v) for n, v in values.items()}
            if last is None:
                return None
            self._recounts[key] = last
        return self._recounts[key]


def _stream_problem(
    rt: Runtime, feed: Any, stream: str, lineage: str, wrote: dict[int, dict[str, str]]
) -> tuple[Any, ...]:
    """(txids compared, the first problem if any) of one stream read up to its position."""
    sink_id = f"{rt.pipeline.name}/{feed.sink.name}"
    gen, base, pos = rt.client.hmget(
        companion_key(stream), f"{sink_id}:generation", f"{sink_id}:base", f"{sink_id}:txid"
    )
    if gen is None or gen.decode() != lineage or base is None or not int(pos or 0):
        return (0,)
    base, pos = int(base), int(pos)
    seen: dict[int, dict[str, str]] = {}
    for entry_id, fields in rt.client.xrange(stream, f"{base + 1}-0", str(base + pos)):
        txid = int(entry_id.decode().split("-")[0]) - base
        seen.setdefault(txid, {})[fields[b"key"].decode()] = fields[b"value"].decode()
    compared = 0
    for txid in sorted(t for t in wrote if t <= pos):
        want = {k: v for k, v in wrote[txid].items() if feed.sink.stream_of([k]) == stream}
        got = seen.get(txid, {})
        compared += 1
        if got != want:
            key = sorted(set(got.items()) ^ set(want.items()))[0][0]
            return compared, (
                f"a read_committed reader of {stream} (position txid {pos}) saw txid {txid} "
                f"with {key} = {got.get(key, 'no entry')}; that txid's commit wrote "
                f"{want.get(key, 'nothing for it')}"
            )
    return (compared,)


def _differs(rt: Runtime, listing: Listing, expected: dict[str, Any]) -> str | None:
    agg = rt.pipeline.states[listing.state].aggregator
    want = {k: agg.present(v) for k, v in expected.items()}
    for key in sorted(want.keys() | listing.values.keys()):
        if want.get(key) != listing.values.get(key):
            return (
                f"a concurrent reader listed {listing.state} at txid {listing.txid} with "
                f"{key} = {listing.values.get(key)!r}; that txid committed "
                f"{want.get(key)!r}"
            )
    return None


def _table_reader(sink: Any) -> bool:
    """Whether the reader reads this sink as a table (its own snapshot)."""
    return isinstance(sink, PostgresSink | DeltaSink | IcebergSink)


def _redis_now(rt: Runtime, feed: Any) -> tuple[bytes | None, Any, int | None]:
    """(the pipeline's generation, the server(s) answering - a restart changes them - and
    what Redis allowed ``feed``'s sink to apply)."""
    generation = rt.client.get(rt.keyspace.generation)
    info = rt.client.info("server")
    servers = info.get("run_id") or tuple(sorted(str(i.get("run_id")) for i in info.values()))
    return generation, servers, sink_allowed(rt.client, rt.keyspace, feed.name)


def _table_snapshot(
    sink: Any, pipeline: str, generation: str, dsn: str | None
) -> tuple[int, dict[str, str]]:
    """(the txid one snapshot of the sink's table says it holds in ``generation``, 0 if none
    or another generation's; its rows, key -> value as JSON text), read in one snapshot."""
    stamp = SimpleNamespace(pipeline=pipeline, generation=generation)
    if isinstance(sink, PostgresSink):
        return _postgres_snapshot(sink, pipeline, generation, dsn) if dsn else (0, {})
    if isinstance(sink, DeltaSink):
        table = sink._table()  # one version: its stamp and its rows
        if table is None:
            return 0, {}
        held = delta_position(table, app_id(stamp, sink.name))
        rows = table.to_pyarrow_table().to_pylist() if held else []
    else:
        table = sink._table()  # one snapshot of the metadata: its stamps and its files
        if table is None:
            return 0, {}
        held = stamped(table, app_id(stamp, sink.name))
        rows = table.scan().to_arrow().to_pylist() if held else []
    if sink.name.startswith("typed-"):
        return held, _typed(rows)
    return held, lake_rows(sink, rows)


def _typed(rows: list[dict[str, Any]]) -> dict[str, str]:
    """A typed table's rows as the reader compares them: the key's canonical encoding, the
    total as a float's JSON (an int in a double column is the same number)."""
    return {encode_key(tuple(r[f] for f in KEY_FIELDS)): jsonish(float(r[VALUE_FIELD]))
            for r in rows}  # fmt: skip


def _postgres_snapshot(
    sink: PostgresSink, pipeline: str, generation: str, dsn: str
) -> tuple[int, dict[str, str]]:
    """As a reader should (docs/sinks.md): the table and the progress row locked ACCESS SHARE
    before the REPEATABLE READ snapshot is taken - a widening's ALTER COLUMN TYPE rewrites
    the table, and PostgreSQL shows a rewritten table empty to a snapshot older than the
    rewrite (its "MVCC caveats"); the lock makes the rewrite wait for the reader instead."""
    import psycopg

    with psycopg.connect(dsn) as conn:
        found = conn.execute(
            "SELECT to_regclass('tridentflow_progress') IS NOT NULL, to_regclass(%s) IS NOT NULL",
            (sink.table,),
        ).fetchone()
        conn.rollback()
        if not all(found):
            return 0, {}
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        with conn.transaction():
            # LOCK takes no snapshot: the first SELECT after it does (dropped meanwhile - the
            # schedule's end - raises UndefinedTable: a refused read, as any error here)
            conn.execute(f'LOCK TABLE tridentflow_progress, "{sink.table}" IN ACCESS SHARE MODE')
            row = conn.execute(
                "SELECT generation, txid FROM tridentflow_progress WHERE pipeline = %s "
                "AND sink = %s",
                (pipeline, sink.name),
            ).fetchone()
            if row is None or row[0] != generation or not row[1]:
                return 0, {}
            if sink.name.startswith("typed-"):
                names = (*KEY_FIELDS, VALUE_FIELD)
                fields = ", ".join(f'"{f}"' for f in names)
                typed = conn.execute(f'SELECT {fields} FROM "{sink.table}"').fetchall()
                found = [dict(zip(names, r, strict=True)) for r in typed]
                for r in found:  # "" back to None (typed.add_typed_sinks)
                    r.update({f: r[f] or None for f in KEY_FIELDS})
                return int(row[1]), _typed(found)
            rows = conn.execute(f'SELECT key, value FROM "{sink.table}"').fetchall()
    return int(row[1]), {key: jsonish(value) for key, value in rows}
