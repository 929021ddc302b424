"""The per-pipeline txid ledger in Redis.

What it records, and the contract of each operation:

* run id -> txid (``bind_run``): assigned once, atomically; the same run id gets the same txid on
  every retry while it owns it. A txid whose owner stopped (released, or lease expired) is
  adopted by the next run, so a new run never skips an unfinished txid.
* per-txid batch metadata (``store_metadata``): the first writer wins; later calls get the stored
  copy. Metadata must survive a JSON round trip (Storm's STORM-2675).
* per-txid attempt counters (``next_attempt``) for each step, and the newest complete emit
  attempt (``record_staged``).
* the last committed txid and committed source offsets, moved together by ``mark_committed``
  only after every key of the txid was written; ``begin_commit`` hands out fencing tokens and
  refuses txid N unless the ledger stands at N-1.
* the pipeline's generation: a ``Ledger`` pins the generation current when it is first used,
  and every write it makes (every script, every fenced state write) is refused with
  GenerationError once a ``reset`` (or a Redis that lost its data) replaced it. ``reset``
  refuses while a run holds a live lease on a pending txid, unless forced.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from itertools import chain
from typing import Any

import redis

from tridentflow_state.errors import (
    CommitsHeldError,
    GenerationError,
    MetadataError,
    RetryError,
    StateError,
)
from tridentflow_state.keys import KeySpace
from tridentflow_state.replication import wait_for_replicas
from tridentflow_state.rewind import REWIND_PREFIX
from tridentflow_state.scripts import (
    BEGIN_COMMIT,
    BIND_RUN,
    CLAIM_TXID,
    COUNT_ATTEMPT,
    MARK_COMMITTED,
    NEW_GENERATION,
    RECORD_SETTINGS,
    RECORD_STAGED,
    RECORD_TASK,
    RENEW_LEASE,
    STORE_METADATA,
)
from tridentflow_state.shards import set_shard_generations

DEFAULT_LEASE_MS = 15 * 60 * 1000
HISTORY_LENGTH = 1000
"""Commits kept in the ledger's history (newest first)."""


@dataclass(frozen=True)
class Binding:
    """The txid a run is bound to. ``how``: committed | bound | adopted | new."""

    txid: int
    how: str
    committed: int

    @property
    def already_committed(self) -> bool:
        return self.txid <= self.committed


@dataclass(frozen=True)
class CommitTicket:
    """A commit attempt: ``token`` fences out older attempts of the same txid, ``generation``
    any attempt started before a reset."""

    txid: int
    token: int
    generation: str = ""


def _s(value: bytes | str | None) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else value


