"""Export: each sink of a pipeline brought up to the committed txid, txid by txid.

``export(rt)`` runs after commits (the CLI's ``run`` after each one, Airflow's ``export`` task
after ``commit``; ``tridentflow export`` by hand). For each sink: its position comes from the
sink's own store, then every committed txid after it is read from the change log
(state.changes), turned into tuples (key fields, new value; None for a removed key), passed
through the new-values stream's operations and applied by the sink - atomically, idempotently,
in order. A sink lags the commits, never blocks them: an export that fails leaves the sink where
it was, and the next export catches up from there.

A sink further behind than the change log (``Pipeline.change_log_limit`` txids) reloads the
whole state as of the committed txid in one step, if it can (``Sink.resyncable``:
PostgresSink); otherwise the export fails with one line. Once every sink of a state passed a
txid, its change log is dropped - so a log found gone is first checked against the sink's own
position again: an exporter racing this one may have applied that txid and dropped its log
since this one read the position (neither a refusal nor a reload, then).
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from redis.exceptions import LockError

from tridentflow.errors import TridentflowError
from tridentflow.pipeline import Feed
from tridentflow.plan import Expander, compile_chain
from tridentflow.sinks.base import (
    CarriesBack,
    ExportContext,
    ReloadNeededError,
    Row,
    SinkError,
    SinkRefusedError,
)
from tridentflow.sinks.lakehouse import column_array, stamp_of
from tridentflow.steps.runtime import Runtime
from tridentflow_state.changes import (
    allow_sink,
    change_count,
    drop_changes,
    logged_txids,
    note_sink_position,
    read_change_pages,
    sink_allowed,
    sink_positions,
)
from tridentflow_state.codec import encode_key, tuple_key
from tridentflow_state.shards import with_stored_layout

SNAPSHOT_PAGE = 10_000
SNAPSHOT_TRIES = 5


@dataclass(frozen=True)
class ExportResult:
    """What one export did for one sink."""

    sink: str
    state: str
    position: int
    """The sink's last applied txid after this export."""
    applied: tuple[int, ...] = ()
    rows: int = 0
    reloaded_at: int | None = None
    """Set when the sink reloaded the whole state as of this txid (it fell behind)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "sink": self.sink,
            "state": self.state,
            "position": self.position,
            "applied": list(self.applied),
            "rows": self.rows,
            "reloaded_at": self.reloaded_at,
        }


FireHook = Callable[[Feed, str, int], None]
"""Called with (feed, point, txid) where a sink is part-way through a txid: ``mid-export``
(once per txid), ``between-parts`` (a sink of several parts, after each part that has it).
The chaos harness kills PostgreSQL sessions, raises foreign errors and crashes there."""


def context(rt: Runtime, feed: Feed | None = None, hook: FireHook | None = None) -> ExportContext:
    """What a sink sees of the pipeline; with faults armed (tests, chaos), ``fire`` counts
    the export attempts of each (sink, txid) in Redis and fires the armed ones."""
    base = ExportContext(
        rt.pipeline.name,
        rt.ledger.generation,
        rt.client,
        rt.redis_url,
        replicas=rt.replicas,
        replica_timeout_ms=rt.replica_timeout_ms,
        lineage=rt.ledger.lineage(),
        generation_now=rt.ledger.current_generation,
        connections=rt.connections,
        note_version=(lambda txid, version: note_table_version(rt, feed, txid, version))
        if feed is not None
        else lambda txid, version: None,
        exclusive=(lambda: sink_lock(rt, feed)) if feed is not None else contextlib.nullcontext,
    )
    if not rt.faults.faults and hook is None:
        return base
    sink = "" if feed is None else feed.name

    def fire(point: str, txid: int) -> None:
        if hook is not None and feed is not None:
            hook(feed, point, txid)
        if rt.faults.faults and point == "mid-export":  # the one point faults name
            attempt = int(rt.client.hincrby(rt.keyspace.sink_attempts, f"{sink}:{txid}", 1))
            rt.faults.fire(point, txid, attempt)

    return replace(base, fire=fire)


SINK_LOCK_S = 15
"""The lease of one exporter's hold on a sink's lock: renewed every third of it while the
exporter lives, so a killed exporter stops another one for at most this long."""
SINK_LOCK_WAIT_S = 120
"""How long an exporter waits for a sink's lock before it fails (the next export retries)."""


