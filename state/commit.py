"""One commit attempt of a txid: the ledger and every map state of a pipeline (Trident's
``beginCommit`` ... ``commit``). The order a commit runs these in, with what it does between
them, is ``tridentflow/steps/committer.py``'s ``commit()``; its docstring is the one numbered
list of the protocol.

``CommitAttempt`` knows its ``CommitStore`` (Redis, or memory for ``tridentflow.testing``) and
the map states - not where the batch was staged, how its partials are applied (the caller
writes through the fenced writers ``claim`` gives), nor faults or replication waits: the caller
hangs those on the phases through ``PhaseHooks``. Its methods, each one step: ``begin`` (the
fencing token; CommitOrderError unless the ledger stands at txid-1, checked inside the store),
``claim`` (shards checked and claimed, one fenced writer per state), ``expect``/``wrote``
(``half_written`` fires once half of the keys are in), ``finish_writes`` (expiry, the rollback
of keys only an earlier attempt wrote, change logs), ``mark`` (``written`` fires, the ledger
marks txid and offsets atomically, ``marked`` fires) and ``settle`` (idempotent, best effort:
what a crash leaves reads the same and is redone by the next commit).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from typing import Any, Protocol

import redis

from tridentflow_state.backing import BackingMap, Fence
from tridentflow_state.batch_times import BatchTimes, ExpiryRule, horizon_by_time
from tridentflow_state.changes import record_changes, trim_changes
from tridentflow_state.errors import CommitOrderError
from tridentflow_state.keys import KeySpace
from tridentflow_state.ledger import CommitTicket, Ledger
from tridentflow_state.maps import MapState, StateKind, make_map_state
from tridentflow_state.shards import claim_shards, ensure_shards, settle_shards
from tridentflow_state.undo import trim_undo


class CommitStore(Protocol):
    """What a commit attempt keeps besides the map states: the ledger (tokens, the mark,
    the history), the shards' claims, the batch times, the change and undo logs. Redis in
    production (``RedisCommitStore``); memory in ``tridentflow.testing``
    (``MemoryCommitStore``): the attempt's phases are the same code over either."""

    def begin(self, txid: int) -> CommitTicket | None:
        """A fencing token for ``txid``; None if committed already; CommitOrderError unless
        the ledger stands at txid-1."""
        ...

    def claim_shards(self, shards: int | None, states: Sequence[str], fence: Fence) -> None:
        """The shard count checked (``shards``: the one asked for) and every shard claimed."""
        ...

    def batch_horizons(
        self, fence: Fence, at_ms: int, retain_txids: int, periods: Sequence[int]
    ) -> dict[int, int]:
        """The txid's batch time recorded; period (ms) -> the expiry horizon by time."""
        ...

    def record_changes(self, state: str, fence: Fence, keys: list[str]) -> None:
        """The txid's change log of ``state`` (its values after the txid, of ``keys``)."""
        ...

    def mark(
        self,
        ticket: CommitTicket,
        offsets: Mapping[int, int],
        settled: list[str],
        stats: Mapping[str, Any],
        retain_txids: int,
    ) -> bool:
        """Txid and offsets committed together, atomically; False if another attempt did."""
        ...

    def record_history(self, txid: int) -> None: ...

    def close_shards(self, txid: int, settled: list[str]) -> None:
        """After the mark: the shards closed to the txid."""
        ...

    def trim(self, txid: int, changed: Iterable[str], limit: int, states: Iterable[str]) -> None:
        """After the mark: ``limit`` change logs kept of each ``changed`` state, the undo logs
        retention no longer covers trimmed."""
        ...


