"""What a schedule is checked against: the expected counts, windows, staging left behind."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

from tridentflow.devtools.chaos.config import DEPLOYED_STATE
from tridentflow.devtools.chaos.typed import TYPED_NAME, TYPED_STATE, typed_fields
from tridentflow.examples.mutating import expected_counts
from tridentflow.ops.audit import audit
from tridentflow.steps.query import list_state, query
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


def unindexed_blocks(rt: Runtime) -> list[str]:
    """Staged blocks in Redis that the index of their txid's blocks in their slot does not
    list, sorted. A writer indexes a block before it writes it (``state.staged.write_block``):
    cut anywhere, it leaves an index entry without its block (harmless), never a block that no
    cleanup finds - one that waits out its TTL (7 days) once its attempt is abandoned."""
    found = []
    for pattern in (rt.keyspace.pattern, rt.keyspace.shard_pattern):
        for raw in rt.client.scan_iter(match=pattern, count=1000):
            key = raw.decode("utf-8", "surrogatepass") if isinstance(raw, bytes) else raw
            base, marker, rest = key.rpartition(":block:")
            if not marker:
                continue
            generation, txid, _attempt, _name = rest.rsplit(":", 3)
            if not rt.client.sismember(f"{base}:staged:{generation}:{txid}:blocks", key):
                found.append(key)
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
    expiring state's are audit's, txid by txid; so are those of a state a deploy added, which
    counts from the txid it began)."""
    expiring = {*rt.pipeline.expiring, DEPLOYED_STATE}
    if rt.pipeline.name in ("mutating", "mutating-opaque"):
        counts = expected_counts(produced)
        return {name: values for name, values in counts.items() if name not in expiring}
    if rt.pipeline.name == TYPED_NAME:  # the types family's sums per (name, label)
        sums: dict[str, int | float] = {}
        for line in produced:
            for name, label, amount in typed_fields(line):
                key = encode_key((name, label))
                sums[key] = sums.get(key, 0) + amount
        return {TYPED_STATE: sums}  # type: ignore[dict-item]
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


def drill_checks(rt: Runtime, produced: list[str]) -> dict[str, Any]:
    """A drill of ``wordcount`` (or its opaque twin) checked once every txid committed: each
    word of ``produced`` counted exactly (``lost``, ``doubled``), ``audit`` clean, the history
    holding each txid once, no tx hash of a committed txid written again, no staging without
    its TTL. ``difference``: the first that failed, None if none did."""
    words = Counter(w for line in produced for w in line.split())
    keys = sorted(words)
    _committed, values = query(rt, rt.pipeline.states["counts"], [(w,) for w in keys])
    got = dict(zip(keys, values, strict=True))
    lost = sum(max(0, words[w] - (got[w] or 0)) for w in keys)
    doubled = sum(max(0, (got[w] or 0) - words[w]) for w in keys)
    differences = [f"counts: lost={lost} doubled={doubled}"] if lost or doubled else []
    report = audit(rt)
    if not report.ok:
        differences.append(f"audit: {report.line()}")
    differences += [f"the history holds txid {t} more than once"
                    for t in repeated_history_entries(rt)[:1]]  # fmt: skip
    differences += [f"txid {t}'s tx hash was written after its commit"
                    for t in stale_tx_hashes(rt)[:1]]  # fmt: skip
    left = [k for k in staging_left(rt) if rt.client.ttl(k) <= 0]
    differences += [f"staging left without its TTL: {k}" for k in left[:1]]
    differences += [f"a staged block no index lists: {k}" for k in unindexed_blocks(rt)[:1]]
    return {"difference": differences[0] if differences else None, "lost": lost,
            "doubled": doubled}  # fmt: skip


def committed_times(rt: Runtime) -> list[int]:
    """When each txid in the ledger's history committed (Redis's clock, ms)."""
    return [e["committed_ms"] for e in rt.ledger.history(HISTORY_LENGTH) if e.get("committed_ms")]


def drills_totals(results: list[dict[str, Any]], keys: tuple[str, ...]) -> dict[str, int]:
    """Each of ``keys`` summed over the drills' results."""
    return {k: sum(r.get(k, 0) for r in results) for k in keys}


def drills_tail(results: list[dict[str, Any]], faults: str) -> str:
    """The end of a drills' summary line: the ms from each of the ``faults`` to the next
    commit (median, max), and the first difference if any drill found one."""
    ms = sorted(m for r in results for m in r.get("recovery_ms", ()))
    bad = [r for r in results if not r["ok"]]
    return (
        (f", the next commit {ms[len(ms) // 2] / 1000:.2f} s (median) and at most "
         f"{ms[-1] / 1000:.2f} s after each of {len(ms)} {faults}" if ms else "")
        + (f"; FIRST DIFFERENCE (seed {bad[0]['seed']}): {bad[0]['difference']}" if bad else "")
    )  # fmt: skip
