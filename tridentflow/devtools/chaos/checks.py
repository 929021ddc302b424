"""What a schedule is checked against: the expected counts, windows, staging left behind."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable

from tridentflow.examples.mutating import expected_counts
from tridentflow.steps.query import list_state
from tridentflow.steps.runtime import Runtime
from tridentflow_state.codec import encode_key
from tridentflow_state.ledger import HISTORY_LENGTH


def staging_left(rt: Runtime, lost_beyond: int | None = None) -> list[str]:
    """What is still staged for ``rt``'s pipeline - its manifests, blocks and block indexes in
    Redis, any generation; attempt directories under its home - sorted. Once every txid is
    committed and its step retried as an orchestrator retries, nothing may be: every path
    that abandons an attempt deletes its staging (tridentflow.steps.emitter, committer).
    ``lost_beyond``: Redis lost the commits after it once; the file staging of txids past it
    that the pipeline has not reached again, and of generations Redis no longer knows (a
    rewind it lost), is that lost timeline's (docs/redis.md), left."""
    found = []
    for pattern in (rt.keyspace.pattern, rt.keyspace.shard_pattern):
        for raw in rt.client.scan_iter(match=pattern, count=1000):
            key = raw.decode("utf-8", "surrogatepass") if isinstance(raw, bytes) else raw
            if ":staged:" in key or ":block:" in key:
                found.append(key)
    if rt.staging_root.exists():
        found += [
            str(p)
            for p in rt.staging_root.glob("g-*/tx-*/attempt-*")
            if lost_beyond is None
            or (
                p.parent.parent.name == f"g-{rt.ledger.generation}"
                and int(p.parent.name.removeprefix("tx-")) <= lost_beyond
            )
        ]
    return sorted(found)


def stale_tx_hashes(rt: Runtime) -> list[int]:
    """Txids at least two below the committed one whose tx hash exists: the mark of txid T
    deletes T-2's, and nothing of a committed txid may write one again (a zombie step, a
    stalled holder going on, a command Redis ran late - state.scripts COMMITTED_TXID); one
    written again would stay forever."""
    committed = rt.ledger.committed_txid()
    prefix = rt.keyspace.tx(0)[:-1]
    found = []
    for raw in rt.client.scan_iter(match=f"{prefix}*", count=1000):
        key = raw.decode() if isinstance(raw, bytes) else raw
        tail = key[len(prefix) :]
        if tail.isdigit() and int(tail) <= committed - 2:
            found.append(int(tail))
    return sorted(found)


def repeated_history_entries(rt: Runtime) -> list[int]:
    """The txids the ledger's history holds more than once (each commit is one entry: a
    retry, a replay or a command Redis ran twice must not add another)."""
    seen = Counter(entry["txid"] for entry in rt.ledger.history(HISTORY_LENGTH))
    return sorted(txid for txid, n in seen.items() if n > 1)


WINDOWS = {"wordcount-windowed": (("per_window", 10, 10), ("sliding", 10, 5))}
"""Count-window states of the bundled pipelines: (state, size, slide)."""


def window_problem(rt: Runtime, name: str, size: int, slide: int, produced: int) -> str | None:
    """What is wrong with a count-window state of ``produced`` good records: every record
    is in size/slide windows (bad records hold positions too, so a window may hold fewer than
    ``size``, never more)."""
    page = list_state(rt, rt.pipeline.states[name], limit=1_000_000)
    windows = {key[0]: value for key, value in page.items}
    if sum(windows.values()) != produced * size // slide:
        return f"{name}: {sum(windows.values())} window memberships for {produced} records"
    over = [(w, n) for w, n in windows.items() if n > size or w % slide]
    return f"{name}: window {over[0][0]} holds {over[0][1]}" if over else None


def expected_by_key(rt: Runtime, produced: list[str]) -> dict[str, dict[str, int]]:
    """Exact counts of everything produced, by encoded key, for the bundled pipelines (an
    expiring state's are audit's, txid by txid)."""
    expiring = rt.pipeline.expiring
    if rt.pipeline.name in ("mutating", "mutating-opaque"):
        counts = expected_counts(produced)
        return {name: values for name, values in counts.items() if name not in expiring}
    expected: dict[str, dict[str, int]] = {}
    windowed = {state for state, _size, _slide in WINDOWS.get(rt.pipeline.name, ())}
    for name, persist in rt.pipeline.states.items():
        if name in windowed or name in expiring:
            continue  # see window_problem; audit recounts an expiring state txid by txid
        if persist.group_fields:
            counter = Counter(encode_key((w,)) for line in produced for w in line.split())
            expected[name] = dict(counter)
        else:
            expected[name] = {encode_key(()): len(produced)}
    return expected


def at_once(work: Callable[[], None], n: int) -> None:
    """Run ``work`` in ``n`` threads at once (racing processes); wait for all of them."""
    threads = [threading.Thread(target=work) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
