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
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import redis

from state.errors import MetadataError
from state.keys import KeySpace
from state.scripts import (
    BEGIN_COMMIT,
    BIND_RUN,
    CLAIM_TXID,
    MARK_COMMITTED,
    RECORD_STAGED,
    RENEW_LEASE,
)

DEFAULT_LEASE_MS = 15 * 60 * 1000


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
    """A commit attempt: ``token`` fences out older attempts of the same txid."""

    txid: int
    token: int


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


class Ledger:
    def __init__(self, client: redis.Redis, pipeline: str) -> None:
        self.client = client
        self.keys = KeySpace(pipeline)
        self.pipeline = pipeline

    # -- reads ------------------------------------------------------------------------------
    def committed_txid(self) -> int:
        return int(self.client.hget(self.keys.ledger, "committed") or 0)

    def last_txid(self) -> int:
        return max(int(self.client.hget(self.keys.ledger, "last_txid") or 0), self.committed_txid())

    def committed_offsets(self) -> dict[int, int]:
        raw = self.client.hgetall(self.keys.offsets)
        return {int(k): int(v) for k, v in raw.items()}

    def tx_info(self, txid: int) -> dict[str, str]:
        raw = self.client.hgetall(self.keys.tx(txid))
        return {_s(k): _s(v) for k, v in raw.items()}  # type: ignore[misc]

    def txid_of_run(self, run_id: str) -> int | None:
        raw = self.client.hget(self.keys.runs, run_id)
        return None if raw is None else int(raw)

    # -- runs -------------------------------------------------------------------------------
    def bind_run(
        self, run_id: str, lease_ms: int = DEFAULT_LEASE_MS, adopt_live: bool = False
    ) -> Binding:
        """Bind ``run_id`` to a txid (see module doc). Atomic; idempotent per run id."""
        if not run_id:
            raise ValueError("run id must be a non-empty string")
        txid, how, committed = BIND_RUN(
            self.client,
            [self.keys.ledger, self.keys.runs],
            [run_id, int(lease_ms), "1" if adopt_live else "0", self.keys.tx(0)[:-1]],
        )
        return Binding(int(txid), _s(how) or "", int(committed))

    def claim(self, txid: int, run_id: str, lease_ms: int = DEFAULT_LEASE_MS) -> Binding:
        """Bind ``run_id`` to this exact ``txid`` (pending, or the next new one). Atomic."""
        got, how = CLAIM_TXID(
            self.client,
            [self.keys.ledger, self.keys.runs, self.keys.tx(txid)],
            [int(txid), run_id, int(lease_ms)],
        )
        return Binding(int(got), _s(how) or "", self.committed_txid())

    def renew_lease(self, txid: int, run_id: str, lease_ms: int = DEFAULT_LEASE_MS) -> bool:
        return bool(RENEW_LEASE(self.client, [self.keys.tx(txid)], [run_id, int(lease_ms)]))

    def release(self, txid: int, run_id: str) -> bool:
        """Give up ``run_id``'s claim on ``txid`` so the next run adopts it at once."""
        return bool(RENEW_LEASE(self.client, [self.keys.tx(txid)], [run_id, 0]))

    # -- metadata and attempts ----------------------------------------------------------------
    def store_metadata(self, txid: int, meta: Mapping[str, Any]) -> dict[str, Any]:
        """Store ``meta`` for ``txid`` unless some is stored already; return what is stored."""
        encoded = check_json_round_trip(f"metadata of txid {txid}", dict(meta))
        self.client.hsetnx(self.keys.tx(txid), "meta", encoded)
        stored = self.metadata(txid)
        assert stored is not None
        return stored

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
        """Count one more attempt of ``step`` (coordinate/emit/...) for ``txid``; return it."""
        return int(self.client.hincrby(self.keys.tx(txid), f"{step}_attempts", 1))

    def attempts(self, txid: int, step: str) -> int:
        return int(self.client.hget(self.keys.tx(txid), f"{step}_attempts") or 0)

    def record_staged(self, txid: int, attempt: int) -> int:
        """Record that emit ``attempt`` of ``txid`` staged complete output; the newest attempt
        wins (a zombie's older attempt finishing late is ignored). Returns the recorded one."""
        return int(RECORD_STAGED(self.client, [self.keys.tx(txid)], [int(attempt)]))

    def staged_attempt(self, txid: int) -> int | None:
        raw = self.client.hget(self.keys.tx(txid), "staged_attempt")
        return None if raw is None else int(raw)

    # -- commit -----------------------------------------------------------------------------
    def begin_commit(self, txid: int) -> CommitTicket | None:
        """New fencing token for a commit of ``txid``; None if it is already committed.

        Raises CommitOrderError unless the ledger stands at txid-1.
        """
        keys = [self.keys.ledger, self.keys.tx(txid)]
        token, _committed = BEGIN_COMMIT(self.client, keys, [txid])
        token = int(token)
        return None if token == 0 else CommitTicket(txid, token)

    def mark_committed(
        self,
        ticket: CommitTicket,
        offsets: Mapping[int, int],
        state_names: Iterable[str],
        stats: Mapping[str, Any] | None = None,
    ) -> bool:
        """Atomically set committed=txid and the new offsets. False if already committed.

        Raises FencedError if ``ticket`` was superseded, CommitOrderError if out of order.
        """
        txid = ticket.txid
        keys = [self.keys.ledger, self.keys.tx(txid), self.keys.offsets, self.keys.tx(txid - 1)]
        keys += [self.keys.written(name, txid) for name in state_names]
        keys.append(self.keys.quarantine_written(txid))
        args: list[Any] = [txid, ticket.token, json.dumps(dict(stats or {}), sort_keys=True)]
        for partition, offset in sorted(offsets.items()):
            args += [int(partition), int(offset)]
        return bool(MARK_COMMITTED(self.client, keys, args))

    # -- maintenance ------------------------------------------------------------------------
    def quarantined(self) -> int:
        return int(self.client.hlen(self.keys.quarantine))

    def pending_txids(self) -> list[int]:
        return list(range(self.committed_txid() + 1, self.last_txid() + 1))

    def reset(self) -> int:
        """Delete every key of this pipeline (ledger and states). Returns the number deleted."""
        n = 0
        batch: list[bytes] = []
        for key in self.client.scan_iter(match=self.keys.pattern, count=1000):
            batch.append(key)
            if len(batch) >= 500:
                n += int(self.client.delete(*batch))
                batch = []
        if batch:
            n += int(self.client.delete(*batch))
        return n
