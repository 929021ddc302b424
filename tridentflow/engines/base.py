"""What every engine is: the interface a newcomer reads first.

An engine computes one batch (a txid's offset ranges) of a compiled plan: per source partition
how many records it read, per state the (encoded key, staged value) pairs to commit, the
records it quarantined, and Trident's count reports of every exchange. It must be
deterministic: a replay of the same ranges stages the same values.

* ``tridentflow.engines.tasks``: the record stage every engine shares (read tasks, the fold).
* ``tridentflow.engines.graph`` + ``batchops``: the batch-operation graph over a three-method
  backend (map partitions, exchange, union), written once.
* ``tridentflow.engines.local``: the plain-Python reference engine.
* ``tridentflow.engines.spark``: the same on Spark; its graph on RDDs on classic Spark
  (``rdds``), on DataFrames over Spark Connect (``frames``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from tridentflow.errors import NON_FINITE, IncompleteBatchError, StagingValueError
from tridentflow_state.codec import encode_value
from tridentflow_state.errors import KeyEncodingError

if TYPE_CHECKING:
    from tridentflow.engines.batchops import StageReport
    from tridentflow.plan import BadRecord, Plan
    from tridentflow_state.staged import BlockSpace, WrittenBlocks

Ranges = Mapping[int, tuple[int, int]]
"""partition -> [start, end) offsets to read."""

COLLECT_KEYS = 200_000
"""A Spark batch whose states hold at most this many keys in all is collected in one job; past
that, each state is read on its own, and one bigger than this is streamed partition by
partition (toLocalIterator), so the driver never holds the collected rows and the keys at
once."""


@dataclass(frozen=True)
class ExecContext:
    """What a batch's graph needs beyond the plan."""

    txid: int
    redis_url: str
    lose_tuple: bool = False
    """The ``lose-tuple`` fault: every target partition of the first exchange loses a tuple."""
    namespace: str = ""
    """The deployment's key namespace (state queries read keys under it)."""
    position_base: int | None = None
    """Records before this batch, every partition counted (positions of the records read
    start there; see LogSource.position_field). None: the sum of the ranges' starts."""
    blocks: BlockSpace | None = None
    """Where this emit attempt's blocks go when it stages in Redis (TRIDENTFLOW_STAGING=redis):
    an engine whose workers reach Redis may write a big state's partials there itself and
    return ``WrittenBlocks`` for it (the Spark engine does); None: staged as files."""
    read_state: StateReader | None = None
    """Where a stateQuery reads committed values instead of Redis (the local engine only:
    ``tridentflow.testing`` runs a pipeline's states in memory)."""


StateReader = Callable[[str, str, list[str]], list[Any]]
"""(pipeline, state, encoded keys) -> each key's committed stored value (None: absent)."""


@dataclass(frozen=True)
class PartitionCount:
    """Records actually read from one partition: how many, and the first and last offset."""

    n: int
    first: int | None
    last: int | None

    def to_json(self) -> list[Any]:
        return [self.n, self.first, self.last]

    @classmethod
    def merge(cls, a: PartitionCount, b: PartitionCount) -> PartitionCount:
        firsts = [x for x in (a.first, b.first) if x is not None]
        lasts = [x for x in (a.last, b.last) if x is not None]
        return cls(a.n + b.n, min(firsts, default=None), max(lasts, default=None))


@dataclass
class ComputeResult:
    counts: dict[int, PartitionCount]
    """Records read per partition, bad ones included."""
    partials: dict[str, Iterable[tuple[str, Any]] | WrittenBlocks]
    """state name -> (encoded group key, staged value) pairs, one per key; consumed once,
    lazily. The staged value is a Combiner's partial or a Reducer's/updater's tuples. With
    ``ExecContext.blocks``, a state the engine staged itself: its WrittenBlocks."""
    bad: list[BadRecord]
    """Records that could not be processed (quarantined)."""
    stages: list[StageReport] = field(default_factory=list)
    """Every exchange's per-partition count reports (Trident's completeness check)."""


class Engine(Protocol):
    name: str

    def compute(
        self, plan: Plan, log_root: str, ranges: Ranges, ctx: ExecContext
    ) -> ComputeResult: ...


def check_stages(txid: int, reports: Iterable[StageReport]) -> None:
    """Fail (IncompleteBatchError) if any exchange lost or gained tuples or reports."""
    failed = [r for r in reports if not r.ok]
    if failed:
        raise IncompleteBatchError(
            f"txid {txid}: batch is incomplete, it must not commit: "
            + "; ".join(r.describe() for r in failed[:5])
            + (f" (and {len(failed) - 5} more)" if len(failed) > 5 else "")
        )


def staged_json(value: Any, what: str) -> str:
    """``value`` as the JSON text staging writes; StagingValueError (one line) if it has none."""
    try:
        return encode_value(value)
    except KeyEncodingError as exc:
        if isinstance(value, float) or "NaN or an infinity" in str(exc):
            raise StagingValueError(f"{what}: cannot stage {value!r:.200}: {NON_FINITE}") from None
        raise StagingValueError(
            f"{what}: cannot stage {value!r:.200} as JSON ({exc.__cause__ or exc}); "
            "aggregators and updaters must return JSON values (numbers, strings, lists, "
            "maps, null)"
        ) from None
