"""The commit: applies one staged batch to the map states, strictly in txid order. This is the
module to open first: ``commit(rt, txid)`` reads as the protocol, one named call per step, in
the order below (the Redis side of each step is a method of ``CommitAttempt``,
tridentflow_state.commit; this module adds where the batch comes from, how each state's
partials are applied, the fault points and replication waits - ``_CommitHooks`` - the
quarantine and the staging's cleanup).

1. ``CommitAttempt.begin``: a fencing token from the ledger - refused unless it stands at
   txid-1 (inside Redis); None if the txid is committed already (``_already_committed``:
   the replicas, the history entry and the staging a cut-short commit left are finished).
2. ``load_verified``: the newest staged emit attempt, from wherever it was staged (Redis or
   files), verified (checksums, record counts per partition, the code shape that emitted it,
   and that it starts where the committed offsets stand).
3. ``rt.require_replicated``: txid-1's mark acknowledged where ``--wait-replicas`` asks.
4. ``check_settings``: this process's settings are the pipeline's recorded ones (one line).
5. ``attempt.claim``: the stored shard count checked, every shard claimed for this attempt
   (a superseded attempt's writes are refused from now on); one fenced writer per state.
6. ``attempt.expect`` then ``writer_for(...).apply`` per state: every key's partial with the
   state's rule (transactional / opaque / non-transactional), in chunks, each write fenced.
   The built-in numeric combiners (Count, Sum, Min, Max, Mean) are applied inside Redis
   (``InRedisChunks``: one script call per chunk and shard, in parallel threads; or
   ``StagedBlocks``: one call per staged block where it lies, the partials never leaving
   Redis); any other Combiner, Reducer or updater in Python (``PythonApply``). Half-way,
   the ``mid-commit`` fault point.
7. ``quarantine``: the batch's bad records kept (fenced too).
8. ``attempt.finish_writes``: expired keys removed, keys an earlier attempt of this txid
   wrote and this batch lacks rolled back, change logs written for the states a sink reads.
9. ``attempt.mark``: committed txid and source offsets move together, atomically, only after
   every key is written (a crash anywhere before replays safely); then ``rt.log.acknowledge``.
10. ``attempt.settle``: shards closed to the txid, tombstones dropped, expiry indexes merged,
    change and undo logs trimmed (best effort, idempotent).
11. ``rt.discard_staged`` / ``discard_staged_before``: every staged attempt of the txid (and
    what a commit cut short after its mark left).
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
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
from tridentflow.steps.recorded_settings import code_shape_changes
from tridentflow.steps.runtime import Runtime
from tridentflow.steps.staging import CODE_SHAPE, InBlocks, StagedBatch
from tridentflow.steps.turns import wait_turn
from tridentflow_state.backing import Fence
from tridentflow_state.commit import CommitAttempt, PhaseHooks
from tridentflow_state.errors import CommitOrderError, KeyEncodingError
from tridentflow_state.maps import MapState
from tridentflow_state.numeric import apply_numeric
from tridentflow_state.redis_backing import CHUNK, fenced_hset
from tridentflow_state.replication import node_of, wait_for_replicas_of
from tridentflow_state.shards import split_by_shard
from tridentflow_state.staged import BlockRef


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


def _left_in(lines: Iterable[str], left: list[str]) -> list[tuple[str, Any]]:
    """The ``(key, partial)`` pairs of ``lines`` whose key a script left to Python."""
    wanted, rest = set(left), []
    for line in lines:
        key, _tab, partial = line.rstrip("\n").partition("\t")
        if key in wanted:
            rest.append((key, json.loads(partial)))
    return rest


@dataclass
class StateWriter:
    """How one state's partials reach Redis (an apply strategy): shared by the three kinds,
    the runtime, the staged batch, the attempt (its fence; told what landed), the pool."""

    rt: Runtime
    staged: StagedBatch
    attempt: CommitAttempt
    pool: Executor
    persisted: Persistable

    def apply(self, state: MapState) -> None:
        raise NotImplementedError


class PythonApply(StateWriter):
    """Any aggregator: the partials read in chunks, each chunk one read and one fenced write
    round trip (tridentflow_state.maps)."""

    def apply(self, state: MapState) -> None:
        apply_in_chunks(state, self.persisted, self.staged.items(state.name), self.attempt)


def apply_in_chunks(
    state: MapState, persisted: Persistable, items: Iterator[Any], attempt: CommitAttempt
) -> None:
    """``items`` (encoded key, partial) in the staged order, in chunks of CHUNK - one ending
    at the attempt's half - each applied in Python and reported to the attempt. What
    ``PythonApply`` does, and ``tridentflow.testing`` over its in-memory states."""
    for chunk in staged_chunks(items, CHUNK, attempt.keys_to_half()):
        apply_in_python(state, state.name, persisted, chunk)
        attempt.wrote(len(chunk))


@dataclass
class InRedisChunks(StateWriter):
    """A built-in numeric combiner over partials read from the driver: one APPLY_NUMERIC
    call per chunk and shard (state.numeric), the shards in parallel while the next chunk is
    read; the keys the script leaves (not plain numbers) through Python."""

    op: str

    def apply(self, state: MapState) -> None:
        size = IN_REDIS_CHUNK * self.rt.keyspace.shards
        in_flight: tuple[list[str], list[Future]] | None = None  # in Redis while the next is read
        for chunk in staged_chunks(
            self.staged.lines(state.name), size, self.attempt.keys_to_half()
        ):
            futures = self._submit(state, chunk)
            if in_flight is not None:
                self._finish(state, *in_flight)
            in_flight = (chunk, futures)
            if self.attempt.reaches_half(len(chunk)):  # half of the keys really in first
                self._finish(state, *in_flight)
                in_flight = None
        if in_flight is not None:
            self._finish(state, *in_flight)

    def _submit(self, state: MapState, lines: Sequence[str]) -> list[Future]:
        ks, fence = self.rt.keyspace, self.attempt.fence
        return [
            self.pool.submit(
                apply_numeric,
                self.rt.client,
                ks.shard(i),
                state.name,
                state.kind,
                self.op,
                fence,
                "".join(group).rstrip("\n"),
            )
            for i, group in enumerate(split_by_shard(ks, lines, _line_key))
            if group
        ]

    def _finish(self, state: MapState, lines: Sequence[str], futures: list[Future]) -> None:
        """Wait for a submitted chunk (its errors are raised here); what the script left goes
        through Python, in this thread."""
        left: list[str] = []
        for future in futures:
            _applied, unhandled = future.result()
            left += unhandled
        state.note_in_batch(len(lines) - len(left))
        if left:
            apply_in_python(state, state.name, self.persisted, _left_in(lines, left))
        self.attempt.wrote(len(lines))


@dataclass
class StagedBlocks(StateWriter):
    """A built-in numeric combiner over a batch staged in Redis: each block applied where it
    lies (APPLY_STAGED_NUMERIC: the partials never leave Redis), up to two calls in flight per
    worker, blocks of different shards on their masters at once; the keys a script left go
    through Python."""

    op: str
    in_blocks: InBlocks
    refs: list[BlockRef]

    def apply(self, state: MapState) -> None:
        kind, fence, staged = state.kind, self.attempt.fence, self.in_blocks

        def one(ref: BlockRef) -> tuple[BlockRef, int, list[str]]:
            return ref, *staged.apply_numeric_block(ref, state.name, kind, self.op, fence)

        in_flight: deque[Future] = deque()
        limit = 2 * max(2, self.rt.keyspace.shards)
        for ref in self.refs:
            in_flight.append(self.pool.submit(one, ref))
            if len(in_flight) >= limit:
                self._finish(state, in_flight.popleft())
        while in_flight:
            self._finish(state, in_flight.popleft())

    def _finish(self, state: MapState, future: Future) -> None:
        ref, applied, left = future.result()
        state.note_in_batch(applied)
        if left:
            lines = self.in_blocks.block_lines(ref)
            apply_in_python(state, state.name, self.persisted, _left_in(lines, left))
        self.attempt.wrote(ref.lines)


def writer_for(
    rt: Runtime, staged: StagedBatch, attempt: CommitAttempt, pool: Executor, name: str
) -> StateWriter:
    """The apply strategy of state ``name``: inside Redis for a built-in numeric combiner
    (where the blocks lie, for a batch staged in Redis), else in Python."""
    persisted = rt.pipeline.states[name].aggregator
    op = in_redis_op(persisted, rt.in_redis_ops)
    if op is None:
        return PythonApply(rt, staged, attempt, pool, persisted)
    if isinstance(staged, InBlocks) and staged.blocks_lie_in(rt.keyspace):
        return StagedBlocks(rt, staged, attempt, pool, persisted, op, staged, staged.blocks(name))
    return InRedisChunks(rt, staged, attempt, pool, persisted, op)


def staged_chunks(items: Iterator[Any], size: int, split_at: int) -> Iterator[list]:
    """Chunks of at most ``size`` items in the staged order, with a boundary right after item
    number ``split_at`` (the half an attempt that dies mid-commit wrote)."""
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


class _CommitHooks(PhaseHooks):
    """The commit's fault points and replication waits, each at its phase of the protocol."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    def half_written(self, attempt: CommitAttempt) -> None:
        self.rt.faults.fire("mid-commit", attempt.txid, attempt.token)

    def written(self, attempt: CommitAttempt) -> None:
        confirm_shards_replicated(self.rt, attempt.txid)  # what the mark will stand on
        self.rt.faults.fire("before-ledger", attempt.txid, attempt.token)

    def marked(self, attempt: CommitAttempt) -> None:
        confirm_replicated(self.rt, attempt.txid)  # before the staged batch is discarded
        self.rt.faults.fire("after-mark", attempt.txid, attempt.token)


