"""Everything a step needs to run one pipeline: Redis, the ledger, the source log, staging."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import redis

from tridentflow.connections import NONE, Connections
from tridentflow.errors import (
    InvalidNameError,
    PartitionUnavailableError,
    ReplicationError,
    TridentflowError,
)
from tridentflow.faults import FaultPlan
from tridentflow.pipeline import Pipeline
from tridentflow.plan import Plan, compile_pipeline
from tridentflow.redisconn import (  # noqa: F401 (re-exported: the names steps import)
    DEFAULT_REDIS_URL,
    REDIS_URL_ENV,
    connect,
    redacted,
    redis_user,
    resolve_redis_url,
    url_of,
)
from tridentflow.settings import env_int, explicit_setting, raw_setting, source_of
from tridentflow.sources.base import Grows, ListsOnScan, LogScan, SourceContext, SourceLog
from tridentflow.steps.staging import (
    DEFAULT_STAGING,
    STAGING_ENV,
    STAGING_KINDS,
    FileStagingArea,
    RedisStagingArea,
    StagingArea,
)
from tridentflow_state.keys import KeySpace, check_name, check_shards
from tridentflow_state.ledger import Ledger
from tridentflow_state.redis_backing import RedisBackingMap
from tridentflow_state.replication import wait_for_replicas_of
from tridentflow_state.shards import ShardedRedisBackingMap, check_layout, stored_layout

log = logging.getLogger(__name__)
HOME_ENV = "TRIDENTFLOW_HOME"
NAMESPACE_ENV = "TRIDENTFLOW_NAMESPACE"
SHARDS_ENV = "TRIDENTFLOW_STATE_SHARDS"
FROM_COMMAND_LINE = "the command line"
FROM_CODE = "the pipeline's code"
FROM_DEFAULT = "default"
"""Where a process's own setting comes from (else the environment variable's name): a value
from the command line or the code is a decision (tridentflow.steps.recorded_settings)."""
RETAIN_ENV = "TRIDENTFLOW_RETAIN_TXIDS"


def resolve_home(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The home (source logs, staging): ``explicit``, else TRIDENTFLOW_HOME, else
    ~/.tridentflow. TridentflowError (one line) if it exists and is not a directory."""
    raw = explicit or explicit_setting(HOME_ENV) or Path.home() / ".tridentflow"
    home = Path(raw).expanduser().resolve()
    if home.exists() and not home.is_dir():
        raise TridentflowError(
            f"the tridentflow home {home} (--home or {HOME_ENV}) is a file, not a directory: "
            "point it at a directory"
        )
    return home


def resolve_namespace(explicit: str | None = None) -> str:
    """The deployment's key namespace: ``explicit``, else TRIDENTFLOW_NAMESPACE, else none.
    TridentflowError (one line) if it is not a valid name."""
    namespace = explicit if explicit is not None else explicit_setting(NAMESPACE_ENV) or ""
    if namespace:
        try:
            check_name("namespace", namespace)
        except ValueError as exc:
            raise InvalidNameError(f"{exc} (--namespace or {NAMESPACE_ENV})") from None
    return namespace


def check_access(client: redis.Redis, keyspace: KeySpace, url: str) -> None:
    """A clear one-line error, before anything is written, if the Redis user may not touch
    this pipeline's keys (an ACL user limited to other pipelines)."""
    try:
        client.hget(keyspace.ledger, "committed")
    except redis.exceptions.NoPermissionError as exc:
        raise TridentflowError(
            f"Redis user {redis_user(url)!r} has no permission on the keys of pipeline "
            f"{keyspace.pipeline!r} ({keyspace.acl_pattern}): {exc}; "
            f"`tridentflow acl {keyspace.pipeline}` prints the ACL rules it needs"
        ) from None


