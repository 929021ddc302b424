"""Source specifications: what a pipeline reads, and how (its SourceMode). The logs they
describe are beside them (filelog, redisstream, kafka); ``LogSource`` is the embedded file log,
``RedisStreamSource`` Redis Streams, ``KafkaSource`` a Kafka topic, ``CustomSource`` a log of
your own. Each opens its log with ``open_log(ctx)`` (tridentflow.sources.base): a new kind of
source is a subclass with its own ``open_log``, in its own module, and nothing else changes."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, Any, ClassVar

from tridentflow.datasets import (
    DEFAULT_NAMESPACE,
    LineageDataset,
    iceberg_location,
    kafka_namespace,
    location_dataset,
    redis_namespace,
)
from tridentflow.errors import PipelineError
from tridentflow.schemas import FieldType, Schema, check_source_types, parse_schema
from tridentflow.sources.kafka import KafkaFormat

if TYPE_CHECKING:
    from tridentflow.sources.base import SourceContext, SourceLog


class SourceMode(StrEnum):
    TRANSACTIONAL = "transactional"
    OPAQUE = "opaque"
    NON_TRANSACTIONAL = "non-transactional"


@dataclass(frozen=True)
class LogSource:
    """The embedded partitioned file log (see tridentflow.sources.filelog).

    ``batch_size`` is the most records taken from each partition per txid. Records are JSON
    values: a dict gives its ``fields`` by name, a list by position, and a scalar is the single
    field of a one-field source.
    """

    fields: tuple[str, ...]
    mode: SourceMode = SourceMode.TRANSACTIONAL
    partitions: int = 4
    batch_size: int = 10_000
    position_field: str | None = None
    """If set, the source stream has one more field, after ``fields``: each record's position
    in the source, 0, 1, 2, ... in the order records are committed (every earlier batch's
    records, then this batch's partition by partition, offset by offset; see
    engines.tasks.split_ranges). Unique and stable across replays: what count windows key
    on (``Stream.tumbling_window(n, on=position_field)``)."""
    schema: str | Schema | Any = None
    """The records' types, as Spark DDL (``"sentence string, n bigint"``) or a pyspark
    StructType, naming every field: what a DataFrame or SQL step (``Stream.spark``,
    ``Stream.sql``) sees. A record whose value does not fit its type is a bad record
    (quarantined). None: untyped (steps of Python functions need no types)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "fields", tuple(self.fields))
        object.__setattr__(self, "mode", SourceMode(self.mode))
        if not self.fields:
            raise PipelineError("a source needs at least one field")
        if self.schema is not None:
            object.__setattr__(self, "schema", _typed_fields(self.fields, self.schema))
        if self.partitions < 1:
            raise PipelineError(f"a source needs at least one partition, got {self.partitions}")
        if self.batch_size < 1:
            raise PipelineError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.position_field is not None and self.position_field in self.fields:
            raise PipelineError(
                f"position_field {self.position_field!r} is already a field of the source"
            )

    uses_redis: ClassVar[bool] = False
    """Whether ``open_log`` needs the pipeline's Redis (``SourceContext.client``)."""

    def describe(self) -> str:
        """The source for people, in a message: its kind, never its settings (they may hold
        credentials; a log's ``root`` does)."""
        return type(self).__name__

    @property
    def stream_fields(self) -> tuple[str, ...]:
        """The source stream's fields: the records' fields, then the position if asked for."""
        return self.fields + ((self.position_field,) if self.position_field else ())

    @property
    def stream_schema(self) -> Schema | None:
        """The source stream's declared types (the position a bigint); None: untyped."""
        if self.schema is None:
            return None
        position = ((self.position_field, FieldType("bigint")),) if self.position_field else ()
        return Schema(self.schema.fields + position)

    def open_log(self, ctx: SourceContext) -> SourceLog:
        """The pipeline's file log, under ``HOME/sources/PIPELINE``."""
        from tridentflow.sources.filelog import FileLog

        return FileLog(ctx.home / "sources" / ctx.pipeline)

    def lineage_datasets(self, ctx: SourceContext) -> list[LineageDataset]:
        """What the source reads, as OpenLineage names it (tridentflow.datasets): the file
        log's directory."""
        return [LineageDataset("file", str(ctx.home / "sources" / ctx.pipeline))]


