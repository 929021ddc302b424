"""A batch staged in Redis: blocks of ``key TAB partial`` lines next to the shard they belong
to, written by whoever computed them (the emit's driver, or Spark executors) and applied by
the commit inside Redis.

A *block* is one Redis string of at most BLOCK_LINES lines (joined by newlines, none at the
end), all of one state and one state shard, under that shard's hash tag
(``KeySpace.staged_block``): the commit's scripts read it in the slot they write. Its writer
reports a ``BlockRef`` - shard, name, line count, SHA-1 - and only refs listed in the
attempt's manifest count:

* a block is written whole by one SET (never torn), with a TTL (an abandoned attempt's blocks
  go away by themselves);
* a retried or speculative writer of the same block writes it again whole; if its content
  differs from what the manifest recorded, the SHA-1 check refuses the batch (TFBLOCK ->
  StagedBlockError), as it refuses a block that is missing or was changed since;
* every attempt writes under its own (generation, txid, attempt): attempts never mix;
* every block's key goes into its slot's index of the txid (``KeySpace.staged_index``) with
  the block, so ``discard_blocks`` finds an abandoned attempt's blocks - a refused batch, a
  killed Spark task's, an emit that died part-way - without a SCAN, in ``shards + 1`` reads.

Nothing here imports Spark or Airflow: executors use ``BlockWriter`` with a client of their
own.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from tridentflow_state.backing import Fence
from tridentflow_state.errors import StagedBlockError
from tridentflow_state.keys import KeySpace
from tridentflow_state.maps import StateKind
from tridentflow_state.numeric import APPLY_NUMERIC, applied_and_left, script_keys, undo_flag
from tridentflow_state.scripts import LuaScript

_BLOCK_CHECK = r"""
-- a staged block as its manifest names it, else nil and why (tridentflow_state.staged)
local function staged_block(key, sha1, lines)
  local text = redis.call('GET', key)
  if not text then
    return nil, 'TFBLOCK staged block ' .. key .. ' is missing (expired, or deleted by a' ..
      ' reset or another commit): this batch must not commit; emit it again'
  end
  local n = 0
  if #text > 0 then
    n = 1
    for _ in string.gmatch(text, '\n') do n = n + 1 end
  end
  if n ~= tonumber(lines) or redis.sha1hex(text) ~= sha1 then
    return nil, 'TFBLOCK staged block ' .. key .. ' holds ' .. n .. ' lines (manifest: ' ..
      lines .. ') or another checksum: it was torn or overwritten; emit the batch again'
  end
  return text
end
"""

VERIFY_BLOCKS = LuaScript(
    "verify_blocks",
    _BLOCK_CHECK
    + r"""
-- Check staged blocks of one slot against their manifest entries, reading nothing back.
-- KEYS[i] block  ARGV[2i-1] its SHA-1 (hex)  ARGV[2i] its line count
-- Returns #KEYS; TFBLOCK naming the first block that is missing or differs.
for i = 1, #KEYS do
  local text, err = staged_block(KEYS[i], ARGV[2 * i - 1], ARGV[2 * i])
  if not text then return redis.error_reply(err) end
end
return #KEYS
""",
)

_LINES_ARG = "string.gmatch(ARGV[6], "
assert APPLY_NUMERIC.source.count(_LINES_ARG) == 1
_FENCE_LINE = "if err then return redis.error_reply(err) end\n"

APPLY_STAGED_NUMERIC = LuaScript(
    "apply_staged_numeric",
    _BLOCK_CHECK
    + APPLY_NUMERIC.source.replace(
        _FENCE_LINE,
        _FENCE_LINE
        + r"""-- APPLY_NUMERIC over a staged block instead of ARGV[6]: KEYS[7] the block (in the
-- state's slot), ARGV[6] its SHA-1, ARGV[8] its line count (TFBLOCK if it differs: nothing
-- written). The partials never leave Redis.
local LINES, block_err = staged_block(KEYS[7], ARGV[6], ARGV[8])
if not LINES then return redis.error_reply(block_err) end
""",
        1,
    ).replace(_LINES_ARG, "string.gmatch(LINES, "),
)


STORE_MANIFEST = LuaScript(
    "store_manifest",
    """