def sink_lock(rt: Runtime, feed: Feed) -> Any:
    """One exporter of the sink at a time (see ``LeasedLock``)."""
    return LeasedLock(rt.client, rt.keyspace.sink_lock(feed.name), f"sink {feed.name}")


class LeasedLock:
    """redis-py's Lock as a lease: taken for SINK_LOCK_S, renewed by a thread every third of
    it until released, so a holder that died frees the sink within SINK_LOCK_S (never the
    length of a write). An exporter that has to wait says once on stderr what it waits for;
    SinkError (one line) after SINK_LOCK_WAIT_S."""

    def __init__(self, client: Any, name: str, what: str) -> None:
        self.lock = client.lock(name, timeout=SINK_LOCK_S, thread_local=False)
        self.name, self.what = name, what
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def __enter__(self) -> LeasedLock:
        if not self.lock.acquire(blocking=False):
            sys.stderr.write(
                f"tridentflow: {self.what}: waiting for another exporter's lock on it (its "
                f"lease ends within {SINK_LOCK_S:.0f} s unless that exporter lives to renew it)\n"
            )
            if not self.lock.acquire(blocking=True, blocking_timeout=SINK_LOCK_WAIT_S):
                raise SinkError(
                    f"{self.what}: another exporter held it for over {SINK_LOCK_WAIT_S} s "
                    "(still writing): export again later"
                )
        self._renewer = threading.Thread(target=self._renew, daemon=True, name=self.name)
        self._renewer.start()
        return self

    def _renew(self) -> None:
        while not self._stop.wait(SINK_LOCK_S / 3):
            try:
                self.lock.reacquire()
            except Exception:  # lost (Redis away, the lease ran out): the store fences writes
                return

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
        with contextlib.suppress(LockError):  # a lease that ran out is no one's to release
            self.lock.release()


TABLE_VERSIONS_KEPT = 50
"""Txids whose table version a lakehouse sink's mirror keeps (at least: retain_txids more)."""


def table_versions_key(rt: Runtime, feed: Feed) -> str:
    """The hash txid -> table version (Delta) or snapshot id (Iceberg) of a sink."""
    return rt.keyspace.sink_versions(feed.name)


def note_table_version(rt: Runtime, feed: Feed, txid: int, version: Any) -> None:
    """Mirror which table version holds ``txid`` (best effort: the table is the truth); the
    oldest beyond what ``status`` shows and a rewind may need are dropped."""
    key = table_versions_key(rt, feed)
    with contextlib.suppress(Exception):
        rt.client.hset(key, str(int(txid)), str(version))
        keep = max(TABLE_VERSIONS_KEPT, rt.retain_txids)
        old = [f for f in rt.client.hkeys(key) if int(f) <= int(txid) - keep]
        if old:
            rt.client.hdel(key, *old)


def table_versions(rt: Runtime, feed: Feed) -> dict[int, str]:
    """txid -> table version or snapshot id, as mirrored (newest last)."""
    raw = rt.client.hgetall(table_versions_key(rt, feed))
    found = {int(k): (v.decode() if isinstance(v, bytes) else v) for k, v in raw.items()}
    return dict(sorted(found.items()))


def pick_feeds(rt: Runtime, names: Sequence[str] | None) -> list[Feed]:
    """The feeds named, in that order (an empty list: none); every feed for None. A name the
    pipeline has no sink of is one line naming its sinks."""
    feeds = rt.pipeline.feeds
    if names is not None:
        known = {f.name: f for f in feeds}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise TridentflowError(
                f"pipeline {rt.pipeline.name} has no sink {unknown[0]!r} (sinks: {sorted(known)})"
            )
        return [known[n] for n in names]
    return list(feeds)


Change = tuple[bytes | str, tuple[Any, ...], Any]
"""(encoded key: the fixed order, key fields, presented value or None for a removed key)."""


def stream_rows(items: list[Change], expand: Expander) -> list[Row]:
    """The stream's tuples for changes, in encoded-key order (a fixed order: a stream sink
    derives entry IDs from it): each new-values tuple through the stream's operations."""
    items.sort(key=lambda item: item[0])
    if not expand.steps:
        return [(*key, value) for _field, key, value in items]
    rows: list[Row] = []
    for _field, key, value in items:
        rows.extend(expand((*key, value)))
    return rows