@dataclass(frozen=True)
class RedisStreamSource(LogSource):
    """Redis Streams, one per partition (see tridentflow.sources.redisstream), on the Redis
    the pipeline's state lives in. ``streams`` names partition P's stream; entries carry the
    source's ``fields`` by name (``XADD key * sentence "..."``); ``batch_size`` entries at
    most per partition and txid."""

    streams: str = "tridentflow:{pipeline}:p{partition}"
    """Partition P's stream: ``{pipeline}``, ``{partition}`` and ``{namespace}`` are filled in.
    The default name is the deployment's own: in a namespace it becomes
    ``tridentflow:NAMESPACE:{pipeline}:p{partition}``. A name without ``{pipeline}`` (or
    without ``{namespace}``) is a stream other readers may share: each tridentflow reader
    keeps a consumer group on it, trim deletes only what every group has read, and a reset
    of one reader never deletes the stream."""

    def __post_init__(self) -> None:
        super().__post_init__()
        try:
            self.stream_keys("pipeline")
        except (KeyError, IndexError, ValueError) as exc:
            raise PipelineError(
                f"streams {self.streams!r} may name only {{pipeline}}, {{partition}} and "
                f"{{namespace}} and must name {{partition}}: {exc}"
            ) from None
        if len(set(self.stream_keys("p"))) != self.partitions:
            raise PipelineError(f"streams {self.streams!r} must name {{partition}}")

    uses_redis: ClassVar[bool] = True

    def open_log(self, ctx: SourceContext) -> SourceLog:
        """The pipeline's streams, read through its Redis."""
        from tridentflow.sources.redisstream import RedisStreamLog
        from tridentflow_state.keys import KeySpace

        streams = self.stream_keys(ctx.pipeline, ctx.namespace)
        keys = KeySpace(ctx.pipeline, ctx.namespace)  # the reader's keys, whatever its shards
        return RedisStreamLog(ctx.client, ctx.redis_url, keys, streams, self.fields)

    def lineage_datasets(self, ctx: SourceContext) -> list[LineageDataset]:
        """One dataset per partition: its stream, on the pipeline's Redis."""
        where = redis_namespace(ctx.redis_url) if ctx.redis_url else DEFAULT_NAMESPACE
        keys = self.stream_keys(ctx.pipeline, ctx.namespace)
        return [LineageDataset(where, key, (p,)) for p, key in enumerate(keys)]

    def stream_keys(self, pipeline: str, namespace: str = "") -> list[str]:
        """The streams of partitions 0..partitions-1 for ``pipeline`` in ``namespace``."""
        template = self.streams
        if namespace and template == DEFAULT_STREAMS:
            template = DEFAULT_NAMESPACED_STREAMS
        return [
            template.format(pipeline=pipeline, partition=p, namespace=namespace)
            for p in range(self.partitions)
        ]


DEFAULT_STREAMS = RedisStreamSource.__dataclass_fields__["streams"].default
DEFAULT_NAMESPACED_STREAMS = "tridentflow:{namespace}:{pipeline}:p{partition}"