class RedisCommitStore:
    """A ``CommitStore`` in Redis: the pipeline's ledger and keyspace."""

    def __init__(self, ledger: Ledger, client: redis.Redis, keyspace: KeySpace) -> None:
        self.ledger, self.client, self.keyspace = ledger, client, keyspace

    def begin(self, txid: int) -> CommitTicket | None:
        return self.ledger.begin_commit(txid)

    def claim_shards(self, shards: int | None, states: Sequence[str], fence: Fence) -> None:
        ensure_shards(self.client, self.keyspace, shards)
        claim_shards(self.client, self.keyspace, list(states), fence)

    def batch_horizons(
        self, fence: Fence, at_ms: int, retain_txids: int, periods: Sequence[int]
    ) -> dict[int, int]:
        return BatchTimes(self.client, self.keyspace).claim(fence, at_ms, retain_txids, periods)

    def record_changes(self, state: str, fence: Fence, keys: list[str]) -> None:
        record_changes(self.client, self.keyspace, state, fence, keys)

    def mark(
        self,
        ticket: CommitTicket,
        offsets: Mapping[int, int],
        settled: list[str],
        stats: Mapping[str, Any],
        retain_txids: int,
    ) -> bool:
        return self.ledger.mark_committed(
            ticket, offsets, settled, stats, retain_txids, unbuilt=settled
        )

    def record_history(self, txid: int) -> None:
        self.ledger.record_history(txid)

    def close_shards(self, txid: int, settled: list[str]) -> None:
        settle_shards(self.client, self.keyspace, settled, txid)

    def trim(self, txid: int, changed: Iterable[str], limit: int, states: Iterable[str]) -> None:
        for name in changed:  # a sink further behind than this reloads or fails
            trim_changes(self.client, self.keyspace, name, txid, limit)
        trim_undo(self.client, self.keyspace, states)


class MemoryCommitStore:
    """A ``CommitStore`` in memory, for ``tridentflow.testing``: the ledger's order and
    tokens, the batch times; no shards, no change or undo logs (the harness exports from the
    states). Not thread-safe; one pipeline."""

    def __init__(self) -> None:
        self.committed = 0
        self.tokens = 0
        self.times: dict[int, int] = {}
        """txid -> its batch time, as the batch times Redis keeps."""

    def begin(self, txid: int) -> CommitTicket | None:
        if txid <= self.committed:
            return None
        if txid != self.committed + 1:
            raise CommitOrderError(
                f"txid {txid} cannot commit: the ledger stands at {self.committed}"
            )
        self.tokens += 1
        return CommitTicket(txid, self.tokens)

    def claim_shards(self, shards: int | None, states: Sequence[str], fence: Fence) -> None:
        return None

    def batch_horizons(
        self, fence: Fence, at_ms: int, retain_txids: int, periods: Sequence[int]
    ) -> dict[int, int]:
        earlier = {t: ms for t, ms in self.times.items() if t < fence.txid}
        self.times[fence.txid] = at_ms
        return {period: horizon_by_time(earlier, fence.txid, at_ms, period) for period in periods}

    def record_changes(self, state: str, fence: Fence, keys: list[str]) -> None:
        return None

    def mark(
        self,
        ticket: CommitTicket,
        offsets: Mapping[int, int],
        settled: list[str],
        stats: Mapping[str, Any],
        retain_txids: int,
    ) -> bool:
        if ticket.txid != self.committed + 1 or ticket.token != self.tokens:
            return False
        self.committed = ticket.txid
        return True

    def record_history(self, txid: int) -> None:
        return None

    def close_shards(self, txid: int, settled: list[str]) -> None:
        return None

    def trim(self, txid: int, changed: Iterable[str], limit: int, states: Iterable[str]) -> None:
        return None


class PhaseHooks:
    """What a caller does at the protocol's points (each fires from one place): subclass and
    override. An exception from a hook ends the attempt there, as a crash would."""

    def half_written(self, attempt: CommitAttempt) -> None:
        """Half of the batch's keys are written (none, for an empty batch)."""

    def written(self, attempt: CommitAttempt) -> None:
        """Every write of the attempt is in; the mark comes next."""

    def marked(self, attempt: CommitAttempt) -> None:
        """The ledger's mark is written (or a concurrent attempt's was); settling comes next."""