def changes_of(rt: Runtime, feed: Feed, txid: int) -> list[Change] | None:
    """Every key txid changed in the feed's state with its new committed value as the
    aggregator presents it (None: removed); None if its change log is gone (or never
    written). Keys and values are decoded a page at a time (one JSON parse per page)."""
    pages = _change_pages(rt, feed, txid)
    if pages is None:
        return None
    present = rt.pipeline.states[feed.state].aggregator.present
    return [
        (field, tuple_key(key), None if value[1] is None else present(value[1]))
        for fields, keys, stored in pages
        for field, key, value in zip(fields, keys, stored, strict=True)
    ]


def change_table(rt: Runtime, feed: Feed, txid: int) -> Any | None:
    """``changes_of`` as one Arrow table of the stream's fields (the key fields, then the
    value), in encoded-key order - for a sink that ``takes_arrow`` of a stream with no
    operations: built column by column, no tuple per row. None if the change log is gone."""
    import pyarrow as pa
    import pyarrow.compute as pc

    pages = _change_pages(rt, feed, txid)
    if pages is None:
        return None
    present = rt.pipeline.states[feed.state].aggregator.present
    names = list(feed.node.fields)
    order = pc.sort_indices(pa.array([f for fields, _, _ in pages for f in fields], pa.binary()))
    keys = [key for _, page_keys, _ in pages for key in page_keys]
    columns: dict[str, Any] = {
        name: column_array(name, [_tupled(key[i]) for key in keys], key=True)
        for i, name in enumerate(names[:-1])
    }
    values = [None if v[1] is None else present(v[1]) for _, _, stored in pages for v in stored]
    columns[names[-1]] = column_array(names[-1], values)
    return pa.table(columns).take(order)


def _tupled(value: Any) -> Any:
    """A decoded key field as the key tuple holds it (a JSON list as a tuple)."""
    return tuple_key(value) if isinstance(value, list) else value


def _change_pages(
    rt: Runtime, feed: Feed, txid: int
) -> list[tuple[list[bytes], list[Any], list[Any]]] | None:
    """txid's change log of the feed's state as decoded pages (encoded keys, key lists,
    stored [prev, curr] pairs); None if it is gone, or was dropped while it was read."""
    count = change_count(rt.client, rt.keyspace, feed.state, txid)
    if count is None:
        return None
    pages: list[tuple[list[bytes], list[Any], list[Any]]] = []
    for page in read_change_pages(rt.client, rt.keyspace, feed.state, txid):
        fields = list(page)
        keys = json.loads(b"[" + b",".join(fields) + b"]")
        stored = json.loads(b"[" + b",".join(page.values()) + b"]")
        pages.append((fields, keys, stored))
    if sum(len(fields) for fields, _, _ in pages) != count:  # dropped while read
        if with_stored_layout(rt.client, rt.keyspace) != rt.keyspace:
            raise TridentflowError(  # not gone: moved by a reshard since this process began
                f"state {feed.state} moved to another shard layout (`tridentflow reshard`) "
                "while exported: export again"
            )
        return None
    return pages


def snapshot_of(rt: Runtime, feed: Feed) -> tuple[int, list[Change]]:
    """(committed txid C, every key of the feed's state with its value as of C)."""
    from tridentflow.steps.query import list_state

    persist = rt.pipeline.states[feed.state]
    for _ in range(SNAPSHOT_TRIES):
        items: list[Change] = []
        try:
            page = list_state(rt, persist, SNAPSHOT_PAGE)
            committed = page.committed
            while True:
                items += [(encode_key(k), k, v) for k, v in page.items]
                if page.next is None:
                    return committed, items
                page = list_state(rt, persist, SNAPSHOT_PAGE, page.next)
        except TridentflowError:
            continue  # the state moved twice under the listing: list it again
    raise SinkError(
        f"sink {feed.name}: the state {feed.state} kept changing while it was read for a "
        "reload; export again"
    )