@dataclass(frozen=True)
class KafkaSource(LogSource):
    """A Kafka topic (see tridentflow.sources.kafka), read with confluent-kafka at
    ``read_committed`` isolation. A txid's metadata is the offset range per partition, as for
    every source; ``batch_size`` offsets at most per partition and txid.

    Records are JSON values (``value_format="json"``: a dict gives its ``fields`` by name, a
    list by position, a scalar the single field), or UTF-8 text, the single field of a
    one-field source (``"text"``; parse anything else with ``each`` on that field). A record
    that does not decode is quarantined, as for every source."""

    topic: str = "{pipeline}"
    """The topic; ``{pipeline}`` is filled in."""
    config: tuple[tuple[str, str], ...] | dict[str, str] = ()
    """confluent-kafka client settings (``bootstrap.servers``, ``security.protocol``,
    ``sasl.*``, ``ssl.*``, ...). Without ``bootstrap.servers`` it comes from
    ``TRIDENTFLOW_KAFKA_BOOTSTRAP``, or, under Airflow, the ``kafka_default`` connection."""
    value_format: KafkaFormat = KafkaFormat.JSON
    timeout_s: float = 10.0
    """A broker (or partition leader) that does not answer within this is unavailable: an
    opaque batch skips its partitions, a transactional one waits."""

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "config", _settings(self.config))
        try:
            object.__setattr__(self, "value_format", KafkaFormat(self.value_format))
        except ValueError:
            raise PipelineError(
                f"value_format must be 'json' or 'text', got {self.value_format!r}"
            ) from None
        if self.value_format is KafkaFormat.TEXT and len(self.fields) != 1:
            raise PipelineError(
                f"value_format 'text' gives one field, but the source has {len(self.fields)}: "
                "use one field and split it with `each`, or JSON records"
            )
        if self.position_field is not None:
            raise PipelineError(
                "position_field needs dense offsets, and Kafka's skip its transaction markers: "
                "window on a field of the records instead"
            )
        if not self.timeout_s > 0:
            raise PipelineError(f"timeout_s must be > 0, got {self.timeout_s!r}")
        try:
            self.topic_name("p")
        except (KeyError, IndexError, ValueError) as exc:
            raise PipelineError(f"topic {self.topic!r} may name only {{pipeline}}: {exc}") from None

    uses_redis: ClassVar[bool] = True

    def topic_name(self, pipeline: str) -> str:
        return self.topic.format(pipeline=pipeline)

    def open_log(self, ctx: SourceContext) -> SourceLog:
        """The topic, its id kept in the pipeline's Redis (to tell a recreated topic), its
        brokers from the source, the environment or the deployment's connections."""
        from tridentflow.sources.kafka import KafkaLog, RedisValue

        identity = RedisValue(ctx.client, ctx.keys.source_identity)
        return KafkaLog.for_source(
            self, ctx.pipeline, topic_ids=identity, connections=ctx.connections
        )

    def lineage_datasets(self, ctx: SourceContext) -> list[LineageDataset]:
        """The topic, on its first bootstrap server (where the source's brokers come from:
        its config, the environment, the deployment's connection)."""
        from tridentflow.sources.kafka import resolve_config

        brokers = resolve_config(self, ctx.connections)["bootstrap.servers"]
        return [LineageDataset(kafka_namespace(brokers), self.topic_name(ctx.pipeline))]


@dataclass(frozen=True)
class CustomSource(LogSource):
    """A source log of your own (README: Writing your own source): ``log`` names a function
    ``module:function(source, pipeline_name) -> log`` returning an object with the methods of
    tridentflow.sources.base.SourceLog. Its ``root`` must be what the engines' read tasks open
    it from: a string made by ``tridentflow.sources.custom_locator``."""

    log: str = ""
    options: tuple[tuple[str, str], ...] | dict[str, str] = ()
    """Settings for your log (a path, a DSN...), passed on in ``source.options``."""

    def __post_init__(self) -> None:
        super().__post_init__()
        items = self.options.items() if isinstance(self.options, dict) else self.options
        object.__setattr__(self, "options", tuple(sorted((str(k), str(v)) for k, v in items)))
        module, _, function = self.log.partition(":")
        if not module or not function:
            raise PipelineError(
                f"CustomSource log must be 'module:function', got {self.log!r}: a function "
                "(source, pipeline_name) -> log"
            )

    def open_log(self, ctx: SourceContext) -> SourceLog:
        """What the ``log`` function builds for the pipeline."""
        from tridentflow.sources.loading import import_ref

        return import_ref(self.log)(self, ctx.pipeline)

    def lineage_datasets(self, ctx: SourceContext) -> list[LineageDataset]:
        """``tridentflow`` / ``PIPELINE/LOG``: where a log of your own lives is its own
        business (subclass CustomSource and override this to name it)."""
        return [LineageDataset(DEFAULT_NAMESPACE, f"{ctx.pipeline}/{self.log}")]


