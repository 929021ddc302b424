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
from typing import Any

from tridentflow.ops.audit import recount_txid_by_txid
from tridentflow.sinks.redisstream import RedisStreamSink, companion_key
from tridentflow.steps.query import list_state
from tridentflow.steps.runtime import Runtime
from tridentflow_state.codec import encode_key
from tridentflow_state.ledger import HISTORY_LENGTH

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
    ) -> None:
        """``changes``: the lineage they were noted in (None: none yet) and what each stream
        sink's txids wrote, as the harness noted it at each commit (sink -> txid -> key ->
        value text; asked again each time: it is replaced when Redis goes back to a
        snapshot, and cleared by a reset)."""
        self.open_runtime = open_runtime
        self.limit = limit
        self.changes = changes
        self.stream_reads = 0
        """Stream reads checked: (stream, txid) pairs compared with what the txid wrote."""
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