class CommitAttempt:
    """One attempt at committing ``ticket.txid``: not thread-safe, used once, in order."""

    def __init__(
        self,
        store: CommitStore,
        ticket: CommitTicket,
        retain_txids: int = 0,
        hooks: PhaseHooks | None = None,
    ) -> None:
        self.store = store
        self.ticket = ticket
        self.retain_txids = retain_txids
        self.hooks = hooks or PhaseHooks()
        self.fence = Fence(ticket.txid, ticket.token, ticket.generation, undo=retain_txids > 0)
        self.writers: dict[str, MapState] = {}
        self.kinds: dict[str, StateKind] = {}
        self.marked = False
        self.expiring: dict[str, ExpiryRule] = {}
        """State -> its expiry rule (``claim``)."""
        self.batch_time: int | None = None
        """The batch time the txid's metadata froze (``claim``; None: none)."""
        self.horizons: dict[str, int] = {}
        """State -> the txid at or before which a key's last update is too old (``claim``)."""
        self.expired: dict[str, list[str]] = {}
        """State -> the keys this attempt expired (``finish_writes``)."""
        self.applied_horizons: dict[str, int | None] = {}
        """State -> the horizon its expiry applied (``finish_writes``): ``horizons``', or None
        at the txid that builds the state's index (nothing expires there)."""
        self.expected = 0
        """The keys the writes will report (``expect``)."""
        self._half = 0
        self._written = 0
        self._fired = False

    @classmethod
    def begin(
        cls,
        ledger: Ledger,
        client: redis.Redis,
        keyspace: KeySpace,
        txid: int,
        retain_txids: int = 0,
        hooks: PhaseHooks | None = None,
    ) -> CommitAttempt | None:
        """A new attempt over Redis with its own fencing token; None if ``txid`` is committed
        already."""
        return cls.begin_in(RedisCommitStore(ledger, client, keyspace), txid, retain_txids, hooks)

    @classmethod
    def begin_in(
        cls,
        store: CommitStore,
        txid: int,
        retain_txids: int = 0,
        hooks: PhaseHooks | None = None,
    ) -> CommitAttempt | None:
        """``begin`` over any ``CommitStore`` (``tridentflow.testing``'s in memory)."""
        ticket = store.begin(txid)
        if ticket is None:
            return None
        return cls(store, ticket, retain_txids, hooks)

    @property
    def txid(self) -> int:
        return self.ticket.txid

    @property
    def token(self) -> int:
        return self.ticket.token

    # -- 2. claim -------------------------------------------------------------------------------
    def claim(
        self,
        states: Mapping[str, tuple[StateKind, BackingMap]],
        shards: int | None,
        expiring: Mapping[str, ExpiryRule | int] | None = None,
        at_ms: int | None = None,
    ) -> dict[str, MapState]:
        """Check the shard count (``shards``: the one asked for; None: the stored one),
        claim every shard, and open one fenced writer per state
        (name -> its MapState, in the order given); ``expiring``: state -> its expiry rule
        (an int: expire_after_txids), ``at_ms`` the batch time the txid's metadata froze
        (None: none; a rule in time then expires nothing at this txid). Idempotent for this
        attempt."""
        self.expiring = {
            name: rule if isinstance(rule, ExpiryRule) else ExpiryRule(after_txids=rule)
            for name, rule in (expiring or {}).items()
        }
        self.store.claim_shards(shards, self._settled_at_mark(states), self.fence)
        self.batch_time = at_ms
        self.horizons = self._horizons(at_ms)
        for name, (kind, backing) in states.items():
            writer = make_map_state(kind, backing, name)
            writer.begin_commit(self.txid, self.fence)
            self.writers[name], self.kinds[name] = writer, kind
        for name, horizon in self.horizons.items():  # before the writes: their stamps are T's
            self.writers[name].compact_expiry(horizon)
        return self.writers

    def _horizons(self, at_ms: int | None) -> dict[str, int]:
        """State -> its expiry horizon at this txid; a rule in time reads (and the txid's
        batch time joins) the batch times (tridentflow_state.batch_times). Fenced."""
        periods = sorted({r.after_ms for r in self.expiring.values() if r.after_ms is not None})
        by_time: dict[int, int] = {}
        if periods and at_ms is not None:
            by_time = self.store.batch_horizons(self.fence, at_ms, self.retain_txids, periods)
        return {
            name: rule.horizon(self.txid, by_time.get(rule.after_ms or 0, 0))
            for name, rule in self.expiring.items()
        }

    # -- 3. writes ------------------------------------------------------------------------------
    def expect(self, keys: int) -> None:
        """The number of keys the writes will report; an empty batch is half written now."""
        self.expected = keys
        self._half = keys // 2
        self.wrote(0)

    def reaches_half(self, keys: int) -> bool:
        """Whether ``keys`` more written would reach the half (and fire ``half_written``)."""
        return not self._fired and self._written + keys >= self._half

    def keys_to_half(self) -> int:
        """Keys still to write before the half (0 once reached): a writer ends a chunk there."""
        return max(0, self._half - self._written)

    def wrote(self, keys: int) -> None:
        """``keys`` more are written (really in Redis): ``half_written`` once the half is
        reached."""
        self._written += keys
        if not self._fired and self._written >= self._half:
            self._fired = True
            self.hooks.half_written(self)

    def expiry_record(self) -> dict[str, list[int | None]]:
        """State -> [expire_after_txids, expire_after in ms, the horizon applied (None:
        nothing expired: the txid built the index)] for each expiring state: what the history
        keeps, so ``audit`` recounts each txid by the rule of the code that committed it."""
        return {
            name: [rule.after_txids, rule.after_ms, self.applied_horizons.get(name)]
            for name, rule in self.expiring.items()
        }

    # -- 4. finish the writes -------------------------------------------------------------------
    def finish_writes(
        self, batch_keys: Callable[[str], Iterable[str]], logged: Iterable[str] = ()
    ) -> int:
        """Expire the keys of each expiring state last updated at or before its horizon
        (``expired``); roll back the keys an earlier attempt wrote that this batch
        lacks; write the change log of each ``logged`` state (the keys the txid changed, its
        expired keys with them). ``batch_keys(state)`` lists the batch's keys of a state (its
        staged keys); called only where needed. Fenced; returns the keys rolled back."""
        for name, horizon in self.horizons.items():
            keys = partial(batch_keys, name)
            writer = self.writers[name]
            self.applied_horizons[name] = horizon if writer.expiry_in_force() else None
            self.expired[name] = writer.expire(horizon, keys)
        rolled_back = sum(
            writer.rollback_stray_keys(partial(batch_keys, name))
            for name, writer in self.writers.items()
        )
        for name in logged:
            keys = [*batch_keys(name), *self.expired.get(name, ())]
            self.store.record_changes(name, self.fence, keys)
        return rolled_back

    def _settled_at_mark(self, names: Iterable[str]) -> list[str]:
        """The states whose written-sets go at the mark: all but the expiring ones, whose
        sets the expiry index merges after it (tridentflow_state.expiry)."""
        return [name for name in names if name not in self.expiring]

    # -- 5. mark --------------------------------------------------------------------------------
    def mark(self, offsets: Mapping[int, int], stats: Mapping[str, Any]) -> bool:
        """``written``, then the ledger's mark (committed txid and source ``offsets`` together,
        atomically; ``stats`` kept with it), then ``marked``, then the history entry (its own
        script: a crash before it is caught up by a retry or the next txid). False if a
        concurrent attempt of the txid marked it first (this one wrote nothing after that)."""
        self.hooks.written(self)
        settled = self._settled_at_mark(self.writers)  # their expiry indexes stop following
        self.marked = self.store.mark(self.ticket, offsets, settled, stats, self.retain_txids)
        self.hooks.marked(self)
        if self.marked:
            self.store.record_history(self.txid)
        return self.marked

    # -- 6. settle ------------------------------------------------------------------------------
    def settle(self, changed: Iterable[str] = (), change_log_limit: int = 0) -> int:
        """After the mark: close the shards, end the writers' scopes, drop the tombstones the
        txid left, keep ``change_log_limit`` change logs of each ``changed`` state, trim the
        undo logs retention no longer covers. Only the attempt that marked does more than end
        its scopes. Returns the tombstones dropped."""
        removed = {name: writer.tombstones() for name, writer in self.writers.items()}
        if self.marked:
            self.store.close_shards(self.txid, self._settled_at_mark(self.writers))
        for writer in self.writers.values():
            writer.commit()
        if not self.marked:
            return 0
        dropped = 0
        for name, keys in removed.items():  # gone from the store now that no replay needs them
            if keys:
                tx = None if self.kinds[name] is StateKind.NON_TRANSACTIONAL else self.txid
                backing = self.writers[name].backing
                dropped += backing.drop_tombstones(tx, keys, self.ticket.generation)
        for name, horizon in self.horizons.items():  # the index follows what the txid wrote
            index = self.writers[name].backing.expiry
            index.merge(self.txid)
            if index.built():
                index.forget(horizon)  # this txid expired by them
            else:
                index.rebuild()
        self.store.trim(self.txid, changed, change_log_limit, self.writers.keys())
        return dropped
