"""The sink interface: what ``export`` needs from a store it writes a new-values stream to.
Its errors (``SinkError``, ``SinkRefusedError``, ``ReloadNeededError``) live in
``tridentflow.errors`` with every other and are named here too, for sinks of your own."""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import redis

from tridentflow.connections import NONE, Connections
from tridentflow.datasets import DEFAULT_NAMESPACE, LineageDataset
from tridentflow.errors import ReloadNeededError, SinkError, SinkRefusedError

Row = tuple[Any, ...]

__all__ = [
    "CarriesBack",
    "ExportContext",
    "LineageContext",
    "MaintainsTable",
    "ReloadNeededError",
    "Row",
    "Sink",
    "SinkError",
    "SinkRefusedError",
]


@dataclass(frozen=True)
class ExportContext:
    """What a sink may use of the pipeline it exports: its name, its current generation (a
    reset or a rewind starts a new one: a sink that can, then replaces what it held), its
    lineage (a reset starts a new one, a rewind does not: a sink that cannot replace what
    it wrote goes on from its position) and its Redis."""

    pipeline: str
    generation: str
    client: redis.Redis
    redis_url: str
    fire: Callable[[str, int], None] = lambda point, txid: None
    """Fault injection (tridentflow.faults): a sink calls ``fire("mid-export", txid)`` part-way
    through applying a txid, and a sink of several parts ``fire("between-parts", txid)`` after
    each part that has it."""
    replicas: int = 0
    """With > 0 (``--wait-replicas``), a sink in Redis reports a txid applied only once that
    many replicas acknowledged it: a failover cannot then take back what its position says."""
    replica_timeout_ms: int = 5000
    lineage: str = ""
    """The generation the pipeline's lineage began with ('' = ``generation``)."""
    generation_now: Callable[[], str | None] = lambda: None
    """The pipeline's generation in Redis now (None: unknown): a sink that waited (a lock)
    checks it before it writes, so an export overtaken by a reset or a rewind writes nothing."""
    connections: Connections = NONE
    """The deployment's named connections, for a sink that names none of its own (under
    Airflow: Airflow's; tridentflow.connections)."""
    exclusive: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext
    """One exporter of this sink at a time (a Redis lock, expiring): a sink whose store
    cannot tell two creators of its table apart holds it around its writes."""
    resync: bool = False
    """The operator asked for a reload (``export --resync``): a sink replaces its content
    even if it stands at the txid already. Otherwise a reload a racing exporter already did
    (the sink at or past the txid) is not done twice."""
    note_version: Callable[[int, Any], None] = lambda txid, version: None
    """A table-format sink tells which version of its table holds txid (a Delta version, an
    Iceberg snapshot id): mirrored in the pipeline's Redis for ``status`` and time travel."""


@dataclass(frozen=True)
class LineageContext:
    """What a sink may use to name what it writes (``Sink.lineage_datasets``): no I/O."""

    pipeline: str
    redis_url: str
    connections: Connections = NONE


class Sink(ABC):
    """A store a new-values stream is exported to.

    Contract: ``apply`` is atomic (a reader of the store sees all of a txid or none of it,
    where the store can promise that; see each sink), idempotent (a txid already applied
    in this generation is a no-op, returning False) and ordered (it refuses a txid that is
    not the one after its position, unless ``replace_all``). Its position is recorded by the
    store itself, in the same atomic step as the rows, so no crash can separate them."""

    name: str
    resyncable: bool = False
    """True if ``apply(..., replace_all=True)`` can replace everything the sink holds with a
    whole-state snapshot (a sink that fell behind its change log reloads instead of failing)."""
    takes_arrow: bool = False
    """True if ``apply`` also takes the rows as one ``pyarrow.Table`` whose columns are the
    stream's fields: the export then reads a stream with no operations of its own straight
    from the change log into columns (no Python tuple per row)."""

    @abstractmethod
    def bind(self, fields: tuple[str, ...], key_fields: tuple[str, ...]) -> Sink:
        """This sink configured for a stream of ``fields`` whose state is keyed by
        ``key_fields``; ValueError (one line) if it cannot take that stream."""

    @abstractmethod
    def position(self, ctx: ExportContext) -> int:
        """The last txid applied in ``ctx.generation`` (0: none, or another generation)."""

    @abstractmethod
    def apply(
        self, ctx: ExportContext, txid: int, rows: Sequence[Row], replace_all: bool = False
    ) -> bool:
        """Apply txid's rows (one per changed key, in a fixed order; a row whose non-key
        values are all None removes its key; a ``pyarrow.Table`` for a sink that
        ``takes_arrow``). ``replace_all``: the rows are the whole state
        as of txid, replacing everything. False if txid was already applied."""

    def written_through(self, ctx: ExportContext) -> int:
        """The newest txid any part of the sink holds rows of, whole or in part (>=
        ``position``). A sink that applies a txid in one atomic step: its position. A rewind
        to N is refused while a sink that cannot take back what it wrote is past N here."""
        return self.position(ctx)

    def claims(self) -> tuple[str, ...]:
        """What the sink writes to, one string per target (a stream, a table): two sinks of a
        pipeline may not claim the same one (they would collide)."""
        return ()

    def describe(self) -> str:
        """What the sink writes to, without secrets (status, errors)."""
        return self.name

    def lineage_datasets(self, ctx: LineageContext) -> list[LineageDataset]:
        """What the sink writes, as OpenLineage names it (tridentflow.datasets); a sink of
        your own that does not say: ``tridentflow`` / ``PIPELINE/SINK``."""
        return [LineageDataset(DEFAULT_NAMESPACE, f"{ctx.pipeline}/{self.name}")]

    def close(self) -> None:
        """Release connections (the next apply opens them again)."""
        return None


@runtime_checkable
class CarriesBack(Protocol):
    """A sink that can take back what it wrote: ``tridentflow rewind --to N`` brings its table
    back to its content as of txid N (a lakehouse table's time travel) instead of refusing
    the rewind while the sink is past N. Its txid -> table version mirror is kept in Redis
    (``ExportContext.note_version``) and shown by ``status``."""

    def rewind_to(
        self, ctx: ExportContext, old_generation: str, target: int, known: Any = None
    ) -> Any | None:
        """The table as of txid ``target`` of ``old_generation``, written as one new version
        stamped with ``ctx``'s generation at ``target``; ``known``: the version the mirror
        names for ``target``. Idempotent; None if that version is gone (the sink then
        reloads at the next export)."""
        ...


@runtime_checkable
class MaintainsTable(Protocol):
    """A sink whose table ``tridentflow tables compact|vacuum`` maintains. Neither may move a
    txid stamp; both are idempotent."""

    def compact(self) -> dict[str, Any]:
        """Small files rewritten into few, as a new version of the same rows; its metrics."""
        ...

    def vacuum(
        self, retention_hours: float = 168, dry_run: bool = True, keep_versions: Any = ()
    ) -> list[str]:
        """Files no version the sink may need references (``keep_versions``: those a rewind
        may still reach), listed, and deleted unless ``dry_run``."""
        ...
