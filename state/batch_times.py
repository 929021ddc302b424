"""Expiry in time: a state with ``expire_after = P`` (a period) loses, at the commit of txid T,
every key whose last update was at a txid whose *batch time* is at or before T's minus P, and
which T does not update.

A batch time is what the coordinator froze into the txid's metadata (``at_ms``: Redis's clock
when the metadata was first stored, never below the txid before's - batch times never go back
along the txids), never the committing machine's clock: every attempt of T - a retry, a replay
after a crash, a zombie - reads the same time and decides the same. The rule becomes a txid
*horizon* - the newest txid before T whose batch time is <= T's - P (0: none) - and the expiry
index (tridentflow_state.expiry) removes what it removes for a horizon in txids; with both
rules on one state the later horizon wins (a key goes when either rule says so).

The batch times of the committed txids are one sorted set in the ledger's slot (score: the
txid; member ``<txid>:<ms>``), written by the claim of each txid that has a time (CLAIM_TIMES:
fenced like a write of the txid; it replaces what a rewound era left at and after the txid) and
read there by a binary search (times are non-decreasing in txids). Exact where the running code
can ask: once txid T is marked, a rewind goes back at most to T - ``retain_txids`` and the next
claim's batch time is never below the txid it follows, so every later cut-off of the code's
periods is at or after the batch time of T - ``retain_txids`` minus its longest period; the
newest time at or before that (the *keep* txid) and every later one stay as they are.

Older times are *thinned*, not dropped: of each hour of batch time (THIN_MS) the newest txid
stays. Code deployed later may bring a longer period (to this state or another one) whose
cut-off reaches back there; a search over a subset answers a txid at or before the exact one,
and every txid in between lies in the exact one's hour - so such a period expires a key at
most an hour of batch time late during its first period, never early (dropped, those times
made it expire nothing until its whole period had passed again). That costs one member an
hour of batch time, about 0.6 MB a year. Thinning moves forward from a watermark (the txid
below which the set is thinned: ``KeySpace.batch_times_thinned``) a page at a time, so a
claim's work stays small; a rewind never reaches below it (it is below the keep txid).

A txid whose metadata has no time (coordinated before expiry in time was turned on) records
none and expires nothing by time; nor do keys whose last update has no time until the
cut-off passes a txid that has one - the same for every attempt and for ``audit``'s recount
(``horizon_by_time`` over the times the history kept).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import redis

from tridentflow_state.backing import Fence
from tridentflow_state.keys import KeySpace
from tridentflow_state.scripts import FENCE_CHECK, LuaScript


@dataclass(frozen=True)
class ExpiryRule:
    """When a state's keys expire: after ``after_txids`` txids without an update, after
    ``after_ms`` of batch time without one, or by whichever comes first (both set)."""

    after_txids: int | None = None
    after_ms: int | None = None

    def horizon(self, txid: int, by_time: int = 0) -> int:
        """The txid at or before which an update is too old at the commit of ``txid``
        (``by_time``: the time rule's horizon, ``horizon_by_time``)."""
        parts = []
        if self.after_txids is not None:
            parts.append(txid - self.after_txids)
        if self.after_ms is not None:
            parts.append(by_time)
        return max(parts)

    def horizon_among(self, times: Mapping[int, int], txid: int, at_ms: int | None) -> int:
        """``horizon`` with the time rule judged over ``times`` (txid -> batch time, the
        txids before ``txid``) for batch time ``at_ms`` (None: the txid has none - nothing
        expires by time). What CLAIM_TIMES gives the commit, for the harness and audit."""
        by_time = 0
        if self.after_ms is not None and at_ms is not None:
            by_time = horizon_by_time(times, txid, at_ms, self.after_ms)
        return self.horizon(txid, by_time)


def horizon_by_time(times: Mapping[int, int], txid: int, at_ms: int, after_ms: int) -> int:
    """The newest txid before ``txid`` whose batch time (``times``: txid -> ms, non-decreasing
    in txids) is at or before ``at_ms - after_ms``; 0 if none. What CLAIM_TIMES answers."""
    cutoff = at_ms - after_ms
    return max((t for t, ms in times.items() if t < txid and ms <= cutoff), default=0)


THIN_MS = 3_600_000
"""Older batch times keep the newest txid of each hour (see the module doc)."""

THIN_PAGE = 1000
"""Txids thinned by one claim at most (a claim after a shorter period was deployed may find
many; the next claims go on from the watermark)."""

CLAIM_TIMES = LuaScript(
    "batch_times_claim",
    FENCE_CHECK
    + r"""
-- Record txid ARGV[1]'s batch time, answer each period's horizon, thin the times this code's
-- claims no longer ask for. Fenced like a write of txid ARGV[1] (generation, order, newest token).
-- KEYS[1] batch times (score: txid; member: '<txid>:<ms>')  KEYS[2] ledger
-- KEYS[3] tx hash of ARGV[1]  KEYS[4] generation key
-- KEYS[5] the thinning watermark: the txid below which the set holds the newest txid of each
--         ARGV[6] ms of batch time only
-- ARGV[1] txid  ARGV[2] commit token  ARGV[3] generation  ARGV[4] the txid's batch time (ms)
-- ARGV[5] the oldest txid a rewind may return to  ARGV[6] the thinning step (ms)
-- ARGV[7] txids thinned by one call at most  ARGV[8..] periods (ms)
-- Returns, per period, the newest txid before ARGV[1] whose time is <= ARGV[4] - period (0:
-- none). Idempotent for the txid: what it thins lies before every horizon it answers.
local err = gen_check(KEYS[4], ARGV[3]) or
  fence_check(KEYS[2], KEYS[3], tonumber(ARGV[1]), ARGV[2])
if err then return redis.error_reply(err) end
local txid, at = tonumber(ARGV[1]), tonumber(ARGV[4])
redis.call('ZREMRANGEBYSCORE', KEYS[1], txid, '+inf')  -- a rewound era's, at and after txid
local before = redis.call('ZCARD', KEYS[1])  -- the times of the txids before: ranks 0..before-1
redis.call('ZADD', KEYS[1], txid, txid .. ':' .. at)
local function parse(member)  -- '<txid>:<ms>' -> txid, ms
  local t, ms = string.match(member, '^(%d+):(%-?%d+)$')
  return tonumber(t), tonumber(ms)
end
local function entry(rank)
  return parse(redis.call('ZRANGE', KEYS[1], rank, rank)[1])
end
local function newest_at_or_before(cutoff)
  local lo, hi, found = 0, before - 1, 0
  while lo <= hi do
    local mid = math.floor((lo + hi) / 2)
    local t, ms = entry(mid)
    if ms <= cutoff then found, lo = t, mid + 1 else hi = mid - 1 end
  end
  return found
end
local horizons, longest = {}, 0
for i = 8, #ARGV do
  local period = tonumber(ARGV[i])
  horizons[#horizons + 1] = newest_at_or_before(at - period)
  if period > longest then longest = period end
end
local step, thin_page = tonumber(ARGV[6]), tonumber(ARGV[7])
-- Thin the times of the txids in [watermark, keep): of each step of batch time the newest
-- txid stays (compared with the newest below the watermark too), a page at a time.
local function thin_before(keep)
  local from = tonumber(redis.call('GET', KEYS[5]) or '0')
  if keep <= from then return end
  local prev = redis.call('ZREVRANGEBYSCORE', KEYS[1], '(' .. from, '-inf', 'LIMIT', 0, 1)[1]
  local page = redis.call('ZRANGEBYSCORE', KEYS[1], from, '(' .. keep, 'LIMIT', 0, thin_page)
  local upto = keep
  if #page == thin_page then upto = parse(page[#page]) + 1 end
  for _, member in ipairs(page) do
    if prev then
      local _, prev_ms = parse(prev)
      local _, ms = parse(member)
      if math.floor(prev_ms / step) == math.floor(ms / step) then
        redis.call('ZREM', KEYS[1], prev)
      end
    end
    prev = member
  end
  redis.call('SET', KEYS[5], upto)
end
local oldest = redis.call('ZRANGEBYSCORE', KEYS[1], ARGV[5], ARGV[5])[1]
if oldest then
  local _, oldest_ms = parse(oldest)
  local keep = newest_at_or_before(oldest_ms - longest)
  if keep > 0 then thin_before(keep) end
end
return horizons
""",
)


class BatchTimes:
    """The batch times of a pipeline's committed txids (one sorted set in the ledger's slot)."""

    def __init__(self, client: redis.Redis, keyspace: KeySpace) -> None:
        self.client, self.keyspace = client, keyspace

    @property
    def key(self) -> str:
        return self.keyspace.batch_times

    def claim(
        self, fence: Fence, at_ms: int, retain_txids: int, periods: Sequence[int]
    ) -> dict[int, int]:
        """At the claim of ``fence.txid`` (batch time ``at_ms``): record its time and return
        period -> horizon (``horizon_by_time`` over the recorded times). Fenced (FencedError,
        CommitOrderError, GenerationError: nothing written); idempotent for the txid."""
        ks, txid = self.keyspace, fence.txid
        keys = [self.key, ks.ledger, ks.tx(txid), ks.generation, ks.batch_times_thinned]
        oldest = max(txid - retain_txids, 0)  # once txid is marked, a rewind goes back to it
        args = [txid, fence.token, fence.generation, int(at_ms), oldest, THIN_MS, THIN_PAGE]
        args += periods
        found = CLAIM_TIMES(self.client, keys, args)
        return dict(zip(periods, (int(h) for h in found), strict=True))

    def time_of(self, txid: int) -> int | None:
        """The recorded batch time of ``txid`` (None: none recorded, or dropped)."""
        members = self.client.zrangebyscore(self.key, txid, txid)
        return int(_text(members[0]).split(":")[1]) if members else None

    def all(self) -> dict[int, int]:
        """Every recorded txid -> its batch time (what is kept: see the module doc)."""
        pairs = (_text(m).split(":") for m in self.client.zrange(self.key, 0, -1))
        return {int(t): int(ms) for t, ms in pairs}


def _text(member: bytes | str) -> str:
    return member.decode() if isinstance(member, bytes) else member