def check_json_round_trip(what: str, value: Any) -> str:
    """Encode ``value`` as JSON and refuse it unless it decodes back to an equal value."""
    try:
        encoded = json.dumps(value, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise MetadataError(f"{what} is not JSON-serialisable: {exc}") from exc
    if json.loads(encoded) != value:
        raise MetadataError(
            f"{what} does not survive a JSON round trip (tuples, non-string dict keys?): {value!r}"
        )
    return encoded


def _new_generation() -> str:
    return secrets.token_hex(6)


class Ledger:
    def __init__(
        self,
        client: redis.Redis,
        pipeline: str,
        generation: str | None = None,
        namespace: str = "",
        shards: int = 1,
        reset_shards: int | None = None,
    ) -> None:
        """``shards``: the state shards the pipeline's state is stored in; ``reset_shards``:
        the count it is laid out in after a ``reset`` (default: the same)."""
        self.client = client
        self.keys = KeySpace(pipeline, namespace, shards=shards)
        self.reset_shards = reset_shards or shards
        self.pipeline = pipeline
        self._generation = generation

    @property
    def generation(self) -> str:
        """The generation this ledger works in: pinned on first use (created if the pipeline
        has none yet). Every write is refused once the pipeline's generation differs."""
        if self._generation is None:
            key = self.keys.generation
            self.client.set(key, _new_generation(), nx=True)
            current = _s(self.client.get(key)) or ""
            if current.startswith(REWIND_PREFIX):
                raise GenerationError(self._rewinding_message())
            self._generation = current
        return self._generation

    def _rewinding_message(self) -> str:
        target = _s(self.client.hget(self.keys.undo_meta, "rewinding")) or "?"
        return (
            f"pipeline {self.pipeline} is being rewound to txid {target}: no step runs until "
            f"the rewind is done (if it was cut short, finish it: tridentflow rewind "
            f"{self.pipeline} --to {target})"
        )

    def lineage(self) -> str:
        """The generation this pipeline's lineage began with (state.keys.KeySpace.lineage):
        a reset changes it, a rewind does not."""
        return _s(self.client.get(self.keys.lineage)) or self.generation

    def current_generation(self) -> str | None:
        """The pipeline's generation in Redis now (None if it has none)."""
        return _s(self.client.get(self.keys.generation))

    def check_generation(self) -> None:
        """GenerationError if the pipeline was reset (or rewound) since this ledger pinned its
        generation, or is being rewound now.
        A step calls it first, for a clear error; the scripts check again, atomically."""
        pinned, current = self.generation, self.current_generation()
        if current is not None and current.startswith(REWIND_PREFIX):
            raise GenerationError(self._rewinding_message())
        if current != pinned:
            now = f"generation {current}" if current else "no generation: Redis lost its data?"
            raise GenerationError(
                f"this step belongs to generation {pinned} of pipeline {self.pipeline}, which "
                f"was reset or rewound since ({now}); it must not touch the new pipeline: start "
                "a new run"
            )

    # -- reads ------------------------------------------------------------------------------
    def committed_txid(self) -> int:
        return int(self.client.hget(self.keys.ledger, "committed") or 0)

    def last_txid(self) -> int:
        return max(int(self.client.hget(self.keys.ledger, "last_txid") or 0), self.committed_txid())

    def committed_offsets(self) -> dict[int, int]:
        raw = self.client.hgetall(self.keys.offsets)
        return {int(k): int(v) for k, v in raw.items()}

    def base_offsets(self) -> dict[int, int]:
        """Where this generation started reading, per partition (0 where not recorded)."""
        raw = self.client.hgetall(self.keys.base_offsets)
        return {int(k): int(v) for k, v in raw.items()}

    def start_at(self, offsets: Mapping[int, int]) -> None:
        """A fresh generation (right after ``reset``) starts reading at ``offsets``: they are
        its committed offsets and its base offsets. Only before anything is committed."""
        if not offsets:
            return
        if self.committed_txid() != 0:
            raise StateError(f"pipeline {self.pipeline} has committed txids: reset it first")
        mapping = {int(p): int(o) for p, o in offsets.items()}
        self.client.hset(self.keys.offsets, mapping=mapping)
        self.client.hset(self.keys.base_offsets, mapping=mapping)

    def tx_info(self, txid: int) -> dict[str, str]:
        raw = self.client.hgetall(self.keys.tx(txid))
        return {_s(k): _s(v) for k, v in raw.items()}  # type: ignore[misc]

    def txid_of_run(self, run_id: str) -> int | None:
        """The txid ``run_id`` is bound to; None if none, or if another run adopted it."""
        raw = _s(self.client.hget(self.keys.runs, run_id))
        return None if raw is None or not raw.isdigit() else int(raw)

    def rewound_txid(self, run_id: str) -> tuple[int, int] | None:
        """(txid, the txid the pipeline was rewound to) if ``run_id`` was bound to a txid a
        rewind took back (tridentflow_state.rewind)."""
        raw = _s(self.client.hget(self.keys.runs, run_id))
        if raw is None or not raw.startswith("rewound:"):
            return None
        _rewound, txid, target = raw.split(":", 2)
        return int(txid), int(target)

    def rewinds(self, limit: int = 20) -> list[dict[str, Any]]:
        """The last rewinds, newest first: {to, committed, last, at_ms}."""
        return [json.loads(r) for r in self.client.lrange(self.keys.rewinds, 0, limit - 1)]

    def runs_of_txid(self, txid: int) -> dict[str, str | None]:
        """Every run bound to ``txid`` that the ledger remembers: run id -> None for the run
        bound to it now, or the run that adopted it from this one. Read-only; scans the runs
        hash (one entry per run bound since the last reset)."""
        found: dict[str, str | None] = {}
        for raw_run, raw in self.client.hscan_iter(self.keys.runs, count=1000):
            run_id, value = _s(raw_run), _s(raw)
            if value == str(txid):
                found[run_id] = None
            elif value.startswith(f"lost:{txid}:"):
                found[run_id] = value.split(":", 2)[2]
        return found

    def runs_by_txid(self) -> dict[int, list[str]]:
        """txid -> every run bound to it that the ledger remembers (the runs it was adopted
        from included), sorted; one scan of the runs hash. Read-only."""
        found: dict[int, list[str]] = {}
        for raw_run, raw in self.client.hscan_iter(self.keys.runs, count=1000):
            run_id, value = _s(raw_run), _s(raw)
            txid = value.split(":", 2)[1] if value.startswith("lost:") else value
            if txid.isdigit():
                found.setdefault(int(txid), []).append(run_id)
        return {txid: sorted(runs) for txid, runs in found.items()}

    def lost_txid(self, run_id: str) -> tuple[int, str] | None:
        """(txid, adopting run) if another run adopted the txid ``run_id`` was bound to."""
        raw = _s(self.client.hget(self.keys.runs, run_id))
        if raw is None or not raw.startswith("lost:"):
            return None
        _lost, txid, adopter = raw.split(":", 2)
        return int(txid), adopter

    # -- runs -------------------------------------------------------------------------------
    def bind_run(
        self, run_id: str, lease_ms: int = DEFAULT_LEASE_MS, adopt_live: bool = False
    ) -> Binding:
        """Bind ``run_id`` to a txid (see module doc). Atomic; idempotent per run id."""
        if not run_id:
            raise ValueError("run id must be a non-empty string")
        generation = self.generation
        while True:
            raw_committed, raw_last = self.client.hmget(self.keys.ledger, "committed", "last_txid")
            committed = int(raw_committed or 0)
            last = max(int(raw_last or 0), committed)
            keys = [self.keys.ledger, self.keys.runs, self.keys.generation]
            keys += [self.keys.tx(n) for n in range(committed + 1, last + 2)]
            args = [run_id, int(lease_ms), "1" if adopt_live else "0", generation]
            try:
                txid, how, committed = BIND_RUN(self.client, keys, [*args, committed, last])
            except RetryError:
                continue  # another run committed or bound meanwhile
            return Binding(int(txid), _s(how) or "", int(committed))

    def claim(self, txid: int, run_id: str, lease_ms: int = DEFAULT_LEASE_MS) -> Binding:
        """Bind ``run_id`` to this exact ``txid`` (pending, or the next new one). Atomic."""
        got, how = CLAIM_TXID(
            self.client,
            [self.keys.ledger, self.keys.runs, self.keys.tx(txid), self.keys.generation],
            [int(txid), run_id, int(lease_ms), self.generation],
        )
        return Binding(int(got), _s(how) or "", self.committed_txid())

    def renew_lease(self, txid: int, run_id: str, lease_ms: int = DEFAULT_LEASE_MS) -> bool:
        keys = [self.keys.tx(txid), self.keys.generation]
        return bool(RENEW_LEASE(self.client, keys, [run_id, int(lease_ms), self.generation]))

    def release(self, txid: int, run_id: str) -> bool:
        """Give up ``run_id``'s claim on ``txid`` so the next run adopts it at once."""
        keys = [self.keys.tx(txid), self.keys.generation]
        return bool(RENEW_LEASE(self.client, keys, [run_id, 0, self.generation]))

    # -- metadata and attempts ----------------------------------------------------------------
    def store_metadata(self, txid: int, meta: Mapping[str, Any]) -> dict[str, Any] | None:
        """Store ``meta`` for ``txid`` unless some is stored already; return what is stored
        (None: the txid was committed meanwhile and its metadata is gone - nothing written)."""
        encoded = check_json_round_trip(f"metadata of txid {txid}", dict(meta))
        keys = [self.keys.tx(txid), self.keys.generation, self.keys.ledger]
        STORE_METADATA(self.client, keys, [encoded, self.generation, int(txid)])
        return self.metadata(txid)

    def metadata(self, txid: int) -> dict[str, Any] | None:
        raw = self.client.hget(self.keys.tx(txid), "meta")
        if raw is None:
            return None
        try:
            value = json.loads(raw)
        except ValueError as exc:
            raise MetadataError(f"metadata of txid {txid} is not JSON: {raw!r}") from exc
        if not isinstance(value, dict):
            raise MetadataError(f"metadata of txid {txid} is not an object: {value!r}")
        return value

    def next_attempt(self, txid: int, step: str) -> int:
        """Count one more attempt of ``step`` (coordinate/emit/...) for ``txid``; return it -
        0 for a committed txid (nothing counted: its tx hash is never recreated)."""
        keys = [self.keys.tx(txid), self.keys.generation, self.keys.ledger]
        return int(COUNT_ATTEMPT(self.client, keys, [step, self.generation, int(txid)]))

    def record_task(
        self,
        txid: int,
        step: str,
        try_number: int,
        started_ms: int,
        ended_ms: int | None = None,
        run_id: str = "",
    ) -> None:
        """What the orchestrator knows of ``step``'s task for ``txid`` (RECORD_TASK): try
        ``try_number`` of run ``run_id`` started at ``started_ms`` (and ended at ``ended_ms``).
        Tries are summed over runs, durations over tries. Idempotent per (run, try)."""
        keys = [self.keys.tx(txid), self.keys.generation, self.keys.ledger]
        args = [step, self.generation, int(try_number), int(started_ms)]
        ended = "" if ended_ms is None else int(ended_ms)
        RECORD_TASK(self.client, keys, [*args, ended, run_id, int(txid)])

    def settings(self) -> dict[str, str]:
        """The pipeline's recorded settings (RECORD_SETTINGS): name -> value. Read-only."""
        raw = self.client.hgetall(self.keys.ledger)
        prefix = "setting:"
        return {_s(k)[len(prefix) :]: _s(v) for k, v in raw.items() if _s(k).startswith(prefix)}

    def record_settings(self, values: Mapping[str, str]) -> int:
        """Record ``values`` as the pipeline's settings (fenced by the generation: a step of
        a reset pipeline records nothing). Idempotent; returns how many changed."""
        flat = [item for pair in sorted(values.items()) for item in pair]
        keys = [self.keys.ledger, self.keys.generation]
        return int(RECORD_SETTINGS(self.client, keys, [self.generation, *flat]))

    def attempts(self, txid: int, step: str) -> int:
        return int(self.client.hget(self.keys.tx(txid), f"{step}_attempts") or 0)

    def record_staged(self, txid: int, attempt: int) -> int:
        """Record that emit ``attempt`` of ``txid`` staged complete output; the newest attempt
        wins (a zombie's older attempt finishing late is ignored). Returns the recorded one,
        0 if ``txid`` is committed (nothing recorded: no commit will read the attempt)."""
        keys = [self.keys.tx(txid), self.keys.generation, self.keys.ledger]
        args = [int(attempt), self.generation, int(txid)]
        return int(RECORD_STAGED(self.client, keys, args))

    def staged_attempt(self, txid: int) -> int | None:
        raw = self.client.hget(self.keys.tx(txid), "staged_attempt")
        return None if raw is None else int(raw)

    # -- commit -----------------------------------------------------------------------------
    def begin_commit(self, txid: int) -> CommitTicket | None:
        """New fencing token for a commit of ``txid``; None if it is already committed.

        Raises CommitOrderError unless the ledger stands at txid-1. While a starved reader
        holds commits back (a few ms to seconds, expiring by itself), waits for it.
        """
        generation = self.generation
        keys = [self.keys.ledger, self.keys.tx(txid), self.keys.generation]
        keys += [self.keys.read_hold, self.keys.commit_waiting]
        while True:
            try:
                token, _committed = BEGIN_COMMIT(self.client, keys, [txid, generation])
                break
            except CommitsHeldError as held:
                time.sleep(min(max(held.ms, 1), 5) / 1000)
        token = int(token)
        return None if token == 0 else CommitTicket(txid, token, generation)

    def mark_committed(
        self,
        ticket: CommitTicket,
        offsets: Mapping[int, int],
        state_names: Iterable[str],
        stats: Mapping[str, Any] | None = None,
        retain_txids: int = 0,
    ) -> bool:
        """Atomically set committed=txid and the new offsets. False if already committed.
        With ``retain_txids`` > 0, the undo logs' retained range moves with it (state.undo).

        Raises FencedError if ``ticket`` was superseded, CommitOrderError if out of order.
        """
        txid = ticket.txid
        keys = [self.keys.ledger, self.keys.tx(txid), self.keys.offsets, self.keys.generation]
        keys += [self.keys.history, self.keys.tx(txid - 1), self.keys.undo_meta]
        if not self.keys.sharded:  # a shard's written-sets go when it settles
            keys += [self.keys.written(name, txid) for name in state_names]
        keys.append(self.keys.quarantine_written(txid))
        stats_json = json.dumps(dict(stats or {}), sort_keys=True)
        args: list[Any] = [txid, ticket.token, ticket.generation, stats_json, HISTORY_LENGTH]
        args.append(max(0, int(retain_txids)))
        for partition, offset in sorted(offsets.items()):
            args += [int(partition), int(offset)]
        return bool(MARK_COMMITTED(self.client, keys, args))

    def wait_replicated(self, replicas: int, timeout_ms: int) -> int:
        """Block until at least ``replicas`` replicas of the master holding this pipeline's
        ledger have everything it executed so far (the commit mark included), or
        ``timeout_ms`` passes; the number that acknowledged (tridentflow_state.replication)."""
        return wait_for_replicas(self.client, self.keys.ledger, replicas, timeout_ms)

    # -- maintenance ------------------------------------------------------------------------
    def quarantined(self) -> int:
        return int(self.client.hlen(self.keys.quarantine))

    def history(self, limit: int = 20, start: int = 0) -> list[dict[str, Any]]:
        """The last commits, newest first: txid, run, records, keys, rolled back, quarantined,
        skipped partitions, attempts and start/end times (ms) of each step. Kept in Redis, so
        clearing an Airflow task (which deletes its XCom) never loses what was committed."""
        raw = self.client.lrange(self.keys.history, start, start + max(0, limit) - 1)
        entries = [json.loads(entry) for entry in raw]
        for entry in entries:  # Lua's cjson writes an empty list as {}
            entry["skipped"] = list(entry.get("skipped") or [])
        return entries

    def pending_txids(self) -> list[int]:
        return list(range(self.committed_txid() + 1, self.last_txid() + 1))

    def reset(self, force: bool = False) -> int:
        """Start a new generation and delete every other key of this pipeline (ledger and
        states). Returns the number deleted.

        The new generation is set first, atomically with the check that no run holds a live
        lease on a pending txid (PipelineBusyError unless ``force``): from that moment every
        step of a run still in flight is refused (GenerationError), so none of it can land in
        the fresh pipeline. This ledger moves to the new generation."""
        committed = self.committed_txid()
        pending = [self.keys.tx(n) for n in range(committed + 1, self.last_txid() + 1)]
        generation = _new_generation()
        NEW_GENERATION(
            self.client,
            [self.keys.generation, self.keys.ledger, *pending],
            [generation, "1" if force else "0"],
        )
        self._generation = generation
        self.keys = replace(self.keys, shards=self.reset_shards)
        set_shard_generations(self.client, self.keys, generation)
        keep = {self.keys.generation}
        keep.update(self.keys.shard(i).generation for i in range(self.keys.shards))
        keep.update([k.encode() for k in keep])
        n = 0
        batch: list[bytes] = []
        scans = chain(
            self.client.scan_iter(match=self.keys.pattern, count=1000),
            self.client.scan_iter(match=self.keys.shard_pattern, count=1000),
        )
        for key in scans:
            if key in keep:
                continue
            batch.append(key)
            if len(batch) >= 500:
                n += int(self.client.delete(*batch))
                batch = []
        if batch:
            n += int(self.client.delete(*batch))
        return n
