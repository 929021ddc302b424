"""Staging in Redis (``tridentflow_state.staged``), the default: nothing shared between the
hosts that emit and commit but Redis itself. Every state's partials are blocks next to the
shard they belong to (written by the driver, or by Spark's executors themselves), bad records
are blocks in the pipeline's slot, and each attempt's manifest - written last, with a TTL - is
a field of the txid's manifest hash in the ledger's slot. ``load`` checks every block inside
Redis (present, its line count and SHA-1) before the commit writes."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Iterator
from typing import Any

from tridentflow.engines.base import staged_json
from tridentflow.errors import IncompleteBatchError
from tridentflow.plan import BadRecord
from tridentflow.steps.staging.base import (
    Partials,
    StagedBatch,
    StagingArea,
    check_manifest_names,
    parse_manifest,
)
from tridentflow.steps.staging.layouts import (
    layout_field,
    same_layout,
    staged_layouts,
    staged_space,
)
from tridentflow_state.backing import Fence
from tridentflow_state.errors import StagedBlockError
from tridentflow_state.keys import KeySpace
from tridentflow_state.maps import StateKind
from tridentflow_state.staged import (
    BLOCK_LINES,
    BLOCK_TTL_S,
    STORE_MANIFEST,
    BlockRef,
    BlockSpace,
    BlockWriter,
    WrittenBlocks,
    apply_numeric_block,
    delete_blocks,
    discard_blocks,
    iter_lines,
    read_block,
    verify_blocks,
    write_block,
)


def manifest_blocks(manifest: dict[str, Any]) -> list[BlockRef]:
    """Every block a manifest staged in Redis lists: its states', then its bad records'."""
    states = manifest.get("states", {}).values()
    refs = [BlockRef.from_json(b) for info in states for b in info.get("blocks", [])]
    return refs + [BlockRef.from_json(b) for b in manifest.get("bad", {}).get("blocks", [])]


class RedisStagedBatch(StagedBatch):
    """A batch staged in Redis: its states and bad records as blocks in ``space``. Also
    ``InBlocks``: the commit may apply the blocks where they lie."""

    def __init__(
        self, place: str, manifest: dict[str, Any], client: Any, space: BlockSpace
    ) -> None:
        self._place = place
        self.manifest = manifest
        self.client = client
        self.space = space

    @property
    def place(self) -> str:
        return self._place

    @property
    def staged_in(self) -> str:
        writers = {info.get("writer") for info in self.manifest["states"].values()}
        return "redis (executors)" if "executors" in writers else "redis (driver)"

    def blocks(self, state: str) -> list[BlockRef]:
        return [BlockRef.from_json(b) for b in self.state_info(state)["blocks"]]

    def blocks_lie_in(self, keyspace: KeySpace) -> bool:
        return same_layout(self.space.keyspace, keyspace)

    def apply_numeric_block(
        self, ref: BlockRef, state: str, kind: StateKind, op: str, fence: Fence
    ) -> tuple[int, list[str]]:
        try:
            return apply_numeric_block(self.client, self.space, ref, state, kind, op, fence)
        except StagedBlockError as exc:
            raise IncompleteBatchError(f"txid {self.txid} attempt {self.attempt}: {exc}") from None

    def block_lines(self, ref: BlockRef) -> list[str]:
        return read_block(self.client, self.space, ref)

    def _lines(self, refs: list[BlockRef]) -> Iterator[str]:
        try:
            yield from iter_lines(self.client, self.space, refs)
        except StagedBlockError as exc:
            raise IncompleteBatchError(f"txid {self.txid} attempt {self.attempt}: {exc}") from None

    def lines(self, state: str) -> Iterator[str]:
        for line in self._lines(self.blocks(state)):
            yield line + "\n"

    def keys(self, state: str) -> Iterator[str]:
        for line in self._lines(self.blocks(state)):
            yield line[: line.index("\t")]

    def bad_records(self) -> Iterator[dict[str, Any]]:
        info = self.manifest.get("bad") or {}
        for line in self._lines([BlockRef.from_json(b) for b in info.get("blocks", [])]):
            yield json.loads(line)


class RedisStagingArea(StagingArea):
    """A ``StagingArea`` in one generation of one pipeline's Redis keyspace."""

    def __init__(self, client: Any, keyspace: KeySpace, generation: str) -> None:
        self.client = client
        self.keyspace = keyspace
        self.generation = generation

    def space(self, txid: int, attempt: int) -> BlockSpace:
        """Where executors write an attempt's blocks (the current layout)."""
        return BlockSpace(self.keyspace, self.generation, int(txid), int(attempt))

    def manifests_key(self, txid: int) -> str:
        return self.keyspace.staged_manifests(self.generation, txid)

    def place(self, txid: int, attempt: int) -> str:
        """What error messages name as the attempt's place."""
        return f"redis:{self.manifests_key(txid)}#{attempt}"

    def _stage(
        self, txid: int, attempt: int, partials: Partials, bad: Iterable[BadRecord]
    ) -> dict[str, Any]:
        """What the engine did not write already, in blocks; the layout they lie in."""
        space = self.space(txid, attempt)
        states = {name: self._stage_state(space, name, pairs) for name, pairs in partials.items()}
        bad_refs = self._stage_bad(space, bad)
        return {
            "layout": layout_field(self.keyspace),
            "states": states,
            "bad": {
                "lines": sum(r.lines for r in bad_refs),
                "blocks": [r.to_json() for r in bad_refs],
            },
        }

    def _store_manifest(
        self, txid: int, attempt: int, manifest: dict[str, Any]
    ) -> RedisStagedBatch:
        """A field of the txid's manifest hash, with its TTL even if it lands late (an old
        generation's - a rewind's - goes by itself)."""
        key = self.manifests_key(txid)
        STORE_MANIFEST(self.client, [key], [attempt, json.dumps(manifest), BLOCK_TTL_S])
        return RedisStagedBatch(
            self.place(txid, attempt), manifest, self.client, self.space(txid, attempt)
        )

    def _stage_state(
        self, space: BlockSpace, name: str, pairs: Iterable[tuple[str, Any]] | WrittenBlocks
    ) -> dict[str, Any]:
        """One state's manifest entry, its blocks written unless the executors did."""
        by_executors = isinstance(pairs, WrittenBlocks)
        if isinstance(pairs, WrittenBlocks):
            refs = pairs.refs
        else:
            writer = BlockWriter(self.client, space, f"{name}.d")
            for key, value in pairs:
                writer.add(key, staged_json(value, f"state {name}"))
            refs = writer.close()
        return {
            "writer": "executors" if by_executors else "driver",
            "format": "blocks",
            "lines": sum(r.lines for r in refs),
            "blocks": [r.to_json() for r in refs],
        }

    def _stage_bad(self, space: BlockSpace, bad: Iterable[BadRecord]) -> list[BlockRef]:
        """The bad records in blocks of the pipeline's slot (shard -1), one pipeline."""
        refs, pipe, chunk = [], self.client.pipeline(transaction=False), []
        for record in bad:
            chunk.append(staged_json(record.to_json(), "bad record"))
            if len(chunk) == BLOCK_LINES:
                refs.append(write_block(pipe, space, -1, f"bad.{len(refs)}", chunk))
                chunk = []
        if chunk:
            refs.append(write_block(pipe, space, -1, f"bad.{len(refs)}", chunk))
        pipe.execute()
        return refs

    def load(self, txid: int, attempt: int) -> RedisStagedBatch:
        """Load and verify a staged attempt (every block checked inside Redis: present, its
        line count and SHA-1); IncompleteBatchError if torn, expired or missing."""
        manifest = self.manifest(txid, attempt)
        space = self._space_of(txid, attempt, manifest)
        try:
            verify_blocks(self.client, space, manifest_blocks(manifest))
        except StagedBlockError as exc:
            raise IncompleteBatchError(f"txid {txid} attempt {attempt}: {exc}") from None
        batch = RedisStagedBatch(self.place(txid, attempt), manifest, self.client, space)
        batch.check_complete()
        return batch

    def manifest(self, txid: int, attempt: int) -> dict[str, Any]:
        raw = self.client.hget(self.manifests_key(txid), str(attempt))
        if raw is None:
            raise IncompleteBatchError(
                f"txid {txid} attempt {attempt}: no staged manifest in Redis "
                f"({self.manifests_key(txid)})"
            )
        manifest = parse_manifest(raw, txid)
        check_manifest_names(manifest, txid, attempt, self.place(txid, attempt))
        return manifest

    def holds(self, txid: int, attempt: int) -> bool:
        return bool(self.client.hexists(self.manifests_key(txid), str(attempt)))

    def _space_of(self, txid: int, attempt: int, manifest: dict[str, Any]) -> BlockSpace:
        return staged_space(self.keyspace, self.generation, txid, attempt, manifest)

    def _manifests(self, txid: int) -> dict[int, dict[str, Any]]:
        """Every readable manifest of ``txid``, by attempt (one HGETALL)."""
        out = {}
        for attempt, raw in (self.client.hgetall(self.manifests_key(txid)) or {}).items():
            with contextlib.suppress(ValueError, TypeError):
                out[int(attempt)] = json.loads(raw)
        return out

    def discard(self, txid: int) -> None:
        """Every block its writers indexed (those no manifest names too), in every layout its
        manifests name, and the manifests. Best effort (blocks expire anyway)."""
        manifests = self._manifests(txid)
        self._delete_listed(txid, manifests)
        for space in staged_layouts(self.keyspace, manifests.values()):
            discard_blocks(self.client, space, self.generation, txid)
        self.client.delete(self.manifests_key(txid))

    def discard_before(self, txid: int) -> None:
        """txid-1's staging only: older staging, left by commits cut short twice in a row and
        never retried, goes with its TTL (finding it would need a SCAN)."""
        self.discard(txid - 1)

    def discard_attempts(self, txid: int, attempts: Iterable[int]) -> None:
        """The named attempts' blocks and manifests (best effort)."""
        wanted = {int(a) for a in attempts}
        if not wanted:
            return
        manifests = {a: m for a, m in self._manifests(txid).items() if a in wanted}
        self._delete_listed(txid, manifests)
        for space in staged_layouts(self.keyspace, manifests.values()):
            discard_blocks(self.client, space, self.generation, txid, wanted)
        self.client.hdel(self.manifests_key(txid), *map(str, sorted(wanted)))

    def discard_unlisted(self, layout: KeySpace, txid: int) -> int:
        """Delete the blocks of ``txid`` staged in ``layout`` that no manifest lists - what
        emits that died part-way left there - and that layout's indexes of them: once
        ``tridentflow reshard`` left ``layout``, nothing else finds them (the blocks a
        manifest lists go with the commit). Idempotent; returns the blocks deleted."""
        listed = {
            self._space_of(txid, attempt, manifest).key(ref)
            for attempt, manifest in self._manifests(txid).items()
            for ref in manifest_blocks(manifest)
        }
        return discard_blocks(self.client, layout, self.generation, txid, None, listed)

    def prune(self, batch: StagedBatch) -> None:
        """The blocks of Spark task attempts that were killed or lost the race to another."""
        space = self._space_of(batch.txid, batch.attempt, batch.manifest)
        listed = {space.key(r) for r in manifest_blocks(batch.manifest)}
        discard_blocks(
            self.client, space.keyspace, self.generation, batch.txid, {batch.attempt}, listed
        )

    def _delete_listed(self, txid: int, manifests: dict[int, dict[str, Any]]) -> None:
        """The blocks ``manifests`` (of ``txid``'s attempts) list - staged before blocks
        were indexed, they are found only there."""
        for attempt, manifest in manifests.items():
            space = self._space_of(txid, attempt, manifest)
            delete_blocks(self.client, space, manifest_blocks(manifest))
