"""Durable staging of a batch's emitted output, keyed by txid and emit attempt: Redis
(``RedisStagingArea``, the default: nothing shared between the hosts that emit and commit but
Redis itself) or files under the home (``StagingArea``, TRIDENTFLOW_STAGING=files: emit and
commit must share the home).

    {root}/tx-000000000007/attempt-2/state-counts.tsv   encoded key TAB partial (JSON), per line
    {root}/tx-000000000007/attempt-2/bad.jsonl          records to quarantine, one per line
    {root}/tx-000000000007/attempt-2/MANIFEST.json      written last, atomically

A state line is the encoded key (JSON text, which never holds a raw tab or newline), a tab,
and the staged value as JSON: the commit can hand whole blocks of it to Redis as they are
(state.numeric) and Python decodes only the value. Manifests without ``"format": "tsv"`` (from
before) name ``[key, partial]`` JSON lines, still read.

An attempt counts as staged only once its manifest exists. The manifest records the source
ranges read, the record counts per partition, and for each state file its line count and
SHA-256 (and the same for the bad records), so that ``load`` refuses a torn or tampered
batch (IncompleteBatchError) instead of committing part of it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO

from tridentflow.engines.base import PartitionCount, staged_json
from tridentflow.engines.batchops import StageReport
from tridentflow.errors import IncompleteBatchError
from tridentflow.fileio import fsync_dir, write_atomic
from tridentflow.plan import BadRecord
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

MANIFEST = "MANIFEST.json"
BAD_FILE = "bad.jsonl"


CODE_SHAPE = "code_shape"
"""The manifest's field naming the code shape that staged the batch (each state's kind,
aggregator, key and input fields: ``recorded_settings.code_shape``)."""


def _write_state(path: Path, pairs: Iterable[tuple[str, Any]], what: str) -> dict[str, Any]:
    """Write ``key TAB value`` lines, fsync; return {file, lines, sha256, format}."""
    info = _write_lines(path, (f"{key}\t{staged_json(v, what)}" for key, v in pairs))
    info["format"] = "tsv"
    return info


def _write_jsonl(path: Path, values: Iterable[Any], what: str = "value") -> dict[str, Any]:
    """Write one JSON value per line, fsync; return {file, lines, sha256}."""
    return _write_lines(path, (staged_json(v, what) for v in values))


def _write_lines(path: Path, texts: Iterable[str]) -> dict[str, Any]:
    digest, lines = hashlib.sha256(), 0
    with open(path, "wb") as fh:
        for text in texts:
            line = text.encode() + b"\n"
            fh.write(line)
            digest.update(line)
            lines += 1
        fh.flush()
        os.fsync(fh.fileno())
    return {"file": path.name, "lines": lines, "sha256": digest.hexdigest()}


def _verify_jsonl(directory: Path, info: dict[str, Any], what: str) -> None:
    digest, lines = hashlib.sha256(), 0
    try:
        with open(directory / info["file"], "rb") as fh:
            for line in fh:
                digest.update(line)
                lines += 1
    except FileNotFoundError:
        raise IncompleteBatchError(f"{directory}: staged file for {what} is missing") from None
    if lines != info["lines"] or digest.hexdigest() != info["sha256"]:
        raise IncompleteBatchError(
            f"{directory}: staged file for {what} has {lines} lines (manifest: "
            f"{info['lines']}) or a different checksum"
        )


@dataclass(frozen=True)
class StagedBatch:
    directory: Path
    manifest: dict[str, Any]

    @property
    def txid(self) -> int:
        return int(self.manifest["txid"])

    @property
    def attempt(self) -> int:
        return int(self.manifest["attempt"])

    @property
    def ranges(self) -> dict[int, tuple[int, int]]:
        return {int(p): (int(r[0]), int(r[1])) for p, r in self.manifest["ranges"].items()}

    @property
    def counts(self) -> dict[int, PartitionCount]:
        return {int(p): PartitionCount(*c) for p, c in self.manifest["counts"].items()}

    @property
    def records(self) -> int:
        return sum(c.n for c in self.counts.values())

    @property
    def bad_count(self) -> int:
        return int(self.manifest.get("bad", {}).get("lines", 0))

    def bad_records(self) -> Iterator[dict[str, Any]]:
        info = self.manifest.get("bad")
        if not info:
            return
        with self._open(self.directory / info["file"]) as fh:
            for line in fh:
                yield json.loads(line)

    def blocks(self, state: str) -> list[BlockRef] | None:
        """The state's staged blocks in Redis, or None (staged as a file)."""
        return None

    def blocks_lie_in(self, keyspace: KeySpace) -> bool:
        """Whether the staged blocks lie next to ``keyspace``'s state shards, so that the
        commit can apply them where they lie (not after ``tridentflow reshard`` moved the
        state to another layout: their lines are then read back and routed anew)."""
        return False

    def apply_numeric_block(
        self, ref: BlockRef, state: str, kind: StateKind, op: str, fence: Fence
    ) -> tuple[int, list[str]]:
        """APPLY_NUMERIC over one of ``blocks()`` where it lies (keys written, keys left for
        Python); IncompleteBatchError if the block is gone or not what the manifest says."""
        raise TypeError(f"txid {self.txid} attempt {self.attempt} was staged in files: no blocks")

    def block_lines(self, ref: BlockRef) -> list[str]:
        """The ``key TAB partial`` lines of one of ``blocks()``."""
        raise TypeError(f"txid {self.txid} attempt {self.attempt} was staged in files: no blocks")

    @property
    def staged_in(self) -> str:
        """Where it was staged, for people: ``files``, ``redis (driver)``, ``redis (executors)``."""
        return "files"

    def key_count(self, state: str) -> int:
        return int(self.manifest["states"][state]["lines"])

    def _state_file(self, state: str) -> tuple[Path, bool]:
        info = self.manifest["states"].get(state)
        if info is None:
            raise IncompleteBatchError(
                f"txid {self.txid} attempt {self.attempt}: no staged output for state {state!r}"
            )
        return self.directory / info["file"], info.get("format") == "tsv"

    def items(self, state: str) -> Iterator[tuple[str, Any]]:
        """(encoded key, partial) pairs of one state, in file order."""
        path, tsv = self._state_file(state)
        with self._open(path) as fh:
            for line in fh:
                if tsv:
                    key, _tab, partial = line.partition("\t")
                    yield key, json.loads(partial)
                else:
                    key, partial = json.loads(line)
                    yield key, partial

    def _open(self, path: Path) -> TextIO:
        """A staged file, to read; IncompleteBatchError (one line) if it is gone - the txid
        committed meanwhile and its staging was deleted, or someone deleted it - so the step
        fails as any step does and its retry finds what happened."""
        try:
            return open(path, encoding="utf-8")
        except FileNotFoundError:
            raise IncompleteBatchError(
                f"txid {self.txid} attempt {self.attempt}: staged file {path.name} is gone "
                "(the txid committed meanwhile, or its staging was deleted): retry the commit; "
                "if the txid is not committed, emit it again"
            ) from None

    def lines(self, state: str) -> Iterator[str]:
        """The state's ``key TAB partial`` lines as they are in the file (newline included):
        the commit passes blocks of them to Redis without decoding (tridentflow_state.numeric)."""
        path, tsv = self._state_file(state)
        with self._open(path) as fh:
            if tsv:
                yield from fh
                return
            for line in fh:  # staged before the tsv format: convert
                key, partial = json.loads(line)
                yield f"{key}\t{json.dumps(partial, ensure_ascii=False)}\n"

    def keys(self, state: str) -> Iterator[str]:
        """The encoded keys of one state, in file order (the values are not decoded)."""
        for line in self.lines(state):
            yield line.partition("\t")[0]

    def check_complete(self) -> None:
        """Trident's completeness check: the records read match the ranges, exactly, and
        every exchange received what its senders announced."""
        failed = [
            r for r in map(StageReport.from_json, self.manifest.get("stages", [])) if not r.ok
        ]
        if failed:
            raise IncompleteBatchError(
                f"txid {self.txid} attempt {self.attempt}: "
                + "; ".join(r.describe() for r in failed)
                + ": it must not commit; emit it again"
            )
        counts = self.counts
        for partition, (start, end) in self.ranges.items():
            count = counts.get(partition)
            expected = end - start
            if (
                count is None
                or count.n != expected
                or (expected and (count.first, count.last) != (start, end - 1))
            ):
                raise IncompleteBatchError(
                    f"txid {self.txid} attempt {self.attempt}: partition {partition} range "
                    f"[{start}, {end}) should hold {expected} records, the emitter read "
                    f"{count.to_json() if count else 'none'} ([n, first, last])"
                )