-- An emit attempt's manifest and the TTL of the hash holding it, in one call: a write its
-- client gave up on (Redis paused, a partition) that lands later still expires.
-- KEYS[1] the txid's manifests hash  ARGV[1] attempt  ARGV[2] manifest JSON  ARGV[3] TTL (s)
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[3]))
return 1
""",
)


BLOCK_LINES = 5000
"""Lines per block: one APPLY_STAGED_NUMERIC call holds Redis for ~25 ms."""

BLOCK_TTL_S = 7 * 24 * 3600
"""Seconds a staged block lives: a txid pending longer is emitted again (StagedBlockError)."""

VERIFY_BATCH = 500
"""Blocks checked per VERIFY_BLOCKS call."""


@dataclass(frozen=True)
class BlockRef:
    """One staged block as its writer reported it."""

    shard: int
    name: str
    lines: int
    sha1: str

    def to_json(self) -> list[Any]:
        return [self.shard, self.name, self.lines, self.sha1]

    @classmethod
    def from_json(cls, raw: Sequence[Any]) -> BlockRef:
        shard, name, lines, sha1 = raw
        return cls(int(shard), str(name), int(lines), str(sha1))


@dataclass(frozen=True)
class WrittenBlocks:
    """A state's partials already staged as blocks by whoever computed them (Spark
    executors): their refs, for the manifest."""

    refs: list[BlockRef]


@dataclass(frozen=True)
class BlockSpace:
    """Where one emit attempt's blocks go: the pipeline's keyspace (with its shard count),
    the generation, the txid and the attempt. Picklable: executors get it as it is."""

    keyspace: KeySpace
    generation: str
    txid: int
    attempt: int

    def slot(self, shard: int) -> KeySpace:
        """The keyspace of shard ``shard``'s slot (-1: the pipeline's own slot)."""
        return self.keyspace if shard < 0 else self.keyspace.shard(shard)

    def key(self, ref: BlockRef) -> str:
        """The block's Redis key: in its shard's slot (shard -1: the pipeline's own slot)."""
        return self.slot(ref.shard).staged_block(self.generation, self.txid, self.attempt, ref.name)

    def index(self, shard: int) -> str:
        """The index of the txid's blocks in shard ``shard``'s slot."""
        return self.slot(shard).staged_index(self.generation, self.txid)


def write_block(
    pipe: Any, space: BlockSpace, shard: int, name: str, lines: Sequence[str]
) -> BlockRef:
    """Queue one block's SET (with its TTL) on ``pipe`` (a pipeline or a client), its key
    added to its slot's index first (an index entry without its block is harmless; a block
    without one would be found by nobody); its ref."""
    text = "\n".join(lines).encode("utf-8", "surrogatepass")
    ref = BlockRef(shard, name, len(lines), hashlib.sha1(text).hexdigest())
    key, index = space.key(ref), space.index(shard)
    pipe.sadd(index, key)
    pipe.expire(index, BLOCK_TTL_S)
    pipe.set(key, text, ex=BLOCK_TTL_S)
    return ref


class BlockWriter:
    """Writes ``key TAB partial`` lines of one state as blocks, split by state shard: block
    names are ``{prefix}.{shard}.{seq}`` (``prefix`` unique per writer: ``state.d`` for the
    driver, ``state.PARTITION.ATTEMPT`` for a Spark task). Blocks go out in pipelines of
    ``flush_blocks``.
    Not thread-safe; ``close()`` flushes and returns every ref, in write order."""

    def __init__(self, client: Any, space: BlockSpace, prefix: str, flush_blocks: int = 8) -> None:
        self.client = client
        self.space = space
        self.prefix = prefix
        self.flush_blocks = flush_blocks
        shards = space.keyspace.shards
        self._buffers: list[list[str]] = [[] for _ in range(shards)]
        self._seq = [0] * shards
        self._pipe = client.pipeline(transaction=False)
        self._queued = 0
        self.refs: list[BlockRef] = []

    def add(self, key: str, partial_json: str) -> None:
        shard = self.space.keyspace.shard_index(key)
        buffer = self._buffers[shard]
        buffer.append(f"{key}\t{partial_json}")
        if len(buffer) >= BLOCK_LINES:
            self._block(shard)

    def _block(self, shard: int) -> None:
        name = f"{self.prefix}.{shard}.{self._seq[shard]}"
        self._seq[shard] += 1
        self.refs.append(write_block(self._pipe, self.space, shard, name, self._buffers[shard]))
        self._buffers[shard] = []
        self._queued += 1
        if self._queued >= self.flush_blocks:
            self._pipe.execute()
            self._queued = 0

    def close(self) -> list[BlockRef]:
        for shard, buffer in enumerate(self._buffers):
            if buffer:
                self._block(shard)
        if self._queued:
            self._pipe.execute()
            self._queued = 0
        return self.refs


def read_block(client: redis.Redis, space: BlockSpace, ref: BlockRef) -> list[str]:
    """A block's lines, checked against its ref (StagedBlockError if missing or different)."""
    key = space.key(ref)
    raw = client.get(key)
    if raw is None:
        raise StagedBlockError(
            f"staged block {key} is missing (expired, or deleted by a reset or another commit):"
            " this batch must not commit; emit it again"
        )
    text = raw if isinstance(raw, bytes) else raw.encode("utf-8", "surrogatepass")
    lines = text.decode("utf-8", "surrogatepass").split("\n") if text else []
    if len(lines) != ref.lines or hashlib.sha1(text).hexdigest() != ref.sha1:
        raise StagedBlockError(
            f"staged block {key} holds {len(lines)} lines (manifest: {ref.lines}) or another "
            "checksum: it was torn or overwritten; emit the batch again"
        )
    return lines


def verify_blocks(client: redis.Redis, space: BlockSpace, refs: Iterable[BlockRef]) -> int:
    """Check every block inside Redis (present, its line count and SHA-1), slot by slot, in
    VERIFY_BATCH blocks per call; nothing is read back. Returns the blocks checked;
    StagedBlockError naming the first that is not as its ref says."""
    by_shard: dict[int, list[BlockRef]] = {}
    for ref in refs:
        by_shard.setdefault(ref.shard, []).append(ref)
    checked = 0
    for group in by_shard.values():
        for i in range(0, len(group), VERIFY_BATCH):
            part = group[i : i + VERIFY_BATCH]
            args: list[Any] = []
            for ref in part:
                args += [ref.sha1, ref.lines]
            checked += int(VERIFY_BLOCKS(client, [space.key(r) for r in part], args))
    return checked


def slot_spaces(keyspace: KeySpace) -> list[KeySpace]:
    """Every slot a pipeline's blocks may lie in: its own, then each state shard's."""
    spaces = [keyspace]
    if keyspace.sharded:
        spaces += [keyspace.shard(i) for i in range(keyspace.shards)]
    return spaces


def _attempt_of(key: str, prefix: str) -> int | None:
    """The emit attempt in a block key under ``prefix`` (``...:block:GEN:TXID:``), or None."""
    if not key.startswith(prefix):
        return None
    head = key[len(prefix) :].partition(":")[0]
    return int(head) if head.isdigit() else None


def discard_blocks(
    client: redis.Redis,
    keyspace: KeySpace,
    generation: str,
    txid: int,
    attempts: Collection[int] | None = None,
    keep: Collection[str] = (),
) -> int:
    """Delete the blocks of ``txid`` its writers indexed - of the emit ``attempts`` only, or
    (None) of every attempt, the indexes too - but the keys in ``keep``. Idempotent and best
    effort (blocks expire anyway): one SSCAN walk per slot, deletes in pipelines of 1000.
    Returns the blocks deleted."""
    deleted = 0
    for space in slot_spaces(keyspace):
        index = space.staged_index(generation, txid)
        prefix = space.staged_block(generation, txid, 0, "").rsplit(":", 2)[0] + ":"
        doomed: list[str] = []
        for raw in client.sscan_iter(index, count=1000):
            key = raw.decode("utf-8", "surrogatepass") if isinstance(raw, bytes) else raw
            if key in keep:
                continue
            if attempts is None or _attempt_of(key, prefix) in attempts:
                doomed.append(key)
        for i in range(0, len(doomed), 1000):  # one slot: multi-key commands are allowed
            part = doomed[i : i + 1000]
            deleted += int(client.delete(*part))
            if attempts is not None:
                client.srem(index, *part)
        if attempts is None:
            client.delete(index)
    return deleted


def delete_blocks(client: redis.Redis, space: BlockSpace, refs: Iterable[BlockRef]) -> None:
    """Delete blocks (best effort, one key a command: blocks of many slots)."""
    pipe = client.pipeline(transaction=False)
    queued = 0
    for ref in refs:
        pipe.delete(space.key(ref))
        queued += 1
        if queued >= 1000:
            pipe.execute()
            queued = 0
    if queued:
        pipe.execute()


def apply_numeric_block(
    client: redis.Redis,
    space: BlockSpace,
    ref: BlockRef,
    state_name: str,
    kind: StateKind,
    op: str,
    fence: Fence,
) -> tuple[int, list[str]]:
    """APPLY_NUMERIC over one staged block, inside Redis (the partials never leave it):
    atomic, fenced like every state write, and checked against ``ref`` first (TFBLOCK ->
    StagedBlockError, nothing written). Returns (keys written, keys left for the Python
    path), as ``tridentflow_state.numeric.apply_numeric``."""
    keys = [*script_keys(space.keyspace.shard(ref.shard), state_name, op, fence), space.key(ref)]
    args = [fence.txid, fence.token, fence.generation, kind.value, op, ref.sha1]
    args += [undo_flag(fence), ref.lines]
    return applied_and_left(APPLY_STAGED_NUMERIC(client, keys, args))


def iter_lines(client: redis.Redis, space: BlockSpace, refs: Iterable[BlockRef]) -> Iterator[str]:
    """Every line of ``refs``, block after block (each checked), no newline."""
    for ref in refs:
        yield from read_block(client, space, ref)
