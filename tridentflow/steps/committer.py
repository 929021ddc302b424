"""The commit: applies one staged batch to the map states, strictly in txid order.

``commit(rt, txid)``:

1. ``begin_commit`` in the ledger: refused unless the ledger stands at txid-1 (checked inside
   Redis); a no-op if txid is already committed; otherwise a new fencing token.
2. Loads the newest staged emit attempt from wherever it was staged (files, or Redis) and
   verifies it (checksums, record counts per partition: a partial batch fails here) and that
   it starts where the committed offsets stand.
3. With state shards, checks the stored shard count and claims every shard for this attempt
   (state.shards). Applies every key's partial with the state's rule (transactional / opaque /
   non-transactional), in chunks; every write is fenced (by the ledger, or by the shard's
   claim), so a superseded attempt cannot land. The built-in numeric combiners (Count, Sum,
   Min, Max, Mean) are applied inside Redis, one script call per chunk and shard
   (state.numeric), the shards in parallel threads while the next chunk is read - or, for a
   batch staged in Redis, one call per staged block where the block lies, so the partials
   never leave Redis (state.staged); any other Combiner, Reducer or updater in Python.
4. Rolls back keys an earlier commit attempt of this txid wrote that this batch lacks, and
   records the batch's bad records in the quarantine (fenced too). For a state that a
   new-values stream reads, writes the txid's change log (state.changes, fenced too). With
   ``--wait-replicas`` and state shards on other masters, waits until their replicas
   acknowledged all of it.
5. ``mark_committed``: committed txid and source offsets move together, atomically, and only
   after every key is written. A crash anywhere before this replays safely. With
   ``--wait-replicas``, the ledger's replicas must acknowledge the mark. Then the shards
   are settled, the source told the new positions, and the keys the txid removed dropped
   (all best effort).
6. Staging goes: every attempt of the txid (and of txid-1, if its commit was cut short after
   its mark); a retry that finds the txid committed deletes it too, and an attempt that cannot
   commit (torn, expired, read from the wrong offsets) is deleted when the commit refuses it.
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass
from itertools import islice
from typing import Any

from tridentflow.aggregators import (
    Count,
    Max,
    Mean,
    Min,
    Persistable,
    StateView,
    Sum,
    apply_staged,
)
from tridentflow.errors import (
    IncompleteBatchError,
    NotReadyError,
    ReplicationError,
    StateUpdateError,
)
from tridentflow.steps.recorded_settings import check as check_settings
from tridentflow.steps.runtime import Runtime
from tridentflow.steps.staging import StagedBatch
from tridentflow_state.backing import Fence
from tridentflow_state.changes import record_changes, trim_changes
from tridentflow_state.errors import CommitOrderError, KeyEncodingError, StagedBlockError
from tridentflow_state.maps import MapState, StateKind, make_map_state
from tridentflow_state.numeric import apply_numeric
from tridentflow_state.redis_backing import CHUNK, fenced_hset
from tridentflow_state.replication import node_of, wait_for_replicas_of
from tridentflow_state.shards import claim_shards, ensure_shards, settle_shards, split_by_shard
from tridentflow_state.staged import BlockRef, apply_numeric_block, read_block
from tridentflow_state.undo import trim_undo


@dataclass(frozen=True)
class CommitResult:
    txid: int
    status: str  # committed | already-committed
    records: int = 0
    keys: int = 0
    emit_attempt: int | None = None
    commit_attempt: int | None = None
    rolled_back: int = 0
    quarantined: int = 0
    skipped_partitions: tuple[int, ...] = ()


@dataclass(frozen=True)
class _ApplyStaged:
    """Updater: the stored value updated with what the batch staged for the key - combined
    with a Combiner's partial (Trident's CombinerValueUpdater), folded over a Reducer's tuples
    (ReducerValueUpdater), or a StateUpdater's update."""

    persisted: Persistable
    staged: Any
    state: str
    key: str
    view: StateView | None = None

    def __call__(self, old: Any) -> Any:
        try:
            return apply_staged(self.persisted, old, self.staged, self.view)
        except Exception as exc:
            raise StateUpdateError(
                f"state {self.state}: {self.persisted!r} failed on key {self.key}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc


IN_REDIS_OPS: dict[type, str] = {Count: "count", Sum: "sum", Min: "min", Max: "max", Mean: "mean"}
"""Built-in combiners applied inside Redis (exact types: a subclass may override combine)."""

IN_REDIS_CHUNK = 5000
"""Keys per APPLY_NUMERIC call: fewer round trips; one call holds Redis for ~25 ms."""


def in_redis_op(persisted: Persistable, enabled: bool = True) -> str | None:
    """The APPLY_NUMERIC op for a built-in numeric combiner, None for anything else (and for
    everything when not ``enabled``: ``Runtime.in_redis_ops``)."""
    return IN_REDIS_OPS.get(type(persisted)) if enabled else None


def apply_in_python(state: MapState, name: str, persisted: Persistable, chunk: Sequence) -> None:
    """Apply staged ``(key, partial)`` pairs to ``state`` with the aggregator, in Python (one
    read and one write round trip); StateUpdateError (one line) if the aggregator fails."""
    view = StateView(state) if getattr(persisted, "reads_state", False) else None
    try:
        state.multi_update(
            [k for k, _ in chunk], [_ApplyStaged(persisted, p, name, k, view) for k, p in chunk]
        )
    except KeyEncodingError as exc:  # a new value the store cannot write as JSON
        raise StateUpdateError(f"state {name}: {persisted!r} failed on {exc}") from exc


def _line_key(line: str) -> str:
    return line[: line.index("\t")]


@dataclass
class _InFlight:
    """One chunk of staged lines of a numeric state, submitted shard by shard."""

    state: MapState
    persisted: Persistable
    lines: Sequence[str]
    futures: list[Future]


def _submit_in_redis(
    rt: Runtime, pool: Executor, state: MapState, op: str, fence: Fence, lines: Sequence[str]
) -> list[Future]:
    """One chunk of staged ``key TAB partial`` lines to APPLY_NUMERIC, as they are, one call
    per shard holding some of its keys, run by ``pool`` (shards are slots of their own: on a
    cluster, different masters work at once)."""
    ks = rt.keyspace
    return [
        pool.submit(
            apply_numeric,
            rt.client,
            ks.shard(i),
            state.name,
            state.kind,
            op,
            fence,
            "".join(group).rstrip("\n"),
        )
        for i, group in enumerate(split_by_shard(ks, lines, _line_key))
        if group
    ]


def _finish_in_redis(staged: StagedBatch, chunk: _InFlight) -> None:
    """Wait for a submitted chunk (its errors are raised here); the keys the script left (not
    plain numbers) go through the Python path, in this thread."""
    state, name = chunk.state, chunk.state.name
    unhandled: list[str] = []
    for future in chunk.futures:
        _applied, left = future.result()
        unhandled += left
    state.note_in_batch(len(chunk.lines) - len(unhandled), lambda: staged.keys(name))
    if unhandled:
        left_keys = set(unhandled)
        rest = []
        for line in chunk.lines:
            key, _tab, partial = line.rstrip("\n").partition("\t")
            if key in left_keys:
                rest.append((key, json.loads(partial)))
        apply_in_python(state, name, chunk.persisted, rest)


def _apply_blocks(
    rt: Runtime,
    pool: Executor,
    staged: StagedBatch,
    state: MapState,
    persisted: Persistable,
    op: str,
    fence: Fence,
    refs: list[BlockRef],
    at_half: Callable[[int], None],
) -> None:
    """A numeric state staged in Redis as blocks: each block applied where it lies
    (APPLY_STAGED_NUMERIC: the partials never leave Redis), up to two calls in flight per
    worker, blocks of different shards on their masters at once; the keys a script left go
    through Python. ``at_half(lines)`` is told the lines applied after each block."""
    space = staged.space  # type: ignore[attr-defined]
    name = state.name

    def one(ref: BlockRef) -> tuple[BlockRef, int, list[str]]:
        applied, left = apply_numeric_block(rt.client, space, ref, name, state.kind, op, fence)
        return ref, applied, left

    def finish(future: Future) -> None:
        try:
            ref, applied, left = future.result()
        except StagedBlockError as exc:
            raise IncompleteBatchError(
                f"txid {staged.txid} attempt {staged.attempt}: {exc}"
            ) from None
        state.note_in_batch(applied, lambda: staged.keys(name))
        if left:
            wanted = set(left)
            rest = []
            for line in read_block(rt.client, space, ref):
                key, _tab, partial = line.partition("\t")
                if key in wanted:
                    rest.append((key, json.loads(partial)))
            apply_in_python(state, name, persisted, rest)
        at_half(ref.lines)

    in_flight: deque[Future] = deque()
    limit = 2 * max(2, rt.keyspace.shards)
    for ref in refs:
        in_flight.append(pool.submit(one, ref))
        if len(in_flight) >= limit:
            finish(in_flight.popleft())
    while in_flight:
        finish(in_flight.popleft())


def _chunks(items: Iterator[tuple[str, Any]], size: int, split_at: int) -> Iterator[list]:
    """Chunks of at most ``size`` items, with a boundary right after item number ``split_at``."""
    taken = 0
    while True:
        limit = size
        if taken < split_at:
            limit = min(size, split_at - taken)
        chunk = list(islice(items, limit))
        if not chunk:
            return
        taken += len(chunk)
        yield chunk


def drop_tombstones(rt: Runtime, txid: int, removed: dict[str, list[str]], generation: str) -> int:
    """Delete the tombstones a committed txid left (keys it removed). Best effort: a crash
    before or during it leaves tombstones, which read as absent everywhere."""
    dropped = 0
    for name, keys in removed.items():
        if keys:
            kind = rt.pipeline.states[name].state.kind
            tx = None if kind is StateKind.NON_TRANSACTIONAL else txid
            dropped += rt.backing(name).drop_tombstones(tx, keys, generation)
    return dropped


def check_continuity(
    staged: StagedBatch, committed_offsets: dict[int, int], positions: bool = False
) -> None:
    """IncompleteBatchError unless the batch starts where the committed offsets stand: every
    partition it read - and, with ``positions`` (a source whose records carry their position,
    which counts every partition's records before the batch), every partition it knew of,
    skipped ones included: a pipelined batch staged after an attempt of the txid before it
    that was later replayed would otherwise give records positions already taken."""
    for partition, (start, _end) in staged.ranges.items():
        committed = committed_offsets.get(partition, 0)
        if start != committed:
            raise IncompleteBatchError(
                f"txid {staged.txid} attempt {staged.attempt} read partition {partition} from "
                f"offset {start}, but its committed position is {committed}: emit it again"
            )
    if not positions:
        return
    known = {int(p): int(v) for p, v in staged.manifest.get("next_positions", {}).items()}
    for partition in sorted(set(known) | set(committed_offsets)):
        if partition in staged.ranges:
            continue
        start, committed = known.get(partition, 0), committed_offsets.get(partition, 0)
        if start != committed:
            raise IncompleteBatchError(
                f"txid {staged.txid} attempt {staged.attempt} counted partition {partition}'s "
                f"records before it as {start}, but its committed position is {committed}: "
                "its records' positions would be wrong; emit it again"
            )


def quarantine(rt: Runtime, staged: StagedBatch, fence: Fence) -> int:
    """Record the batch's bad records (fenced, idempotent: keyed by partition:offset)."""
    items = [
        (f"{bad['partition']}:{bad['offset']}", {"txid": staged.txid, **bad})
        for bad in staged.bad_records()
    ]
    if items:
        keys = rt.keyspace
        fenced_hset(
            rt.client, keys, keys.quarantine, keys.quarantine_written(staged.txid), items, fence
        )
    return len(items)


def wait_turn(rt: Runtime, txid: int, timeout: float, poll: float = 0.2) -> None:
    """Block until txid-1 is committed (commits are strictly ordered); CommitOrderError after
    ``timeout`` seconds. Trident: a batch that finished processing early waits for its turn."""
    deadline = time.monotonic() + timeout
    while rt.ledger.committed_txid() < txid - 1:
        if time.monotonic() >= deadline:
            committed = rt.ledger.committed_txid()
            raise CommitOrderError(
                f"txid {txid} waited {timeout:.0f}s for txid {committed + 1} to commit"
            )
        time.sleep(poll)


def confirm_shards_replicated(rt: Runtime, txid: int) -> None:
    """Before the mark, with ``rt.replicas`` > 0 and state shards on other masters than the
    ledger's: ReplicationError unless that many replicas of each such master acknowledged
    everything this attempt wrote there. The ledger's acknowledgement (after the mark) covers
    only its own master; a shard master that failed over with its replica behind would drop
    its part of a txid the ledger calls committed. Failing here, before the mark, leaves the
    txid pending: its retry rewrites what a failover lost (the txid rules make that exact)."""
    ks = rt.keyspace
    if rt.replicas <= 0 or not ks.sharded:
        return
    fences = [ks.shard(i).fence for i in range(ks.shards)]
    ledger_node = node_of(rt.client, ks.ledger)
    for node, _key, acked in wait_for_replicas_of(
        rt.client, fences, rt.replicas, rt.replica_timeout_ms, skip=ledger_node
    ):
        if acked < rt.replicas:
            raise ReplicationError(
                f"txid {txid}'s state shard writes on Redis master {node} were acknowledged by "
                f"only {acked} of {rt.replicas} replica(s) within {rt.replica_timeout_ms} ms: "
                "not committed; retry the commit (it rewrites them exactly)"
            )


def confirm_replicated(rt: Runtime, txid: int) -> None:
    """With ``rt.replicas`` > 0 (TRIDENTFLOW_WAIT_REPLICAS): ReplicationError unless that many
    replicas of the ledger's master acknowledged the commit mark (and so every write before
    it on that master) within ``rt.replica_timeout_ms``. The commit stands on the master
    either way; the step fails so that Airflow (or the CLI) does not report as durable what
    an asynchronous failover could still undo, and its retry waits again. Shards on other
    masters were waited for before the mark (``confirm_shards_replicated``)."""
    if rt.replicas <= 0:
        return
    acked = rt.ledger.wait_replicated(rt.replicas, rt.replica_timeout_ms)
    if acked < rt.replicas:
        raise ReplicationError(
            f"txid {txid} is committed on the Redis master but only {acked} of "
            f"{rt.replicas} replica(s) acknowledged it within {rt.replica_timeout_ms} ms: a "
            "failover now could undo it; retry the commit (it waits again, and redoes nothing)"
        )


def commit(rt: Runtime, txid: int, wait: float = 0) -> CommitResult:
    """Commit ``txid``; with ``wait`` > 0, first wait up to that many seconds for its turn."""
    ledger = rt.ledger
    if wait > 0:
        wait_turn(rt, txid, wait)
    ticket = ledger.begin_commit(txid)
    if ticket is None:
        confirm_replicated(rt, txid)  # a retry after a commit whose WAIT fell short
        rt.discard_staged(txid)  # a commit cut short after its mark left it
        return CommitResult(txid, "already-committed")
    attempt = ledger.staged_attempt(txid)
    if attempt is None:
        raise NotReadyError(f"txid {txid} has no staged output: run its emitter first")
    try:
        staged = rt.staging_of(txid, attempt).load(txid, attempt)
        positions = rt.pipeline.source.position_field is not None
        check_continuity(staged, ledger.committed_offsets(), positions)
    except IncompleteBatchError:  # torn, expired or read from elsewhere: never committable
        rt.discard_attempts(txid, [attempt])
        raise
    rt.require_replicated(  # txid-1's mark: what every write of this txid builds on
        f"txid {txid - 1}'s commit", f"txid {txid} wrote nothing; retry its commit"
    )

    check_settings(rt)  # one line if this process would change them unmeant
    retain = rt.retain_txids
    fence = Fence(txid, ticket.token, ticket.generation, undo=retain > 0)
    ensure_shards(rt.client, rt.keyspace, rt.state_shards)
    claim_shards(rt.client, rt.keyspace, rt.pipeline.states, fence)
    maps: dict[str, tuple[MapState, Any]] = {}
    for name, persist in rt.pipeline.states.items():
        state = make_map_state(persist.state.kind, rt.backing(name), name)
        state.begin_commit(txid, fence)
        maps[name] = (state, persist.aggregator)

    total = sum(staged.key_count(name) for name in maps)
    half = total // 2
    written = 0
    if half == 0:
        rt.faults.fire("mid-commit", txid, ticket.token)
    shards = rt.keyspace.shards

    def count_lines(lines: int) -> None:  # the mid-commit fault, once half the keys are in
        nonlocal written
        before, written = written, written + lines
        if before < half <= written:
            rt.faults.fire("mid-commit", txid, ticket.token)

    with ThreadPoolExecutor(max_workers=max(2, shards), thread_name_prefix="tf-commit") as pool:
        for name, (state, persisted) in maps.items():
            op = in_redis_op(persisted, rt.in_redis_ops)
            refs = staged.blocks(name) if op else None
            if op and refs is not None:
                _apply_blocks(rt, pool, staged, state, persisted, op, fence, refs, count_lines)
                continue
            items = staged.lines(name) if op else staged.items(name)
            size = IN_REDIS_CHUNK * shards if op else CHUNK
            in_flight: _InFlight | None = None  # one chunk in Redis while the next is read
            for chunk in _chunks(items, size, max(0, half - written)):
                if op:
                    futures = _submit_in_redis(rt, pool, state, op, fence, chunk)
                    if in_flight is not None:
                        _finish_in_redis(staged, in_flight)
                    in_flight = _InFlight(state, persisted, chunk, futures)
                else:
                    apply_in_python(state, name, persisted, chunk)
                before, written = written, written + len(chunk)
                if before < half <= written:
                    if in_flight is not None:  # half of the keys really written first
                        _finish_in_redis(staged, in_flight)
                        in_flight = None
                    rt.faults.fire("mid-commit", txid, ticket.token)
            if in_flight is not None:
                _finish_in_redis(staged, in_flight)
    rolled_back = sum(state.rollback_stray_keys() for state, _ in maps.values())
    quarantined = quarantine(rt, staged, fence)
    for name in rt.pipeline.fed_states:  # what new-values streams and sinks will read
        record_changes(rt.client, rt.keyspace, name, fence, list(staged.keys(name)))
    confirm_shards_replicated(rt, txid)  # every write the mark will stand on, acknowledged
    rt.faults.fire("before-ledger", txid, ticket.token)

    offsets = {p: end for p, (_start, end) in staged.ranges.items()}
    stats = {
        "records": staged.records,
        "keys": total,
        "emit_attempt": attempt,
        "commit_attempt": ticket.token,
        "skipped": staged.manifest.get("skipped", []),
        "quarantined": quarantined,
        "rolled_back": rolled_back,
        # kept with the commit: the txid's own metadata goes once later txids move on
        "ranges": {str(p): [start, end] for p, (start, end) in sorted(staged.ranges.items())},
    }
    marked = ledger.mark_committed(ticket, offsets, maps.keys(), stats, retain)
    confirm_replicated(rt, txid)  # before the staged batch is discarded: a retry can redo it
    rt.faults.fire("after-mark", txid, ticket.token)
    if marked:
        settle_shards(rt.client, rt.keyspace, maps.keys(), txid)
        rt.log.acknowledge(offsets)  # a shared stream keeps what this reader still needs
    removed = {name: state.tombstones() for name, (state, _) in maps.items()}
    for state, _ in maps.values():
        state.commit()
    if marked:  # keys this txid removed: gone from the store now that no replay needs them
        drop_tombstones(rt, txid, removed, ticket.generation)
        for name in rt.pipeline.fed_states:  # a sink further behind than this reloads or fails
            trim_changes(rt.client, rt.keyspace, name, txid, rt.pipeline.change_log_limit)
        trim_undo(rt.client, rt.keyspace, maps.keys())  # what fell out of retain_txids
    rt.discard_staged(txid)
    if marked:  # and what a commit of txid-1 cut short after its mark left, if any
        rt.discard_staged(txid - 1)
    if not marked:  # a concurrent attempt finished first; ours wrote nothing after it
        return CommitResult(txid, "already-committed")
    return CommitResult(
        txid,
        "committed",
        records=staged.records,
        keys=total,
        emit_attempt=attempt,
        commit_attempt=ticket.token,
        rolled_back=rolled_back,
        quarantined=quarantined,
        skipped_partitions=tuple(staged.manifest.get("skipped", [])),
    )