@dataclass(frozen=True)
class Runtime:
    """What one process's steps run with: the pipeline, its Redis, its home, its faults and
    settings. Never changed once built (frozen): a process that needs others builds another
    runtime (``with_``); what it derives (ledger, log, staging) is cached per runtime."""

    pipeline: Pipeline
    client: redis.Redis
    home: Path
    faults: FaultPlan = field(default_factory=FaultPlan)
    url: str | None = None
    """The Redis URL ``client`` was opened with (rebuilt from the client if not given)."""
    namespace: str = field(default_factory=resolve_namespace)
    """The deployment's key namespace (TRIDENTFLOW_NAMESPACE; see state.keys.KeySpace)."""
    replicas: int = field(default_factory=lambda: env_int("TRIDENTFLOW_WAIT_REPLICAS", 0))
    """Replicas that must acknowledge a commit mark before the commit step succeeds (Redis
    WAIT; 0: do not wait). See committer.confirm_replicated."""
    replica_timeout_ms: int = field(
        default_factory=lambda: env_int("TRIDENTFLOW_WAIT_TIMEOUT_MS", 5000)
    )
    shards: int | None = None
    """State shards to write with, over the pipeline's ``state_shards`` and the environment
    (see ``state_shards``)."""
    retain: int | None = None
    """Txids of undo logs to keep, over the pipeline's ``retain_txids`` and the environment
    (``run --retain-txids``; see ``retain_txids``)."""
    connections: Connections = NONE
    """The deployment's named connections, for a source or sink that names none of its own
    (under Airflow: Airflow's, which the operators and the view pass; tridentflow.connections)."""
    in_redis_ops: bool = True
    """Whether the commit applies the built-in numeric combiners inside Redis (committer
    ``IN_REDIS_OPS``); benchmarks turn it off to compare with the Python path."""
    staging_kind: str | None = None
    """Where this process's emits stage (``files`` | ``redis``); None: the ``staging``
    setting (TRIDENTFLOW_STAGING, or ``[tridentflow] staging``), else ``redis``. A commit reads
    an attempt wherever it was staged (``staging_of``)."""
    batch_clock: Callable[[int], int] | None = None
    """txid -> the ms the coordinator freezes as its batch time (expiry in time): tests and
    the chaos harness give each txid its own; None: Redis's clock (TIME), never this host's."""

    @classmethod
    def open(
        cls,
        pipeline: Pipeline,
        redis_url: str | None = None,
        home: str | os.PathLike[str] | None = None,
        faults: FaultPlan | None = None,
        namespace: str | None = None,
        redis_ca: str | None = None,
        connections: Connections = NONE,
        replicas: int | None = None,
        retain: int | None = None,
    ) -> Runtime:
        """Connect and check that the Redis user may touch this pipeline's keys.
        ``replicas`` None: TRIDENTFLOW_WAIT_REPLICAS (see the field)."""
        url = resolve_redis_url(redis_url, redis_ca)
        chosen = {} if replicas is None else {"replicas": replicas}
        rt = cls(
            pipeline.validate(),
            connect(url),
            resolve_home(home),
            faults if faults is not None else FaultPlan.from_env(),
            url,
            resolve_namespace(namespace),
            connections=connections,
            retain=retain,
            **chosen,
        )
        check_access(rt.client, KeySpace(rt.pipeline.name, rt.namespace), url)
        return rt

    def with_(self, **changes: Any) -> Runtime:
        """Another process's runtime: these fields changed (faults, staging_kind, retain, ...),
        the same Redis client; nothing cached by this one carries over."""
        return replace(self, **changes)

    @property
    def redis_url(self) -> str:
        """A URL for other processes (Spark executors running a state query) to connect."""
        return self.url or url_of(self.client)

    @cached_property
    def plan(self) -> Plan:
        return compile_pipeline(self.pipeline)

    @property
    def state_shards(self) -> int:
        """The shard count this run writes state with: the pipeline's ``state_shards``, else
        TRIDENTFLOW_STATE_SHARDS, else 1 (the commit refuses it if the stored state has
        another; see tridentflow_state.shards.ensure_shards)."""
        if self.shards is not None:
            return check_shards(self.shards)
        if self.pipeline.state_shards is not None:
            return self.pipeline.state_shards
        shards = env_int(SHARDS_ENV, 1)
        try:
            return check_shards(shards)
        except ValueError as exc:
            raise TridentflowError(f"{SHARDS_ENV}: {exc}") from None

    @property
    def asked_shards(self) -> int | None:
        """The shard count this run asks for - the command line, the pipeline's
        ``state_shards`` or TRIDENTFLOW_STATE_SHARDS - or None if nothing asks (then the
        stored count wins: one ``tridentflow reshard`` set)."""
        if (
            self.shards is None
            and self.pipeline.state_shards is None
            and not explicit_setting(SHARDS_ENV)
        ):
            return None
        return self.state_shards

    def own_retain_txids(self) -> tuple[int, str]:
        """This process's own retain_txids and where it comes from (FROM_*): ``retain`` (the
        command line), else the pipeline's ``retain_txids``, else TRIDENTFLOW_RETAIN_TXIDS,
        else 0."""
        if self.retain is not None:
            return self.retain, FROM_COMMAND_LINE
        if self.pipeline.retain_txids is not None:
            return self.pipeline.retain_txids, FROM_CODE
        if explicit_setting(RETAIN_ENV):
            return env_int(RETAIN_ENV, 0), source_of(RETAIN_ENV)
        return 0, FROM_DEFAULT

    @property
    def retain_txids(self) -> int:
        """Committed txids whose undo logs the commit keeps: this process's own value where
        it comes from the command line or the pipeline's code, else the value recorded with
        the pipeline in Redis, else TRIDENTFLOW_RETAIN_TXIDS, else 0 (off); see
        tridentflow.steps.recorded_settings."""
        own, source = self.own_retain_txids()
        if source in (FROM_COMMAND_LINE, FROM_CODE):
            return own
        recorded = self.ledger.settings().get("retain_txids")
        return int(recorded) if recorded is not None and recorded.isdigit() else own

    @cached_property
    def ledger(self) -> Ledger:
        """The ledger, with the keyspace of the stored state's shard count (the configured
        one while nothing is stored)."""
        base = KeySpace(self.pipeline.name, self.namespace)
        configured = self.state_shards
        shards, layout = stored_layout(self.client, base) or (configured, 0)
        return Ledger(
            self.client,
            self.pipeline.name,
            namespace=self.namespace,
            shards=shards,
            reset_shards=configured,
            layout=layout,
        )

    @property
    def keyspace(self) -> KeySpace:
        return self.ledger.keys

    @property
    def source_context(self) -> SourceContext:
        """What the pipeline's source may use to open its log."""
        return SourceContext(
            self.pipeline.name,
            self.home,
            self.namespace,
            self.client,
            self.redis_url,
            self.keyspace,
            self.connections,
        )

    @cached_property
    def log(self) -> SourceLog:
        """The pipeline's source log, as its source opens it (``open_log``)."""
        return self.pipeline.source.open_log(self.source_context)

    @property
    def staging_root(self) -> Path:
        """Staging of every generation of this pipeline."""
        return self.home / "staging" / self.pipeline.name

    @cached_property
    def staging(self) -> StagingArea:
        """Where this process's emits stage (the ``staging`` setting: ``redis``, the default,
        or ``files`` under the home), in this runtime's generation: an emit still running from
        before a reset can never write over (or be read as) a new generation's attempt."""
        return self.redis_staging if self.staging_choice() == "redis" else self.file_staging

    def staging_choice(self) -> str:
        """``redis`` or ``files``: this runtime's ``staging_kind``, else the ``staging``
        setting (TridentflowError, one line, for anything else)."""
        kind = (self.staging_kind or raw_setting(STAGING_ENV) or DEFAULT_STAGING).lower()
        if kind not in STAGING_KINDS:
            raise TridentflowError(
                f"{source_of(STAGING_ENV)}={kind!r} is not a staging kind: use one of "
                + ", ".join(STAGING_KINDS)
            )
        return kind

    @cached_property
    def file_staging(self) -> FileStagingArea:
        return FileStagingArea(self.staging_root / f"g-{self.ledger.generation}")

    @cached_property
    def redis_staging(self) -> RedisStagingArea:
        return RedisStagingArea(self.client, self.keyspace, self.ledger.generation)

    def follow_generation(self) -> None:
        """After this runtime reset or rewound its pipeline: what it cached of the generation
        before (its staging areas, the ledger's pin) goes, so its next steps stage and read in
        the pipeline's new generation."""
        for cached in ("ledger", "staging", "file_staging", "redis_staging"):
            self.__dict__.pop(cached, None)

    def staging_areas(self) -> tuple[StagingArea, ...]:
        """Every place an emit may have staged, whatever this process's setting."""
        return (self.file_staging, self.redis_staging)

    def staging_of(self, txid: int, attempt: int) -> StagingArea:
        """Where emit ``attempt`` of ``txid`` staged: Redis if its manifest is there, else the
        files - so a commit reads what an emit staged whatever this process's setting."""
        redis_area = self.redis_staging
        return redis_area if redis_area.holds(txid, attempt) else self.file_staging

    def discard_staged(self, txid: int) -> None:
        """Delete every staged attempt of a committed ``txid``, files and Redis (idempotent)."""
        for area in self.staging_areas():
            area.discard(txid)

    def discard_staged_before(self, txid: int) -> None:
        """After ``txid`` committed: what commits of earlier txids cut short after their marks
        left, in every area (each says how far it looks)."""
        for area in self.staging_areas():
            area.discard_before(txid)

    def discard_attempts(self, txid: int, attempts: Iterable[int]) -> None:
        """Delete abandoned emit ``attempts`` of ``txid`` wherever they staged, files and
        Redis (idempotent). Best effort: a failure is logged - the attempt's commit or its
        txid's next emit deletes it - and never hides the error the step fails with."""
        wanted = sorted(set(attempts))
        if not wanted:
            return
        try:
            for area in self.staging_areas():
                area.discard_attempts(txid, wanted)
        except Exception as exc:
            log.warning("txid %s: staging of abandoned attempt(s) %s left: %s", txid, wanted, exc)

    def source_scan(self) -> LogScan:
        """Every partition's head, or why it cannot be read; creates the log (or grows it to
        source.partitions) first. An unavailable partition is never recreated. A Kafka topic
        is not created here (SourceError if it is missing): it is the producers'."""
        if not isinstance(self.log, Grows):  # the producers' log (Kafka): never created by it
            return self.log.scan(self.ledger.committed_offsets())
        current = self.log.partitions() if self.log.exists() else 0
        if current < self.pipeline.source.partitions:
            self.log.ensure(self.pipeline.source.partitions)
        return self.log.scan()

    def known_scan(self) -> LogScan:
        """``source_scan``, but a log that lists a store on a scan (a FileSource) answers from
        what it already took, without listing it again (an emit, a look-ahead)."""
        if isinstance(self.log, ListsOnScan):
            return self.log.taken()
        return self.source_scan()

    def batch_scan(self, starts: dict[int, int], size: int) -> LogScan:
        """The scan a coordinator freezes a batch of ``size`` per partition from, past
        ``starts``: ``source_scan``, except that a log that lists a store (ListsOnScan) is not
        listed while what it already took holds more than that batch in every partition. A
        listing takes every file it finds, appending to the manifest, so the batch is the same
        files either way, and one listing serves the txids of a backlog (a listing comes again
        when the manifest runs short: new files, overwrites and ``forget_after`` are seen
        then). More than a batch, not a batch: a txid reaching the manifest's head is followed
        by a listing, so a driver's look-ahead (``_nothing_after``) never stops on a stale
        manifest."""
        if isinstance(self.log, ListsOnScan):
            known = self.log.taken()
            partitions = self.pipeline.source.partitions
            if (
                not known.unavailable
                and len(known.heads) == partitions
                and all(head - starts.get(p, 0) > size for p, head in known.heads.items())
            ):
                return known
        return self.source_scan()

    def source_heads(self) -> dict[int, int]:
        """Head offset of every partition (PartitionUnavailableError if one cannot be read)."""
        scan = self.source_scan()
        if scan.unavailable:
            partition, reason = min(scan.unavailable.items())
            raise PartitionUnavailableError(partition, reason)
        return scan.heads

    def redis_now_ms(self) -> int:
        """Redis's clock, in ms (leases are set and compared by it, never by this host's)."""
        seconds, micros = self.client.time()
        return int(seconds) * 1000 + int(micros) // 1000

    def require_replicated(
        self, what: str, then: str, shards: bool = False, also: KeySpace | None = None
    ) -> None:
        """With ``replicas`` > 0: ReplicationError (one line: ``what``, the count, ``then``)
        unless that many replicas of the ledger's master (and, with ``shards``, of every
        state shard's master) acknowledged everything it executed so far. Nothing may build
        on a write a failover could still undo: a txid's metadata before it is emitted,
        txid-1's mark before txid writes any state, a reset before its source is deleted.
        ``also``: another layout whose shard masters must acknowledge too (a reset's old one)."""
        if self.replicas <= 0:
            return
        keys = [self.keyspace.ledger]
        for ks in (self.keyspace, also):
            if shards and ks is not None and ks.sharded:
                keys += [ks.shard(i).ledger for i in range(ks.shards)]
        for node, _key, acked in wait_for_replicas_of(
            self.client, keys, self.replicas, self.replica_timeout_ms
        ):
            if acked < self.replicas:
                raise ReplicationError(
                    f"{what} is on Redis master {node} but only {acked} of {self.replicas} "
                    f"replica(s) acknowledged it within {self.replica_timeout_ms} ms: {then}"
                )

    def check_layout(self) -> None:
        """StateError (one line) if the state is stored in another shard count than this run
        writes with: a run checks this before it binds a txid (the commit checks it again)."""
        check_layout(self.client, self.keyspace, self.asked_shards)

    def backing(self, state_name: str) -> RedisBackingMap | ShardedRedisBackingMap:
        if self.keyspace.sharded:
            return ShardedRedisBackingMap(self.client, self.keyspace, state_name)
        return RedisBackingMap(self.client, self.keyspace, state_name)
