"""What staging is, whatever it stages in: a ``StagingArea`` writes and loads one emit
attempt's output - a ``StagedBatch`` - under (txid, attempt), its manifest last.

A manifest (JSON) names the txid and attempt, the source ranges read, the record counts per
partition, each state's staged partials and the bad records, with what lets ``load`` refuse a
torn or tampered batch (IncompleteBatchError) instead of committing part of it. An attempt
counts as staged only once its manifest exists. Every staged state is a sequence of
``encoded key TAB partial (JSON)`` lines: the commit can hand whole blocks of them to Redis as
they are (state.numeric) and Python decodes only the value.

A batch staged in Redis also offers its lines as blocks that lie next to the state's shards
(``InBlocks``): the commit applies them where they lie.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol, runtime_checkable

from tridentflow.engines.base import PartitionCount
from tridentflow.engines.batchops import StageReport
from tridentflow.errors import IncompleteBatchError
from tridentflow.plan import BadRecord
from tridentflow_state.backing import Fence
from tridentflow_state.keys import KeySpace
from tridentflow_state.maps import StateKind
from tridentflow_state.staged import BlockRef, BlockSpace, WrittenBlocks

CODE_SHAPE = "code_shape"
"""The manifest's field naming the code shape that staged the batch (each state's kind,
aggregator, key and input fields: ``recorded_settings.code_shape``)."""

Partials = Mapping[str, Iterable[tuple[str, Any]] | WrittenBlocks]
"""Each state's staged output: (encoded key, partial) pairs, or the blocks executors wrote
already (only where the area gave them a ``space``)."""


class StagedBatch(ABC):
    """One staged, complete emit attempt: its manifest, and its states' lines and bad records
    read back in the order they were staged. Reading is repeatable; nothing here writes."""

    manifest: dict[str, Any]

    @property
    @abstractmethod
    def place(self) -> str:
        """Where the attempt lies, for messages (a directory, or a Redis key and field)."""

    @property
    @abstractmethod
    def staged_in(self) -> str:
        """Where it was staged, for people: ``files``, ``redis (driver)``, ``redis (executors)``."""

    @abstractmethod
    def lines(self, state: str) -> Iterator[str]:
        """The state's ``key TAB partial`` lines as staged, each ending in a newline: the
        commit passes blocks of them to Redis without decoding (tridentflow_state.numeric).
        IncompleteBatchError (one line) if they are gone - the txid committed meanwhile, or
        its staging was deleted or expired."""

    @abstractmethod
    def bad_records(self) -> Iterator[dict[str, Any]]:
        """The records to quarantine, as staged (``BadRecord.to_json``)."""

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

    def key_count(self, state: str) -> int:
        """How many keys the state staged (KeyError if it staged none: the commit checks the
        code shape that staged the batch first, ``committer.check_code_shape``)."""
        return int(self.manifest["states"][state]["lines"])

    def state_info(self, state: str) -> dict[str, Any]:
        """The manifest's entry for one state; IncompleteBatchError if it staged none."""
        info = self.manifest["states"].get(state)
        if info is None:
            raise IncompleteBatchError(
                f"txid {self.txid} attempt {self.attempt}: no staged output for state {state!r}"
            )
        return info

    def items(self, state: str) -> Iterator[tuple[str, Any]]:
        """(encoded key, partial) pairs of one state, in staged order."""
        for line in self.lines(state):
            key, _tab, partial = line.partition("\t")
            yield key, json.loads(partial)

    def keys(self, state: str) -> Iterator[str]:
        """The encoded keys of one state, in staged order (the values are not decoded)."""
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


@runtime_checkable
class InBlocks(Protocol):
    """A staged batch whose states' lines are blocks in Redis: the commit may apply a
    built-in numeric combiner's blocks where they lie, the partials never leaving Redis."""

    def blocks(self, state: str) -> list[BlockRef]:
        """The state's staged blocks, in staged order."""
        ...

    def blocks_lie_in(self, keyspace: KeySpace) -> bool:
        """Whether the blocks lie next to ``keyspace``'s state shards, so that the commit can
        apply them where they lie (not after ``tridentflow reshard`` moved the state to
        another layout: their lines are then read back and routed anew)."""
        ...

    def apply_numeric_block(
        self, ref: BlockRef, state: str, kind: StateKind, op: str, fence: Fence
    ) -> tuple[int, list[str]]:
        """APPLY_NUMERIC over one block where it lies (keys written, keys left for Python);
        IncompleteBatchError if the block is gone or not what the manifest says."""
        ...

    def block_lines(self, ref: BlockRef) -> list[str]:
        """The ``key TAB partial`` lines of one block (no newlines)."""
        ...