@dataclass(frozen=True)
class FileSource(LogSource):
    """Files where the data already lands (see tridentflow.sources.files): Parquet, CSV or JSON
    lines under ``uri`` - a local directory every worker mounts, or an object-store prefix
    (``s3://bucket/landing/``) - each file taken by exactly one committed txid, by an explicit
    list frozen per txid (never an mtime cursor). ``batch_size`` is the most files taken per
    partition and txid (a file is never split); ``partitions`` spread the files by a hash of
    their path. A file's records are its rows (CSV: typed as Arrow infers them; JSON: one
    value per line), given to ``fields`` by name; extra columns are ignored.

    ``pattern``: which files, an ``fnmatch`` glob over the path under ``uri`` (its ``*``
    crosses directories; default ``*.parquet``, ``*.csv``, ``*.json*``; hidden files and
    ``_``-prefixed markers never count). ``on_overwrite``: a file already taken found with
    another size or mtime - ``"fail"`` (the coordinator refuses in one line), ``"ignore"``,
    or ``"reingest"`` (its rows come again in a later txid). ``min_age_s`` (2 s): files
    modified more recently than this (by the pipeline's Redis clock) are left for a later
    txid - a writer still writing in place; 0 for writers that rename a finished file in.
    ``storage_options``: delta-rs's object-store keys, as DeltaSink's.

    ``forget_after`` (seconds or a ``timedelta``; default None, remember every file): what
    the source remembers stays bounded - files modified that long before the newest one it
    took (the frontier) fall below a watermark and are forgotten, never compared or taken
    again (a late file older than the watermark is left out: the rule's price), and the
    manifest is trimmed of what committed txids and the rewind retention no longer need."""

    uri: str = ""
    format: str = "parquet"
    pattern: str = ""
    on_overwrite: str = "fail"
    min_age_s: float = 2.0
    storage_options: tuple[tuple[str, str], ...] | dict[str, str] = ()
    partitions: int = 1
    batch_size: int = 100
    forget_after: float | timedelta | None = None

    def __post_init__(self) -> None:
        from tridentflow.sources.files import FORMATS, ON_OVERWRITE

        super().__post_init__()
        object.__setattr__(self, "storage_options", _settings(self.storage_options))
        if not self.uri:
            raise PipelineError("FileSource needs uri=: a directory, or s3://bucket/prefix")
        if self.format not in FORMATS:
            raise PipelineError(
                f"FileSource format must be one of {', '.join(FORMATS)}, got {self.format!r}"
            )
        if self.on_overwrite not in ON_OVERWRITE:
            raise PipelineError(
                f"FileSource on_overwrite must be one of {', '.join(ON_OVERWRITE)}, got "
                f"{self.on_overwrite!r}"
            )
        if self.position_field is not None:
            raise PipelineError(
                "position_field needs an offset per record, and a FileSource's offsets are "
                "files: window on a field of the records instead"
            )
        if not self.min_age_s >= 0:
            raise PipelineError(f"min_age_s must be >= 0, got {self.min_age_s!r}")
        if isinstance(self.forget_after, timedelta):
            object.__setattr__(self, "forget_after", self.forget_after.total_seconds())
        if self.forget_after is not None and (
            isinstance(self.forget_after, bool)
            or not isinstance(self.forget_after, int | float)
            or not self.forget_after >= 1
        ):
            raise PipelineError(
                f"forget_after is seconds (>= 1) or a timedelta, got {self.forget_after!r}: "
                "say how long before the newest file taken a file may still land"
            )
        if not self.pattern:
            suffix = {"parquet": "parquet", "csv": "csv", "json": "json*"}[self.format]
            object.__setattr__(self, "pattern", f"*.{suffix}")

    uses_redis: ClassVar[bool] = True

    def describe(self) -> str:
        return f"FileSource {self.uri}"

    def open_log(self, ctx: SourceContext) -> SourceLog:
        """The files, with the manifest of those taken in the pipeline's Redis."""
        from tridentflow.sources.files import FilesLog

        spec = {
            "uri": self.uri,
            "format": self.format,
            "pattern": self.pattern,
            "on_overwrite": self.on_overwrite,
            "min_age_s": self.min_age_s,
            "storage_options": dict(self.storage_options),
            "partitions": self.partitions,
            "mode": self.mode.value,
            "forget_after_s": self.forget_after,
            "fields": list(self.fields),
        }
        return FilesLog(ctx.client, ctx.redis_url or "", ctx.keys, spec)

    def lineage_datasets(self, ctx: SourceContext) -> list[LineageDataset]:
        """The directory or the bucket's prefix, as OpenLineage names them (``file`` /
        ``s3://bucket``)."""
        return [_path_dataset(self.uri)]

    def records_of_file(self, path: str) -> list[bytes]:
        """One file's records as this source's record stage gets them (ReadsFiles)."""
        from tridentflow.sources.files import FileReader

        reader = FileReader(self.uri, self.format, dict(self.storage_options), False)
        return reader.file_records(path)