class StagingArea:
    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def tx_dir(self, txid: int) -> Path:
        return self.root / f"tx-{txid:012d}"

    def space(self, txid: int, attempt: int) -> BlockSpace | None:
        """Where executors may write blocks of an attempt: nowhere (files are written by the
        driver)."""
        return None

    def attempt_dir(self, txid: int, attempt: int) -> Path:
        return self.tx_dir(txid) / f"attempt-{attempt}"

    def write(
        self,
        header: dict[str, Any],
        counts: dict[int, PartitionCount],
        partials: dict[str, Iterable[tuple[str, Any]]],
        bad: Iterable[BadRecord] = (),
        before_manifest: Callable[[], None] | None = None,
    ) -> StagedBatch:
        """Write one attempt's output; the manifest goes last. Returns the staged batch."""
        txid, attempt = int(header["txid"]), int(header["attempt"])
        directory = self.attempt_dir(txid, attempt)
        if directory.exists():
            shutil.rmtree(directory)
        directory.mkdir(parents=True)
        states = {
            name: _write_state(directory / f"state-{name}.tsv", pairs, f"state {name}")
            for name, pairs in partials.items()
        }
        bad_info = _write_jsonl(directory / BAD_FILE, (b.to_json() for b in bad))
        fsync_dir(directory)
        if before_manifest is not None:
            before_manifest()
        manifest = dict(header)
        manifest["counts"] = {str(p): c.to_json() for p, c in sorted(counts.items())}
        manifest["states"] = states
        manifest["bad"] = bad_info
        write_atomic(directory / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True))
        return StagedBatch(directory, manifest)

    def load(self, txid: int, attempt: int) -> StagedBatch:
        """Load and verify a staged attempt; IncompleteBatchError if torn or missing."""
        directory = self.attempt_dir(txid, attempt)
        manifest = self.manifest(txid, attempt)
        for name, info in manifest["states"].items():
            _verify_jsonl(directory, info, f"state {name}")
        if "bad" in manifest:
            _verify_jsonl(directory, manifest["bad"], "bad records")
        batch = StagedBatch(directory, manifest)
        batch.check_complete()
        return batch

    def manifest(self, txid: int, attempt: int) -> dict[str, Any]:
        """An attempt's manifest only (written last, atomically: present means complete);
        IncompleteBatchError if missing - e.g. discarded after its txid committed."""
        directory = self.attempt_dir(txid, attempt)
        try:
            manifest = json.loads((directory / MANIFEST).read_text())
        except FileNotFoundError:
            raise IncompleteBatchError(
                f"txid {txid} attempt {attempt}: no staged manifest in {directory} - if its "
                "emit ran on another host, share TRIDENTFLOW_HOME between emit and commit or "
                f"set {STAGING_ENV}=redis for both, then emit again"
            ) from None
        except ValueError as exc:
            raise IncompleteBatchError(f"txid {txid}: manifest is not JSON: {exc}") from exc
        if (int(manifest.get("txid", -1)), int(manifest.get("attempt", -1))) != (txid, attempt):
            raise IncompleteBatchError(f"{directory}: manifest is for another txid/attempt")
        return manifest

    def discard(self, txid: int) -> None:
        """Delete every staged attempt of ``txid`` (idempotent)."""
        shutil.rmtree(self.tx_dir(txid), ignore_errors=True)

    def discard_before(self, txid: int) -> None:
        """Delete every staged attempt of every txid below ``txid`` (committed ones: what
        commits cut short after their marks left, however many in a row). One directory
        listing; idempotent."""
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(self.root):
                number = entry.name.removeprefix("tx-")
                if entry.name.startswith("tx-") and number.isdigit() and int(number) < txid:
                    shutil.rmtree(entry.path, ignore_errors=True)

    def discard_attempts(self, txid: int, attempts: Iterable[int]) -> None:
        """Delete the named attempts of ``txid`` - abandoned ones: refused, died part-way,
        superseded - and the txid's directory once it is empty (idempotent)."""
        for attempt in attempts:
            shutil.rmtree(self.attempt_dir(txid, attempt), ignore_errors=True)
        with contextlib.suppress(OSError):  # not empty (another attempt), or gone
            self.tx_dir(txid).rmdir()

    def prune(self, batch: StagedBatch) -> None:
        """Nothing to do: an attempt's directory holds only what its manifest names."""