def load_verified(rt: Runtime, txid: int) -> StagedBatch:
    """The newest staged attempt of ``txid``, verified whole and starting where the committed
    offsets stand; one that never can commit (torn, expired, read from elsewhere) is deleted
    and IncompleteBatchError raised. NotReadyError if nothing is staged."""
    attempt = rt.ledger.staged_attempt(txid)
    if attempt is None:
        raise NotReadyError(f"txid {txid} has no staged output: run its emitter first")
    try:
        staged = rt.staging_of(txid, attempt).load(txid, attempt)
        positions = rt.pipeline.source.position_field is not None
        check_continuity(staged, rt.ledger.committed_offsets(), positions)
    except IncompleteBatchError:
        rt.discard_attempts(txid, [attempt])
        raise
    check_code_shape(rt, staged)  # refused but kept: the code that staged it may commit it
    return staged


def check_code_shape(rt: Runtime, staged: StagedBatch) -> None:
    """IncompleteBatchError (one line) for a batch staged by code of another shape - a deploy,
    an ``evolve`` between its emit and its commit: its partials were made by other
    aggregators, for other states, and must not be combined into this code's values. It is
    kept (during a rolling deploy the code that staged it may still commit it); the txid's
    batch (its offsets) stays frozen, and emitting it again with this code stages a newer
    attempt, which the commit takes."""
    differs = code_shape_changes(rt, staged.manifest.get(CODE_SHAPE))
    if differs is not None:
        raise IncompleteBatchError(
            f"txid {staged.txid} was emitted by code of another shape than this one ({differs}): "
            "its partials are not committed with this code's states; emit it again with this "
            "code (clear its emit task; `tridentflow run` does it by itself)"
        )