@dataclass(frozen=True)
class DeltaSource(LogSource):
    """A Delta Lake table other jobs write (see tridentflow.sources.delta), read through
    delta-rs (no JVM): its versions are the offsets of one partition, so a txid's batch is a
    range of versions. With the table's change data feed on, a version's records are its
    change rows (``_change_type``: ``insert``, ``update_preimage``, ``update_postimage``,
    ``delete``); without it, the rows its appends added (``_change_type`` ``insert``), and a
    version that removed rows is refused in one line, never skipped. Each record also has
    ``_commit_version`` and ``_commit_timestamp``; name any of these in ``fields`` to use them.

    ``batch_size``: the most versions per txid. ``starting_version``: the first version read
    (earlier ones read as empty: a pipeline started on a table with a long history, or past a
    version that cannot be read). ``storage_options``: delta-rs's object-store keys, the dict
    a DeltaSink takes."""

    uri: str = ""
    storage_options: tuple[tuple[str, str], ...] | dict[str, str] = ()
    starting_version: int = 0
    partitions: int = 1
    batch_size: int = 10

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "storage_options", _settings(self.storage_options))
        if not self.uri:
            raise PipelineError("DeltaSource needs uri=: the table's directory or s3:// URI")
        _check_table_source(self, "versions", "starting_version", self.starting_version)

    def describe(self) -> str:
        return f"DeltaSource {self.uri}"

    def open_log(self, ctx: SourceContext) -> SourceLog:
        """The table; nothing kept in Redis (its versions are its own log)."""
        from tridentflow.sources.delta import DeltaLog

        return DeltaLog({"uri": self.uri, "storage_options": dict(self.storage_options),
                         "starting_version": self.starting_version,
                         "fields": list(self.fields)})  # fmt: skip

    def lineage_datasets(self, ctx: SourceContext) -> list[LineageDataset]:
        """The table, named as a DeltaSink names it (so a chain of pipelines links up)."""
        return [location_dataset(self.uri)]