STAGING_ENV = "TRIDENTFLOW_STAGING"
"""Where emits stage their output: ``redis`` (the default: next to each state shard, any two
hosts that reach Redis) or ``files`` (under the home, which emit and commit must share)."""
STAGING_KINDS = ("files", "redis")
DEFAULT_STAGING = "redis"


@dataclass(frozen=True)
class RedisStagedBatch(StagedBatch):
    """A batch staged in Redis: the same manifest, its states and bad records as blocks."""

    client: Any = None
    space: BlockSpace | None = None

    def blocks(self, state: str) -> list[BlockRef] | None:
        info = self.manifest["states"].get(state)
        if info is None:
            raise IncompleteBatchError(
                f"txid {self.txid} attempt {self.attempt}: no staged output for state {state!r}"
            )
        return [BlockRef.from_json(b) for b in info["blocks"]]

    def blocks_lie_in(self, keyspace: KeySpace) -> bool:
        assert self.space is not None
        here = self.space.keyspace
        return (here.shards, here.layout) == (keyspace.shards, keyspace.layout)

    @property
    def staged_in(self) -> str:
        writers = {info.get("writer") for info in self.manifest["states"].values()}
        return "redis (executors)" if "executors" in writers else "redis (driver)"

    def apply_numeric_block(
        self, ref: BlockRef, state: str, kind: StateKind, op: str, fence: Fence
    ) -> tuple[int, list[str]]:
        assert self.space is not None
        try:
            return apply_numeric_block(self.client, self.space, ref, state, kind, op, fence)
        except StagedBlockError as exc:
            raise IncompleteBatchError(f"txid {self.txid} attempt {self.attempt}: {exc}") from None

    def block_lines(self, ref: BlockRef) -> list[str]:
        assert self.space is not None
        return read_block(self.client, self.space, ref)

    def _lines(self, refs: list[BlockRef]) -> Iterator[str]:
        assert self.space is not None
        try:
            yield from iter_lines(self.client, self.space, refs)
        except StagedBlockError as exc:
            raise IncompleteBatchError(f"txid {self.txid} attempt {self.attempt}: {exc}") from None

    def lines(self, state: str) -> Iterator[str]:
        for line in self._lines(self.blocks(state) or []):
            yield line + "\n"

    def items(self, state: str) -> Iterator[tuple[str, Any]]:
        for line in self._lines(self.blocks(state) or []):
            key, _tab, partial = line.partition("\t")
            yield key, json.loads(partial)

    def keys(self, state: str) -> Iterator[str]:
        for line in self._lines(self.blocks(state) or []):
            yield line[: line.index("\t")]

    def bad_records(self) -> Iterator[dict[str, Any]]:
        info = self.manifest.get("bad") or {}
        for line in self._lines([BlockRef.from_json(b) for b in info.get("blocks", [])]):
            yield json.loads(line)