def commit_stats(
    staged: StagedBatch, attempt: CommitAttempt, quarantined: int, rolled_back: int
) -> dict[str, Any]:
    """What the ledger keeps with a commit (the txid's own metadata goes once later txids
    move on)."""
    return {
        "records": staged.records,
        "keys": attempt.expected,
        "emit_attempt": staged.attempt,
        "commit_attempt": attempt.token,
        "skipped": staged.manifest.get("skipped", []),
        "quarantined": quarantined,
        "rolled_back": rolled_back,
        "expired": sum(len(keys) for keys in attempt.expired.values()),
        "expired_by_state": {name: len(keys) for name, keys in attempt.expired.items()},
        "ranges": {str(p): [start, end] for p, (start, end) in sorted(staged.ranges.items())},
        # the batch time expiry judged by; absent: none
        **({} if attempt.batch_time is None else {"at_ms": attempt.batch_time}),
        # each expiring state's rule and the horizon this code applied (audit recounts by it)
        "expiry": attempt.expiry_record(),
    }


def batch_time(rt: Runtime, txid: int) -> int | None:
    """The batch time ``txid``'s metadata froze (expiry in time); None when no state expires
    by time (nothing read) or the metadata holds none (coordinated before that was on)."""
    if not rt.pipeline.expires_in_time:
        return None
    at = (rt.ledger.metadata(txid) or {}).get("at_ms")
    return None if at is None else int(at)