@dataclass(frozen=True)
class IcebergSource(LogSource):
    """An Iceberg table other jobs append to (see tridentflow.sources.iceberg), read through
    pyiceberg (no JVM): the sequence numbers of its main branch's snapshots are the offsets
    of one partition, so a txid's batch is a range of snapshots. An append snapshot's records
    are its new rows (with ``_change_type`` ``insert``, ``_snapshot_id``,
    ``_sequence_number``, ``_commit_timestamp``; name them in ``fields`` to use them); a
    compaction gives nothing; an overwrite or delete snapshot is refused in one line, never
    skipped (pyiceberg reads no changes but appends).

    ``table``: "namespace.table"; ``catalog``: pyiceberg's ``load_catalog`` properties, the
    dict an IcebergSink takes (``name`` defaults to "tridentflow"). ``batch_size``: the most
    sequence numbers per txid. ``starting_sequence``: the first read (earlier snapshots read
    as empty)."""

    table: str = ""
    catalog: tuple[tuple[str, str], ...] | dict[str, str] = ()
    starting_sequence: int = 0
    partitions: int = 1
    batch_size: int = 10

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "catalog", _settings(self.catalog))
        if self.table.count(".") < 1:
            raise PipelineError(f"IcebergSource needs table='namespace.table', got {self.table!r}")
        _check_table_source(self, "snapshots", "starting_sequence", self.starting_sequence)

    def describe(self) -> str:
        return f"IcebergSource {self.table}"

    def open_log(self, ctx: SourceContext) -> SourceLog:
        """The table through its catalog; nothing kept in Redis."""
        from tridentflow.sources.iceberg import IcebergLog

        return IcebergLog({"identifier": self.table, "catalog": dict(self.catalog),
                           "starting_sequence": self.starting_sequence})  # fmt: skip

    def lineage_datasets(self, ctx: SourceContext) -> list[LineageDataset]:
        """The table's location as an IcebergSink names it (no I/O: where the catalog puts
        ``warehouse/namespace/table``), so a sink's table and a source's match."""
        warehouse = dict(self.catalog).get("warehouse", "")
        return [location_dataset(iceberg_location(warehouse, self.table))]


def _settings(given: tuple[tuple[str, str], ...] | dict[str, str]) -> tuple[tuple[str, str], ...]:
    """A dict of settings (client config, storage options, a catalog's properties) as the
    sorted pairs a frozen source keeps (hashable; the same however the dict was ordered)."""
    items = given.items() if isinstance(given, dict) else given
    return tuple(sorted((str(k), str(v)) for k, v in items))


def _check_table_source(source: LogSource, offsets: str, start_name: str, start: object) -> None:
    """PipelineError (one line) unless a table source has one partition (its ``offsets``),
    a first offset ``start_name`` >= 0, and no position_field (its offsets are not records)."""
    kind = type(source).__name__
    if source.partitions != 1:
        raise PipelineError(
            f"a {kind} has one partition (its {offsets}), got partitions={source.partitions}"
        )
    if isinstance(start, bool) or not (isinstance(start, int) and start >= 0):
        raise PipelineError(f"{start_name} is a whole number >= 0, got {start!r}")
    if source.position_field is not None:
        raise PipelineError(
            f"position_field needs an offset per record, and a {kind}'s offsets are "
            f"{offsets}: window on a field of the records instead"
        )


def _path_dataset(uri: str) -> LineageDataset:
    """A directory or an object-store prefix, as OpenLineage names it (``file`` /
    ``s3://bucket``)."""
    if uri.startswith("s3://"):
        bucket, _, prefix = uri[len("s3://") :].partition("/")
        return LineageDataset(f"s3://{bucket}", prefix.rstrip("/") or "/")
    path = uri[len("file://") :] if uri.startswith("file://") else uri
    return LineageDataset("file", path)


def _typed_fields(fields: tuple[str, ...], schema: Any) -> Schema:
    """``schema`` for a source of ``fields``: the same names (in the fields' order), every type
    one a JSON record can hold; PipelineError in one line otherwise."""
    parsed = parse_schema(schema)
    if set(parsed.names) != set(fields):
        missing = [f for f in fields if f not in parsed.names]
        extra = [f for f in parsed.names if f not in fields]
        raise PipelineError(
            f"the source's schema names {list(parsed.names)}, its fields are {list(fields)}"
            + (f": no type for {missing}" if missing else "")
            + (f": {extra} are not fields" if extra else "")
            + "; give every field one type"
        )
    typed = parsed.select(fields)
    check_source_types(typed)
    return typed