def manifest_blocks(manifest: dict[str, Any]) -> list[BlockRef]:
    """Every block a manifest staged in Redis lists: its states', then its bad records'."""
    states = manifest.get("states", {}).values()
    refs = [BlockRef.from_json(b) for info in states for b in info.get("blocks", [])]
    return refs + [BlockRef.from_json(b) for b in manifest.get("bad", {}).get("blocks", [])]


class RedisStagingArea:
    """Staging in Redis (``tridentflow_state.staged``): every state's partials as blocks next
    to the shard they belong to, bad records as blocks in the pipeline's slot, and each
    attempt's manifest - written last - as a field of the txid's manifest hash in the
    ledger's slot. ``load`` checks every block inside Redis before the commit writes."""

    def __init__(self, client: Any, keyspace: KeySpace, generation: str) -> None:
        self.client = client
        self.keyspace = keyspace
        self.generation = generation

    def space(self, txid: int, attempt: int) -> BlockSpace:
        return BlockSpace(self.keyspace, self.generation, int(txid), int(attempt))

    def manifests_key(self, txid: int) -> str:
        return self.keyspace.staged_manifests(self.generation, txid)

    def write(
        self,
        header: dict[str, Any],
        counts: dict[int, PartitionCount],
        partials: dict[str, Iterable[tuple[str, Any]] | WrittenBlocks],
        bad: Iterable[BadRecord] = (),
        before_manifest: Callable[[], None] | None = None,
    ) -> StagedBatch:
        """Stage one attempt: what the engine did not write already, in blocks; the manifest
        last. Idempotent for the same attempt (its blocks are written again whole)."""
        txid, attempt = int(header["txid"]), int(header["attempt"])
        space = self.space(txid, attempt)
        states: dict[str, Any] = {}
        for name, pairs in partials.items():
            if isinstance(pairs, WrittenBlocks):
                refs = pairs.refs
            else:
                writer = BlockWriter(self.client, space, f"{name}.d")
                what = f"state {name}"
                for key, value in pairs:
                    writer.add(key, staged_json(value, what))
                refs = writer.close()
            states[name] = {
                "writer": "executors" if isinstance(pairs, WrittenBlocks) else "driver",
                "format": "blocks",
                "lines": sum(r.lines for r in refs),
                "blocks": [r.to_json() for r in refs],
            }
        bad_refs, pipe, chunk, seq = [], self.client.pipeline(transaction=False), [], 0
        for record in bad:
            chunk.append(staged_json(record.to_json(), "bad record"))
            if len(chunk) == BLOCK_LINES:
                bad_refs.append(write_block(pipe, space, -1, f"bad.{seq}", chunk))
                chunk, seq = [], seq + 1
        if chunk:
            bad_refs.append(write_block(pipe, space, -1, f"bad.{seq}", chunk))
        pipe.execute()
        if before_manifest is not None:
            before_manifest()
        manifest = dict(header)
        manifest["counts"] = {str(p): c.to_json() for p, c in sorted(counts.items())}
        manifest["layout"] = [self.keyspace.shards, self.keyspace.layout]  # where blocks lie
        manifest["states"] = states
        manifest["bad"] = {
            "lines": sum(r.lines for r in bad_refs),
            "blocks": [r.to_json() for r in bad_refs],
        }
        key = self.manifests_key(txid)  # with its TTL even if it lands late; an old
        # generation's (a rewind's) goes by itself
        STORE_MANIFEST(self.client, [key], [attempt, json.dumps(manifest), BLOCK_TTL_S])
        return RedisStagedBatch(self.describe(txid, attempt), manifest, self.client, space)

    def describe(self, txid: int, attempt: int) -> Path:
        """What error messages name as the attempt's place (not a directory)."""
        return Path(f"redis:{self.manifests_key(txid)}#{attempt}")

    def load(self, txid: int, attempt: int) -> StagedBatch:
        """Load and verify a staged attempt (every block checked inside Redis: present, its
        line count and SHA-1); IncompleteBatchError if torn, expired or missing."""
        manifest = self.manifest(txid, attempt)
        space = self._space_of(txid, attempt, manifest)
        try:
            verify_blocks(self.client, space, manifest_blocks(manifest))
        except StagedBlockError as exc:
            raise IncompleteBatchError(f"txid {txid} attempt {attempt}: {exc}") from None
        batch = RedisStagedBatch(self.describe(txid, attempt), manifest, self.client, space)
        batch.check_complete()
        return batch

    def manifest(self, txid: int, attempt: int) -> dict[str, Any]:
        """An attempt's manifest only; IncompleteBatchError if missing (e.g. discarded after
        its txid committed)."""
        raw = self.client.hget(self.manifests_key(txid), str(attempt))
        if raw is None:
            raise IncompleteBatchError(
                f"txid {txid} attempt {attempt}: no staged manifest in Redis "
                f"({self.manifests_key(txid)})"
            )
        try:
            manifest = json.loads(raw)
        except ValueError as exc:
            raise IncompleteBatchError(f"txid {txid}: manifest is not JSON: {exc}") from exc
        if (int(manifest.get("txid", -1)), int(manifest.get("attempt", -1))) != (txid, attempt):
            raise IncompleteBatchError(
                f"{self.describe(txid, attempt)}: manifest is for another txid/attempt"
            )
        return manifest

    def _space_of(self, txid: int, attempt: int, manifest: dict[str, Any]) -> BlockSpace:
        """Where an attempt's blocks lie: in the layout its manifest names (one staged
        before ``tridentflow reshard`` moved the state: the old one), else this keyspace's."""
        return BlockSpace(self._layout_of(manifest), self.generation, int(txid), int(attempt))

    def _layout_of(self, manifest: dict[str, Any]) -> KeySpace:
        if "layout" not in manifest:
            return self.keyspace
        shards, layout = (int(n) for n in manifest["layout"])
        if (shards, layout) == (self.keyspace.shards, self.keyspace.layout):
            return self.keyspace
        return replace(self.keyspace, shards=shards, layout=layout)

    def _manifests(self, txid: int) -> dict[int, dict[str, Any]]:
        """Every readable manifest of ``txid``, by attempt (one HGETALL)."""
        out = {}
        for attempt, raw in (self.client.hgetall(self.manifests_key(txid)) or {}).items():
            with contextlib.suppress(ValueError, TypeError):
                out[int(attempt)] = json.loads(raw)
        return out

    def _layouts(self, manifests: dict[int, dict[str, Any]]) -> list[KeySpace]:
        """This keyspace and every other layout one of ``manifests`` was staged in."""
        spaces = {(self.keyspace.shards, self.keyspace.layout): self.keyspace}
        for manifest in manifests.values():
            space = self._layout_of(manifest)
            spaces.setdefault((space.shards, space.layout), space)
        return list(spaces.values())

    def discard(self, txid: int) -> None:
        """Delete every staged attempt of ``txid``: every block its writers indexed (those no
        manifest names too), in every layout its manifests name, and the manifests.
        Idempotent, best effort (blocks expire anyway)."""
        manifests = self._manifests(txid)
        self._delete_listed(txid, manifests)
        for space in self._layouts(manifests):
            discard_blocks(self.client, space, self.generation, txid)
        self.client.delete(self.manifests_key(txid))

    def discard_attempts(self, txid: int, attempts: Iterable[int]) -> None:
        """Delete the named attempts of ``txid`` - abandoned ones: refused, died part-way,
        superseded - blocks and manifests (idempotent, best effort)."""
        wanted = {int(a) for a in attempts}
        if not wanted:
            return
        manifests = {a: m for a, m in self._manifests(txid).items() if a in wanted}
        self._delete_listed(txid, manifests)
        for space in self._layouts(manifests):
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
        """Delete the blocks of ``batch``'s attempt that its manifest does not name: those of
        Spark task attempts that were killed or lost the race to another (best effort)."""
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