def wait_to_commit(rt: Runtime, txid: int, timeout: float) -> None:
    """Until txid-1 is committed; CommitOrderError after ``timeout`` seconds. Reads only."""
    if not wait_turn(rt, lambda: rt.ledger.committed_txid() >= txid - 1, timeout=timeout):
        awaited = rt.ledger.committed_txid() + 1
        raise CommitOrderError(f"txid {txid} waited {timeout:.0f}s for txid {awaited} to commit")


def _already_committed(rt: Runtime, txid: int) -> CommitResult:
    """A retry of a committed txid: finish what a commit cut short after its mark left - the
    replicas' acknowledgement, the history entry, the staged batch. Idempotent."""
    confirm_replicated(rt, txid)  # a retry after a commit whose WAIT fell short
    rt.ledger.record_history(txid)
    rt.discard_staged(txid)
    return CommitResult(txid, "already-committed")


def commit(rt: Runtime, txid: int, wait: float = 0) -> CommitResult:
    """Commit ``txid`` (the protocol: tridentflow_state.commit); with ``wait`` > 0, first wait
    up to that many seconds for its turn. Idempotent: a retry of a committed txid changes
    nothing and answers ``already-committed``."""
    if wait > 0:
        wait_to_commit(rt, txid, wait)
    ledger, states = rt.ledger, rt.pipeline.states
    attempt = CommitAttempt.begin(
        ledger, rt.client, rt.keyspace, txid, rt.retain_txids, _CommitHooks(rt)
    )
    if attempt is None:
        return _already_committed(rt, txid)
    staged = load_verified(rt, txid)
    rt.require_replicated(  # txid-1's mark: what every write of this txid builds on
        f"txid {txid - 1}'s commit", f"txid {txid} wrote nothing; retry its commit"
    )
    check_settings(rt)  # one line if this process would change them unmeant
    kinds = {name: (p.state.kind, rt.backing(name)) for name, p in states.items()}
    writers = attempt.claim(kinds, rt.asked_shards, rt.pipeline.expiring, batch_time(rt, txid))
    attempt.expect(sum(staged.key_count(name) for name in writers))
    with ThreadPoolExecutor(max(2, rt.keyspace.shards), thread_name_prefix="tf-commit") as pool:
        for name, state in writers.items():
            writer_for(rt, staged, attempt, pool, name).apply(state)
    quarantined = quarantine(rt, staged, attempt.fence)
    rolled_back = attempt.finish_writes(staged.keys, rt.pipeline.fed_states)
    offsets = {p: end for p, (_start, end) in staged.ranges.items()}
    if attempt.mark(offsets, commit_stats(staged, attempt, quarantined, rolled_back)):
        rt.log.acknowledge(offsets)  # a shared stream keeps what this reader still needs
    attempt.settle(rt.pipeline.fed_states, rt.pipeline.change_log_limit)
    rt.discard_staged(txid)
    if not attempt.marked:  # a concurrent attempt finished first; ours wrote nothing after it
        return CommitResult(txid, "already-committed")
    rt.discard_staged_before(txid)  # what commits cut short after their marks left, if any
    return CommitResult(
        txid, "committed", staged.records, attempt.expected,
        staged.attempt, attempt.token, rolled_back, quarantined,
        tuple(staged.manifest.get("skipped", [])),
    )  # fmt: skip