def export_feed(
    rt: Runtime,
    feed: Feed,
    upto: int | None = None,
    resync: bool = False,
    hook: FireHook | None = None,
) -> ExportResult:
    """Bring one sink up to ``upto`` (default: the committed txid); ``resync`` reloads it
    from the whole state first. Ordered and idempotent: two exports at once apply each txid
    once (the sink's own store decides).

    Whatever goes wrong - the sink's driver, a value its store refuses, the stream's own
    operations, tridentflow itself - ends in one ``SinkError`` naming the sink, the txid and
    the cause (recorded with the sink for ``status``, the view and the metrics): the caller
    lets the sink lag and the commits go on. Only a simulated crash passes through."""
    attempt = _Attempt()
    try:
        result = _export_feed(rt, feed, upto, resync, hook, attempt)
    except Exception as exc:
        failure = exc if isinstance(exc, SinkError) else _sink_failure(feed, attempt, exc)
        _note_failure(rt, feed, attempt, str(failure))
        if failure is exc:
            raise
        raise failure from exc
    _forget_failure(rt, feed)
    return result


@dataclass
class _Attempt:
    """How far an export got: the txid it was applying (None: before any)."""

    txid: int | None = None


def _sink_failure(feed: Feed, attempt: _Attempt, exc: BaseException) -> SinkError:
    """``exc`` (any error) as the one line a failed export says."""
    what = "" if attempt.txid is None else f"txid {attempt.txid} not applied, "
    lone = exc.args[0] if len(exc.args) == 1 and isinstance(exc.args[0], str) else None
    text = (lone if lone is not None else str(exc)).strip()  # KeyError's str() adds quotes
    cause = f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__
    if isinstance(exc, TridentflowError):
        cause = text.splitlines()[0] if text else type(exc).__name__
    try:
        target = feed.sink.describe()
    except Exception:  # a sink of the user's that cannot even describe itself
        target = type(feed.sink).__name__
    if isinstance(exc, TridentflowError) and not exc.retry_helps:
        return SinkRefusedError(f"sink {feed.name} ({target}): {what}{cause}")
    return SinkError(
        f"sink {feed.name} ({target}): {what}{cause} (the sink lags; the commits "
        "go on and the next export retries from its position)"
    )


def _note_failure(rt: Runtime, feed: Feed, attempt: _Attempt, line: str) -> None:
    """Record the failure with the sink (best effort: Redis may be what failed)."""
    entry = {"error": line, "txid": attempt.txid, "at_ms": int(time.time() * 1000)}
    with contextlib.suppress(Exception):
        rt.client.hset(sink_errors_key(rt), feed.name, json.dumps(entry, sort_keys=True))


def _forget_failure(rt: Runtime, feed: Feed) -> None:
    with contextlib.suppress(Exception):
        rt.client.hdel(sink_errors_key(rt), feed.name)


def sink_errors_key(rt: Runtime) -> str:
    """The hash of each failing sink's last failure (name -> {error, txid, at_ms})."""
    return rt.keyspace.sink_errors


def sink_errors(rt: Runtime) -> dict[str, dict[str, Any]]:
    """Each sink whose last export failed: its one line, the txid and when."""
    raw = rt.client.hgetall(sink_errors_key(rt))
    return {(k.decode() if isinstance(k, bytes) else k): json.loads(v) for k, v in raw.items()}


def _export_feed(
    rt: Runtime,
    feed: Feed,
    upto: int | None,
    resync: bool,
    hook: FireHook | None,
    attempt: _Attempt,
) -> ExportResult:
    """The sink brought from its position to ``upto`` (the committed txid if None), txid by
    txid from the change log, or reloaded from the state where the log cannot (or must not)
    serve it. Ordered; each step idempotent (a sink applies a txid once)."""
    owed = rt.client.hget(rt.keyspace.sinks_reload, feed.name) is not None
    ctx = replace(context(rt, feed, hook), resync=resync or owed)
    committed = rt.ledger.committed_txid()
    rt.require_replicated(  # never export a commit a failover could still take back
        f"txid {committed}'s commit",
        f"sink {feed.name} not exported past it yet; export again once the replicas caught up",
        shards=True,
    )
    target = committed if upto is None else min(upto, committed)
    position = feed.sink.position(ctx)
    ctx = _checked_start(rt, feed, ctx, position, committed)
    expand = compile_chain(feed.node)
    applied: list[int] = []
    rows_total = 0
    reloaded: int | None = None
    must_reload = ctx.resync
    if position < target and not must_reload:  # one record for every txid it may apply,
        allow_sink(rt.client, rt.keyspace, feed.name, target, ctx.generation)  # before any
    while must_reload or position < target:
        txid = attempt.txid = position + 1
        rows = None if must_reload else _logged_rows(rt, feed, txid, expand)
        if rows is None and not must_reload:
            moved = _passed_meanwhile(feed, ctx, txid)
            if moved is not None:
                position = moved
                continue
        if rows is None:
            reloaded, reloaded_rows = _reload(rt, feed, ctx, expand, position, target, attempt)
            position, must_reload = reloaded, False
            applied.append(reloaded)
            rows_total += reloaded_rows
            continue
        try:
            done = feed.sink.apply(ctx, txid, rows)
        except ReloadNeededError:  # what the sink holds does not reach txid - 1: reload it
            must_reload = True
            continue
        if done:
            applied.append(txid)
            rows_total += len(rows)
        position = txid
        _note(rt, feed, txid, ctx.generation)
    _note(rt, feed, position, ctx.generation)
    if owed:
        rt.client.hdel(rt.keyspace.sinks_reload, feed.name)
    _drop_exported(rt, feed.state)
    return ExportResult(feed.name, feed.state, position, tuple(applied), rows_total, reloaded)