class StagingArea(ABC):
    """Where emit attempts stage, in one generation of one pipeline. Writing an attempt is
    idempotent (written again whole); ``load`` verifies it; the discards are idempotent. An
    area says how it stages an attempt's parts (``_stage``) and keeps its manifest
    (``_store_manifest``); ``write`` puts them in the one order every area keeps."""

    def write(
        self,
        header: dict[str, Any],
        counts: dict[int, PartitionCount],
        partials: Partials,
        bad: Iterable[BadRecord] = (),
        before_manifest: Callable[[], None] | None = None,
    ) -> StagedBatch:
        """Stage one attempt (``header`` names its txid and attempt): its states' partials and
        bad records, then - after ``before_manifest`` (a fault point) - its manifest, last."""
        txid, attempt = int(header["txid"]), int(header["attempt"])
        parts = self._stage(txid, attempt, partials, bad)
        if before_manifest is not None:
            before_manifest()
        return self._store_manifest(txid, attempt, manifest_header(header, counts, **parts))

    @abstractmethod
    def _stage(
        self, txid: int, attempt: int, partials: Partials, bad: Iterable[BadRecord]
    ) -> dict[str, Any]:
        """Stage the attempt's parts; what its manifest says of them (``states``, ``bad``)."""

    @abstractmethod
    def _store_manifest(self, txid: int, attempt: int, manifest: dict[str, Any]) -> StagedBatch:
        """Keep the manifest (the attempt counts as staged from now on); the staged batch."""

    @abstractmethod
    def space(self, txid: int, attempt: int) -> BlockSpace | None:
        """Where executors may write an attempt's blocks themselves, or None: the driver
        stages everything (``write``'s partials are then pairs only)."""

    @abstractmethod
    def load(self, txid: int, attempt: int) -> StagedBatch:
        """Load and verify a staged attempt; IncompleteBatchError if torn or missing."""

    @abstractmethod
    def manifest(self, txid: int, attempt: int) -> dict[str, Any]:
        """An attempt's manifest only (written last: present means complete);
        IncompleteBatchError if missing - e.g. discarded after its txid committed."""

    @abstractmethod
    def holds(self, txid: int, attempt: int) -> bool:
        """Whether an attempt's manifest is here (one read)."""

    @abstractmethod
    def discard(self, txid: int) -> None:
        """Delete every staged attempt of ``txid``."""

    @abstractmethod
    def discard_before(self, txid: int) -> None:
        """After ``txid`` committed: delete what commits of earlier txids cut short after
        their marks left (best effort: what this area cannot find cheaply expires)."""

    @abstractmethod
    def discard_attempts(self, txid: int, attempts: Iterable[int]) -> None:
        """Delete the named attempts of ``txid`` - abandoned ones: refused, died part-way,
        superseded."""

    @abstractmethod
    def prune(self, batch: StagedBatch) -> None:
        """Delete what ``batch``'s attempt wrote that its manifest does not name (Spark task
        attempts killed or beaten by another); best effort."""


def check_manifest_names(manifest: dict[str, Any], txid: int, attempt: int, place: str) -> None:
    """IncompleteBatchError unless ``manifest`` is the one of (txid, attempt)."""
    if (int(manifest.get("txid", -1)), int(manifest.get("attempt", -1))) != (txid, attempt):
        raise IncompleteBatchError(f"{place}: manifest is for another txid/attempt")


def parse_manifest(raw: str | bytes, txid: int) -> dict[str, Any]:
    """A manifest's JSON; IncompleteBatchError (one line) if it is not JSON."""
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise IncompleteBatchError(f"txid {txid}: manifest is not JSON: {exc}") from exc


def manifest_header(
    header: dict[str, Any], counts: dict[int, PartitionCount], **parts: Any
) -> dict[str, Any]:
    """The manifest of an attempt: its ``header``, the counts per partition, then ``parts``."""
    manifest = dict(header)
    manifest["counts"] = {str(p): c.to_json() for p, c in sorted(counts.items())}
    manifest.update(parts)
    return manifest
