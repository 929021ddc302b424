"""Kafka as a source log (confluent-kafka, ``read_committed``): a topic's partitions are the
log's partitions, Kafka offsets its offsets.

Kafka offsets are not dense: a transaction's commit or abort marker takes an offset that holds
no record, and so do aborted records under ``read_committed`` (and compacted ones). The log
says so (``dense = False``): ``read_raw`` yields every record of [start, end) that a
``read_committed`` consumer gets, and the range counts as read once the consumer's position
reached ``end`` - the read tasks then account for the whole range (``engines.tasks``).

* The head of a partition is where a ``read_committed`` consumer meets its end: the broker's
  last stable offset, checked by reading from just before it to the partition's end (one
  fetch). A broker that reports a stale high watermark cannot hide records from a batch.
* A broker or leader that does not answer within ``timeout_s`` makes its partitions
  unavailable (an opaque batch skips them and picks them up later; a transactional one waits).
* What Kafka lost is never skipped: records deleted (retention) before a batch that needs them
  read them, a partition whose end is behind what was committed from it, or a topic deleted
  and recreated (its topic id changed) fail with the offsets and the way out, one line.
* Credentials and every other client setting come from ``KafkaSource.config``; messages
  name the brokers (``bootstrap.servers``), never the settings.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Iterable, Iterator
from enum import StrEnum
from typing import Any

from tridentflow.connections import NONE, Connections
from tridentflow.errors import NotConfiguredError, PartitionUnavailableError, SourceError
from tridentflow.sources.base import ChaosTraits, LogScan, Produced
from tridentflow.sources.filelog import encode_record


class KafkaFormat(StrEnum):
    JSON = "json"
    TEXT = "text"


LOCATOR_PREFIX = "kafka:"
"""A Kafka log's locator (what the engines' read tasks open) starts with this."""
BOOTSTRAP_ENV = "TRIDENTFLOW_KAFKA_BOOTSTRAP"
CONFIG_ENV = "TRIDENTFLOW_KAFKA_CONFIG"
"""A JSON object of client settings (what the Airflow emit task hands its spark-submit: the
``kafka_default`` connection's settings, off the command line)."""
CONN_ID = "kafka_default"
"""The deployment's connection (tridentflow.connections) a KafkaSource without brokers uses
(under Airflow: the apache-kafka provider's connection of that name)."""
GROUP_PREFIX = "tridentflow."
"""Consumer group a reader commits its committed offsets under (``tridentflow.PIPELINE``):
Kafka's own tools show its lag. Reads never depend on it."""
READ_BATCH = 10_000
POLL_S = 0.01
"""How long one ``consume`` call waits for a full batch: it returns what came by then (a range
whose last offsets hold no record never fills its batch)."""
CLIENT_ID = "tridentflow"


class RedisValue:
    """One string key as a get/set value (what a Kafka log keeps its topic's id in)."""

    def __init__(self, client: Any, key: str) -> None:
        self.client = client
        self.key = key

    def get(self) -> str | None:
        value = self.client.get(self.key)
        return None if value is None else value.decode() if isinstance(value, bytes) else value

    def set(self, value: str) -> None:
        self.client.set(self.key, value)


def resolve_config(source: Any, connections: Connections = NONE) -> dict[str, str]:
    """The client settings: the source's own, then brokers from ``TRIDENTFLOW_KAFKA_BOOTSTRAP``,
    then the deployment's ``kafka_default`` connection (or ``TRIDENTFLOW_KAFKA_CONFIG``, its
    copy in a spark-submit); SourceError (one line) if none names brokers."""
    config = dict(source.config)
    if "bootstrap.servers" in config:
        return config
    if os.environ.get(BOOTSTRAP_ENV):
        return {**config, "bootstrap.servers": os.environ[BOOTSTRAP_ENV]}
    found = connections.settings(CONN_ID)
    if not found and os.environ.get(CONFIG_ENV):
        try:
            found = {str(k): str(v) for k, v in json.loads(os.environ[CONFIG_ENV]).items()}
        except (ValueError, AttributeError):
            raise SourceError(f"{CONFIG_ENV} must be a JSON object of client settings") from None
    if found and found.get("bootstrap.servers"):
        return {**found, **config}
    raise NotConfiguredError(
        "a KafkaSource needs brokers: set TRIDENTFLOW_KAFKA_BOOTSTRAP=host:port, give "
        "config={'bootstrap.servers': ...}, or (under Airflow) a kafka_default connection"
    )


class KafkaLog:
    """One topic as a source log. Every method opens what it needs and bounds every wait by
    ``timeout_s``; ``close`` releases the clients."""

    chaos = ChaosTraits(disturb="freeze-broker", fresh="create", producers_own=True)

    dense = False

    def __init__(
        self,
        topic: str,
        config: dict[str, str],
        pipeline: str,
        value_format: KafkaFormat = KafkaFormat.JSON,
        timeout_s: float = 10.0,
        topic_ids: Any = None,
        partitions_hint: int = 1,
    ) -> None:
        """``topic_ids``: where the reader keeps the topic id it reads (a mapping-like object
        with ``get``/``set``; the runtime gives Redis), to tell a recreated topic; none in a
        read task."""
        self.topic = topic
        self.config = dict(config)
        self.pipeline = pipeline
        self.value_format = KafkaFormat(value_format)
        self.timeout_s = float(timeout_s)
        self.topic_ids = topic_ids
        self.partitions_hint = partitions_hint
        """How many partitions to report unavailable when no broker answers at all."""
        self._consumer_: Any = None
        self._admin_: Any = None

    @classmethod
    def for_source(
        cls,
        source: Any,
        pipeline: str,
        topic_ids: Any = None,
        connections: Connections = NONE,
    ) -> KafkaLog:
        return cls(
            source.topic_name(pipeline),
            resolve_config(source, connections),
            pipeline,
            source.value_format,
            source.timeout_s,
            topic_ids,
            source.partitions,
        )

    # -- identity -----------------------------------------------------------------------------
    @property
    def brokers(self) -> str:
        return self.config.get("bootstrap.servers", "?")

    @property
    def root(self) -> str:
        return self.locator

    @property
    def locator(self) -> str:
        spec = {
            "topic": self.topic,
            "config": self.config,
            "pipeline": self.pipeline,
            "format": self.value_format.value,
            "timeout_s": self.timeout_s,
        }
        return LOCATOR_PREFIX + json.dumps(spec, sort_keys=True)

    @classmethod
    def open(cls, locator: str) -> KafkaLog:
        spec = json.loads(locator[len(LOCATOR_PREFIX) :])
        return cls(
            spec["topic"], spec["config"], spec["pipeline"], spec["format"], spec["timeout_s"]
        )

    def __repr__(self) -> str:  # never the settings: they may hold credentials
        return f"KafkaLog(topic={self.topic!r}, brokers={self.brokers!r})"

    @property
    def group(self) -> str:
        return GROUP_PREFIX + self.pipeline

    def _where(self, partition: int | None = None) -> str:
        part = "" if partition is None else f" partition {partition}"
        return f"Kafka topic {self.topic}{part} at {self.brokers}"

    # -- clients ------------------------------------------------------------------------------
    def _consumer(self) -> Any:
        if self._consumer_ is None:
            from confluent_kafka import Consumer

            self._consumer_ = Consumer(
                {
                    "client.id": CLIENT_ID,
                    # a read ends at the partition's end: the broker must not hold that fetch
                    # for its default 500 ms waiting for more
                    "fetch.wait.max.ms": 10,
                    **self.config,
                    "group.id": self.group,
                    "enable.auto.commit": False,
                    "enable.auto.offset.store": False,
                    "isolation.level": "read_committed",
                    "enable.partition.eof": True,
                    "auto.offset.reset": "error",  # never jump over what is gone
                    "allow.auto.create.topics": False,
                    "socket.timeout.ms": max(int(self.timeout_s * 1000), 1500),
                },
                logger=_QUIET,
            )
        return self._consumer_

    def _admin(self) -> Any:
        if self._admin_ is None:
            from confluent_kafka.admin import AdminClient

            self._admin_ = AdminClient({"client.id": CLIENT_ID, **self.config}, logger=_QUIET)
        return self._admin_

    def close(self) -> None:
        if self._consumer_ is not None:
            self._consumer_.close()
            self._consumer_ = None
        self._admin_ = None

    # -- topic --------------------------------------------------------------------------------
    def _metadata(self) -> Any:
        """The topic's metadata; PartitionUnavailableError(-1) if no broker answers in time,
        SourceError if the credentials are refused."""
        from confluent_kafka import KafkaError, KafkaException

        try:
            md = self._consumer().list_topics(self.topic, timeout=self.timeout_s)
        except KafkaException as exc:
            self.close()  # a client that lost its brokers may sit in its reconnect backoff
            raise self._failure(exc.args[0], None) from None
        topic = md.topics.get(self.topic)
        if topic is None or (
            topic.error is not None and topic.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
        ):
            return None
        if topic.error is not None:
            raise self._failure(topic.error, None)
        return topic

    def _failure(self, error: Any, partition: int | None) -> SourceError:
        """A client error as one line: unavailable if it may pass, SourceError if not."""
        from confluent_kafka import KafkaError

        code = error.code()
        text = error.str()
        if code in (
            KafkaError._AUTHENTICATION,
            KafkaError.SASL_AUTHENTICATION_FAILED,
            KafkaError.TOPIC_AUTHORIZATION_FAILED,
            KafkaError.GROUP_AUTHORIZATION_FAILED,
            KafkaError.CLUSTER_AUTHORIZATION_FAILED,
            KafkaError._SSL,
        ):
            return SourceError(
                f"{self._where(partition)} refused tridentflow's credentials ({text}): "
                "check the sasl.*/ssl.* settings of the source's config or connection"
            )
        reason = f"not answering at {self.brokers} within {self.timeout_s:g}s ({text})"
        return PartitionUnavailableError(-1 if partition is None else partition, reason)

    def exists(self) -> bool:
        """False only if the brokers say the topic does not exist (unreachable brokers: True,
        and ``scan`` says why nothing can be read)."""
        try:
            return self._metadata() is not None
        except PartitionUnavailableError:
            return True

    def partitions(self) -> int:
        topic = self._metadata()
        return 0 if topic is None else len(topic.partitions)

    def require(self) -> Any:
        """The topic's metadata; SourceError (one line, with the fix) if it does not exist."""
        topic = self._metadata()
        if topic is None:
            raise SourceError(
                f"{self._where()}: no such topic: create it (kafka-topics --create), or "
                f"`tridentflow produce {self.pipeline}` creates it with the source's partitions"
            )
        return topic

    def create(self, partitions: int) -> bool:
        """Create the topic with ``partitions`` partitions unless it exists; True if created."""
        from confluent_kafka import KafkaError, KafkaException
        from confluent_kafka.admin import NewTopic

        if self.exists():
            return False
        futures = self._admin().create_topics(
            [NewTopic(self.topic, partitions, 1)], request_timeout=self.timeout_s
        )
        try:
            futures[self.topic].result(self.timeout_s * 2)
        except KafkaException as exc:
            if exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS:
                return False
            raise self._failure(exc.args[0], None) from None
        return True

    def topic_id(self) -> str | None:
        """The topic's id (it changes when the topic is deleted and created again); None if
        the broker does not tell."""
        from confluent_kafka import KafkaException, TopicCollection

        try:
            futures = self._admin().describe_topics(
                TopicCollection([self.topic]), request_timeout=self.timeout_s
            )
            found = futures[self.topic].result(self.timeout_s * 2).topic_id
        except (KafkaException, AttributeError, KeyError):
            return None
        return None if found is None else str(found)

    def _check_identity(self) -> None:
        """SourceError if the topic the reader read was deleted and created again."""
        if self.topic_ids is None:
            return
        now = self.topic_id()
        if now is None:
            return
        known = self.topic_ids.get()
        if known is None:
            self.topic_ids.set(now)
        elif known != now:
            raise SourceError(
                f"{self._where()} was deleted and created again (topic id {known} -> {now}): "
                f"its offsets start over; `tridentflow reset {self.pipeline}` reads it from "
                "what it holds now"
            )

    # -- offsets ------------------------------------------------------------------------------
    def _list_offsets(self, partitions: Iterable[int], latest: bool) -> dict[int, Any]:
        """partition -> offset (int) or the KafkaError that kept it from being answered."""
        from confluent_kafka import IsolationLevel, KafkaException, TopicPartition
        from confluent_kafka.admin import OffsetSpec

        spec = OffsetSpec.latest() if latest else OffsetSpec.earliest()
        request = {TopicPartition(self.topic, p): spec for p in partitions}
        if not request:
            return {}
        try:
            futures = self._admin().list_offsets(
                request,
                isolation_level=IsolationLevel.READ_COMMITTED,
                request_timeout=self.timeout_s,
            )
        except KafkaException as exc:
            return {tp.partition: exc.args[0] for tp in request}
        found: dict[int, Any] = {}
        for tp, future in futures.items():
            try:
                found[tp.partition] = future.result(self.timeout_s * 2).offset
            except KafkaException as exc:
                found[tp.partition] = exc.args[0]
        return found

    def _ends(self, stable: dict[int, int]) -> dict[int, int | Any]:
        """Where a ``read_committed`` consumer meets each partition's end, read from just
        before the broker's stable offset (one fetch each): partition -> offset, or the
        KafkaError (or None: no answer in time)."""
        from confluent_kafka import KafkaError, TopicPartition

        if not stable:
            return {}
        consumer = self._consumer()
        consumer.assign([TopicPartition(self.topic, p, max(o - 1, 0)) for p, o in stable.items()])
        ends: dict[int, Any] = {}
        try:
            for messages in self._batches(consumer):
                if messages is None:
                    break
                for m in messages:
                    err = m.error()
                    if err is None or m.partition() in ends:
                        continue
                    if err.code() == KafkaError._PARTITION_EOF:
                        ends[m.partition()] = m.offset()
                    elif m.partition() is not None and m.partition() >= 0:
                        ends[m.partition()] = err
                if len(ends) == len(stable):
                    break
        finally:
            consumer.unassign()
        return {p: ends.get(p) for p in stable}

    def _batches(self, consumer: Any, want: int = READ_BATCH) -> Iterator[list[Any] | None]:
        """The consumer's messages and events as they come, in batches of up to ``want``; None
        once nothing came for ``timeout_s`` (the caller stops there)."""
        quiet_since = time.monotonic()
        while True:
            messages = consumer.consume(max(1, min(want, READ_BATCH)), POLL_S)
            if messages:
                quiet_since = time.monotonic()
                yield messages
            elif time.monotonic() - quiet_since > self.timeout_s:
                yield None
                return

    def _heads(
        self, partitions: list[int], committed: dict[int, int]
    ) -> tuple[dict[int, int], dict[int, str]]:
        """(head, or the reason it cannot be told) of each partition: the broker's stable
        offset, then where a read_committed consumer meets the end from just before it."""
        heads: dict[int, int] = {}
        unavailable: dict[int, str] = {}
        stable: dict[int, int] = {}
        for p, found in self._list_offsets(partitions, latest=True).items():
            if isinstance(found, int):
                stable[p] = found
            else:
                unavailable[p] = self._failure(found, p).reason
        for p, end in self._ends(stable).items():
            if isinstance(end, int):
                end = max(end, stable[p])
                if end < (done := committed.get(p, 0)):
                    unavailable[p] = (
                        f"at offset {end}, behind the committed offset {done} (the "
                        f"topic recreated, or an unclean leader election?): `tridentflow reset "
                        f"{self.pipeline}` reads it from what it holds"
                    )
                else:
                    heads[p] = end
            elif end is None:
                unavailable[p] = f"not answering at {self.brokers} within {self.timeout_s:g}s"
            else:
                unavailable[p] = self._failure(end, p).reason
        return heads, unavailable

    def scan(self, committed: dict[int, int] | None = None) -> LogScan:
        """Every partition's head; a partition whose leader does not answer in time, or whose
        end is behind what was committed from it, is unavailable with the reason."""
        committed = committed or {}
        try:
            topic = self.require()
        except PartitionUnavailableError as exc:  # no broker answers: every known partition
            known = sorted(committed) or list(range(self.partitions_hint))
            return LogScan({}, {p: exc.reason for p in known})
        self._check_identity()
        heads: dict[int, int] = {}
        unavailable: dict[int, str] = {}
        readable = []
        for p, meta in sorted(topic.partitions.items()):
            if meta.error is not None or meta.leader < 0:
                why = meta.error.str() if meta.error is not None else "no leader"
                unavailable[p] = f"without a leader at {self.brokers} ({why})"
            else:
                readable.append(p)
        found_heads, found_unavailable = self._heads(readable, committed)
        heads.update(found_heads)
        unavailable.update(found_unavailable)
        for p in committed:  # a partition the topic no longer has
            if p not in heads and p not in unavailable:
                unavailable[p] = f"missing from {self._where()}"
        return LogScan(heads, unavailable)

    def low_watermarks(self, partitions: Iterable[int]) -> dict[int, int]:
        """The first offset each partition still holds; PartitionUnavailableError if not
        answered."""
        lows = {}
        for p, found in self._list_offsets(partitions, latest=False).items():
            if not isinstance(found, int):
                raise self._failure(found, p)
            lows[p] = found
        return lows

    def probe(self, partition: int, start: int, end: int) -> None:
        """PartitionUnavailableError unless [start, end) can be read now; SourceError if Kafka
        deleted part of it (retention) or the partition ends before it."""
        if end <= start:
            return
        self._check_identity()
        low = self.low_watermarks([partition])[partition]
        if low > start:
            raise SourceError(
                f"{self._where(partition)} no longer holds offsets [{start}, {min(low, end)}) "
                "(deleted by retention before they were committed): this batch cannot be "
                "read again; raise the topic's retention.ms, and `tridentflow reset "
                f"{self.pipeline}` to start at what it holds"
            )
        stable = self._list_offsets([partition], latest=True)[partition]
        if isinstance(stable, int) and stable >= end:
            return  # the broker's stable offset is past the range: no need to find the end
        heads, unavailable = self._heads([partition], {})
        if partition in unavailable:
            raise PartitionUnavailableError(partition, unavailable[partition])
        if heads[partition] < end:
            raise PartitionUnavailableError(
                partition, f"at offset {heads[partition]}, before the batch's end {end}"
            )

    # -- read ---------------------------------------------------------------------------------
    def read_raw(self, partition: int, start: int, end: int) -> Iterator[tuple[int, bytes]]:
        """(offset, the record as JSON bytes) for every record a ``read_committed`` consumer
        gets in [start, end), in offset order, the same on every call; returns once the
        consumer's position reached ``end``. PartitionUnavailableError if the broker stops
        answering, SourceError if the partition lost part of the range."""
        from confluent_kafka import KafkaError, TopicPartition

        if end <= start:
            return
        consumer = self._consumer()
        consumer.assign([TopicPartition(self.topic, partition, start)])
        text = self.value_format is KafkaFormat.TEXT
        try:
            # at most the range's records and the end-of-partition event: no wait for more
            for messages in self._batches(consumer, end - start + 1):
                if messages is None:
                    raise PartitionUnavailableError(
                        partition,
                        f"not answering at {self.brokers} within {self.timeout_s:g}s while "
                        f"[{start}, {end}) was read",
                    )
                for m in messages:
                    err = m.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            if m.offset() >= end:
                                return
                            raise SourceError(
                                f"{self._where(partition)} ends at offset {m.offset()}, but "
                                f"[{start}, {end}) must be read (the topic recreated, or "
                                f"an unclean leader election?): `tridentflow reset "
                                f"{self.pipeline}` reads it from what it holds"
                            )
                        if err.code() in (
                            KafkaError.OFFSET_OUT_OF_RANGE,
                            KafkaError._AUTO_OFFSET_RESET,
                        ):
                            raise SourceError(
                                f"{self._where(partition)} no longer holds offset {start} "
                                f"({err.str()}): [{start}, {end}) cannot be read again; "
                                f"`tridentflow reset {self.pipeline}` starts at what it holds"
                            )
                        raise self._failure(err, partition)
                    offset = m.offset()
                    if offset >= end:
                        return
                    value = m.value()
                    yield offset, (_text_record(value) if text else (value or b"null"))
                    if offset == end - 1:
                        return
        finally:
            consumer.unassign()

    def read(self, partition: int, start: int, end: int) -> Iterator[tuple[int, Any]]:
        for offset, raw in self.read_raw(partition, start, end):
            yield offset, json.loads(raw)

    # -- write --------------------------------------------------------------------------------
    def append_spread(self, records: Iterable[Any]) -> dict[int, tuple[int, int]]:
        """Produce records round robin over the topic's partitions (idempotent producer),
        JSON values (or text); every record is checked before anything is sent. partition ->
        (first, last + 1) offset of what was written to it."""
        from confluent_kafka import KafkaException, Producer

        if self.value_format is KafkaFormat.TEXT:
            values = [_text_value(r, f"record {i + 1}") for i, r in enumerate(records)]
        else:
            values = [
                encode_record(r, f"record {i + 1}").encode("utf-8") for i, r in enumerate(records)
            ]
        n = len(self.require().partitions)
        producer = Producer(
            {
                "client.id": CLIENT_ID,
                **self.config,
                "enable.idempotence": True,
                "linger.ms": 20,
                "message.timeout.ms": int(self.timeout_s * 3000),
            },
            logger=_QUIET,
        )
        written: dict[int, list[int]] = {}
        failed: list[str] = []

        def delivered(err: Any, msg: Any) -> None:
            if err is not None:
                failed.append(err.str())
                return
            span = written.setdefault(msg.partition(), [msg.offset(), msg.offset()])
            span[0], span[1] = min(span[0], msg.offset()), max(span[1], msg.offset())

        for i, value in enumerate(values):
            while True:
                try:
                    producer.produce(self.topic, value, partition=i % n, on_delivery=delivered)
                    break
                except BufferError:
                    producer.poll(0.05)
                except KafkaException as exc:
                    raise self._failure(exc.args[0], None) from None
        left = producer.flush(self.timeout_s * 3)
        if left or failed:
            raise SourceError(
                f"{self._where()}: {left + len(failed)} of {len(values)} records not "
                f"acknowledged ({(failed or ['timed out'])[0]}); the others were written"
            )
        return {p: (lo, hi + 1) for p, (lo, hi) in sorted(written.items())}

    def acknowledge(self, committed: dict[int, int]) -> None:
        """Commit the committed offsets to the reader's consumer group (what Kafka's tools
        show as its lag); best effort, and never longer than ``timeout_s``: a sync commit to a
        broker that stopped answering waits on, so it runs in a thread of its own (with a
        consumer of its own) that is left to finish or fail alone."""
        if not committed:
            return
        done = threading.Thread(target=self._commit_offsets, args=(dict(committed),), daemon=True)
        done.start()
        done.join(self.timeout_s)

    def _commit_offsets(self, committed: dict[int, int]) -> None:
        from confluent_kafka import KafkaException, TopicPartition

        other = KafkaLog(self.topic, self.config, self.pipeline, timeout_s=self.timeout_s)
        offsets = [TopicPartition(self.topic, p, o) for p, o in sorted(committed.items())]
        try:
            with contextlib.suppress(KafkaException, RuntimeError):  # the next commit retries
                other._consumer().commit(offsets=offsets, asynchronous=False)
        finally:
            with contextlib.suppress(KafkaException, RuntimeError):
                other.close()

    def produce(
        self,
        pipeline: str,
        lines: list[str],
        asked_partitions: int | None,
        source_partitions: int,
        skip_unavailable: bool = False,
    ) -> Produced:
        """Produce every record round robin over the topic's partitions, creating the topic
        (``asked_partitions``, else the source's) if it is missing; what it did."""
        records = [json.loads(line) for line in lines]
        created = self.create(asked_partitions or source_partitions)
        if asked_partitions and not created and self.partitions() != asked_partitions:
            raise SourceError(
                f"--partitions {asked_partitions}: topic {self.topic} exists with "
                f"{self.partitions()} partitions (tridentflow never repartitions a topic)"
            )
        added = self.append_spread(records)  # every record checked before any is sent
        return Produced(
            len(records),
            f"Kafka topic {self.topic}",
            self.partitions(),
            written=len(added),
            notes=("topic created",) if created else (),
            verb="produced",
        )

    def check_delete(self) -> None:
        """A topic is its producers': ``reset --source`` never deletes it."""
        raise SourceError(
            f"reset --source would delete Kafka topic {self.topic}, which is its producers': "
            "reset without --source starts the pipeline at what the topic holds"
        )

    def rebase(self) -> dict[int, int]:
        """After a reset: the topic id the reader reads from now on, and every partition's
        first held offset (where the reset reader starts)."""
        topic = self.require()
        if self.topic_ids is not None:
            now = self.topic_id()
            if now is not None:
                self.topic_ids.set(now)
        return self.low_watermarks(sorted(topic.partitions))


def _text_record(value: bytes | None) -> bytes:
    """A text record as the JSON string the pipeline decodes; bytes that are not UTF-8 are
    passed on as they are (the decoder quarantines them)."""
    if value is None:
        return b"null"
    try:
        return json.dumps(value.decode("utf-8"), ensure_ascii=False).encode("utf-8")
    except UnicodeDecodeError:
        return value


def _text_value(record: Any, what: str) -> bytes:
    if not isinstance(record, str):
        raise SourceError(f"{what} must be text for a value_format='text' topic")
    encode_record(record, what)  # valid Unicode
    return record.encode("utf-8")


def _quiet_logger() -> logging.Logger:
    """librdkafka's own log lines (connection refused, retries...) stay out of the CLI's
    output: what matters is raised as one line."""
    logger = logging.getLogger("tridentflow.kafka.client")
    logger.propagate = False
    logger.addHandler(logging.NullHandler())
    return logger


_QUIET = _quiet_logger()