def _checked_start(
    rt: Runtime, feed: Feed, ctx: ExportContext, position: int, committed: int
) -> ExportContext:
    """``ctx``, set to reload where the sink's copy of lost txids is stale; a sink past the
    commits otherwise refused in one line (never exported over)."""
    if not ctx.resync and _lost_under(rt, feed, position):
        return replace(ctx, resync=True)
    if position > committed and not ctx.resync:
        raise SinkRefusedError(
            f"sink {feed.name} is at txid {position} but pipeline {rt.pipeline.name} has "
            f"committed only {committed} (Redis lost commits in a failover?): export with "
            "--resync to reload it from the state"
        )
    return ctx


def _logged_rows(rt: Runtime, feed: Feed, txid: int, expand: Expander) -> Any | None:
    """Txid ``txid``'s rows for the sink from the change log (an Arrow table where the sink
    takes one and no operation runs on the stream), None where the log is gone."""
    if feed.sink.takes_arrow and not expand.steps:
        return change_table(rt, feed, txid)
    items = changes_of(rt, feed, txid)
    return None if items is None else stream_rows(items, expand)


def _passed_meanwhile(feed: Feed, ctx: ExportContext, txid: int) -> int | None:
    """The sink's position if it stands at ``txid`` or past it now: a racing exporter applied
    it (and, every sink of the state past it, dropped its change log) since this one read the
    position. None: the sink is still before ``txid``."""
    moved = feed.sink.position(ctx)
    return moved if moved >= txid else None


def _reload(
    rt: Runtime,
    feed: Feed,
    ctx: ExportContext,
    expand: Expander,
    position: int,
    target: int,
    attempt: _Attempt,
) -> tuple[int, int]:
    """The whole state as of its committed txid written over the sink: that txid and how
    many rows. Refused in one line for a sink that cannot reload. Idempotent: a
    reload cut short is redone whole by the next export."""
    if not feed.sink.resyncable:
        raise SinkRefusedError(
            f"sink {feed.name} is at txid {position}, but the change log of txid "
            f"{position + 1} is gone (kept for {rt.pipeline.change_log_limit} txids: "
            f"change_log_limit): what it missed cannot be replayed into "
            f"{feed.sink.describe()}; raise change_log_limit and reset its readers"
        )
    at, snapshot = snapshot_of(rt, feed)
    attempt.txid = at
    rows = stream_rows(snapshot, expand)
    feed.sink.apply(ctx, at, rows, replace_all=True)
    # after, never before (nor the record above): a reload cut short leaves the sink
    # past what Redis allowed, so the next export reloads it again (one done twice
    # is the same reload); recorded first, the lost txids' rows would pass for allowed
    allow_sink(rt.client, rt.keyspace, feed.name, max(at, target), ctx.generation)
    _note(rt, feed, at, ctx.generation)
    return at, len(rows)


def owe_reloads(rt: Runtime, state: str, why: str) -> list[str]:
    """Every sink of ``state`` that can reload reloads at its next export (``why`` recorded);
    the sinks that cannot (a stream its readers read) are returned - their rows stay as
    written. Idempotent."""
    cannot = []
    for feed in rt.pipeline.feeds_of(state):
        if feed.sink.resyncable:
            rt.client.hset(rt.keyspace.sinks_reload, feed.name, why)
        else:
            cannot.append(feed.name)
    return cannot


def _lost_under(rt: Runtime, feed: Feed, position: int) -> bool:
    """Whether the sink's own store stands past the highest txid Redis allowed it to apply:
    Redis lost acknowledged writes since (a cut AOF, an older snapshot restored, a failover
    without ``--wait-replicas``), and the txids the pipeline recommits may differ from the
    sink's copy (an opaque source's replay). A sink that can then reloads from the state;
    one that cannot is refused in one line - never left holding the old rows."""
    allowed = sink_allowed(rt.client, rt.keyspace, feed.name)
    if allowed is None or position <= allowed:
        return False
    if not feed.sink.resyncable:
        raise SinkRefusedError(
            f"sink {feed.name} holds txids up to {position}, but Redis allowed it only up to "
            f"{allowed}: Redis lost acknowledged commits since (a cut AOF, an older snapshot, a "
            f"failover without --wait-replicas) and its rows of txids {allowed + 1}-{position} "
            "may differ from their recomputation; it cannot be reloaded: reset it and its "
            "readers"
        )
    return True


def _note(rt: Runtime, feed: Feed, txid: int, generation: str) -> None:
    note_sink_position(rt.client, rt.keyspace, feed.name, feed.state, txid, generation)


def _drop_exported(rt: Runtime, state: str) -> None:
    """Drop the change logs every sink of ``state`` (in this pipeline's definition) applied."""
    recorded = sink_positions(rt.client, rt.keyspace)
    feeds = rt.pipeline.feeds_of(state)
    if not feeds:
        return
    lowest = min(int(recorded.get(f.name, {}).get("txid", 0)) for f in feeds)
    if lowest > 0:
        drop_changes(rt.client, rt.keyspace, state, lowest)


def export(
    rt: Runtime,
    sinks: Sequence[str] | None = None,
    upto: int | None = None,
    resync: bool = False,
    hook: FireHook | None = None,
) -> list[ExportResult]:
    """Export every sink (or those named) up to ``upto`` (default: the committed txid). Every
    sink is tried; the first failure is raised after the others ran (one sink's outage does
    not hold the others back)."""
    results, failures = export_each(rt, sinks, upto, resync, hook)
    if failures:
        raise next(iter(failures.values()))
    return results


def export_each(
    rt: Runtime,
    sinks: Sequence[str] | None = None,
    upto: int | None = None,
    resync: bool = False,
    hook: FireHook | None = None,
) -> tuple[list[ExportResult], dict[str, Exception]]:
    """Every sink (or those named) tried up to ``upto``, each on its own: the results, and
    each failing sink's one ``SinkError`` by name, in the pipeline's order."""
    results: list[ExportResult] = []
    failures: dict[str, Exception] = {}
    for feed in pick_feeds(rt, sinks):
        try:
            results.append(export_feed(rt, feed, upto, resync, hook))
        except Exception as exc:
            failures[feed.name] = exc
        finally:
            close_sink(feed)
    return results, failures


def close_sink(feed: Feed) -> None:
    """Release the sink's connections; a sink that fails even at that is left be (its next
    apply opens them again)."""
    with contextlib.suppress(Exception):
        feed.sink.close()


def sink_status(rt: Runtime) -> list[dict[str, Any]]:
    """Each sink's recorded position and lag in txids (from the pipeline's Redis: the mirror
    each export updates), the change logs kept for its state, and its last export's
    failure (``error``: one line, None once an export went through)."""
    committed = rt.ledger.committed_txid()
    recorded = sink_positions(rt.client, rt.keyspace)
    failing = sink_errors(rt) if rt.pipeline.feeds else {}
    out = []
    for feed in rt.pipeline.feeds:
        entry = recorded.get(feed.name, {})
        failure = failing.get(feed.name) or {}
        position = int(entry.get("txid", 0))
        logs = logged_txids(rt.client, rt.keyspace, feed.state)
        out.append(
            {
                "sink": feed.name,
                "state": feed.state,
                "target": feed.sink.describe(),
                "position": position,
                "lag": max(0, committed - position),
                "exported_at_ms": entry.get("at_ms"),
                "change_logs": len(logs),
                "oldest_change_log": logs[0] if logs else None,
                "error": failure.get("error"),
                "error_at_ms": failure.get("at_ms"),
                **(
                    {
                        "table_versions": table_versions(rt, feed),
                        "stamp": stamp_of(rt.pipeline.name, feed.name, rt.ledger.generation),
                    }
                    if isinstance(feed.sink, CarriesBack)
                    else {}
                ),
            }
        )
    return out
