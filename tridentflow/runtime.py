"""Everything a step needs to run one pipeline: Redis, the ledger, the source log, staging."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import redis

from state.keys import KeySpace
from state.ledger import Ledger
from state.redis_backing import RedisBackingMap
from tridentflow.errors import PartitionUnavailable, TridentflowError
from tridentflow.faults import FaultPlan
from tridentflow.filelog import FileLog, LogScan
from tridentflow.pipeline import Pipeline
from tridentflow.plan import Plan, compile_pipeline
from tridentflow.staging import StagingArea

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
REDIS_URL_ENV = "TRIDENTFLOW_REDIS_URL"
HOME_ENV = "TRIDENTFLOW_HOME"


def resolve_redis_url(explicit: str | None = None) -> str:
    return explicit or os.environ.get(REDIS_URL_ENV) or DEFAULT_REDIS_URL


def resolve_home(explicit: str | os.PathLike[str] | None = None) -> Path:
    raw = explicit or os.environ.get(HOME_ENV) or Path.home() / ".tridentflow"
    return Path(raw).expanduser().resolve()


def redacted(url: str) -> str:
    """The URL without its password, for messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urlunsplit(parts._replace(netloc=netloc))


def connect(url: str) -> redis.Redis:
    """A Redis client for ``url``, checked with PING; a clear error if unreachable."""
    try:
        client = redis.Redis.from_url(
            url, socket_connect_timeout=5, socket_timeout=60, health_check_interval=30
        )
        client.ping()
    except (redis.ConnectionError, redis.TimeoutError, ValueError) as exc:
        raise TridentflowError(f"cannot reach Redis at {redacted(url)}: {exc}") from None
    except redis.AuthenticationError as exc:
        raise TridentflowError(f"Redis at {redacted(url)} refused the login: {exc}") from None
    return client


@dataclass
class Runtime:
    pipeline: Pipeline
    client: redis.Redis
    home: Path
    faults: FaultPlan = field(default_factory=FaultPlan)
    url: str | None = None
    """The Redis URL ``client`` was opened with (rebuilt from the client if not given)."""

    @classmethod
    def open(
        cls,
        pipeline: Pipeline,
        redis_url: str | None = None,
        home: str | os.PathLike[str] | None = None,
        faults: FaultPlan | None = None,
    ) -> Runtime:
        return cls(
            pipeline.validate(),
            connect(resolve_redis_url(redis_url)),
            resolve_home(home),
            faults if faults is not None else FaultPlan.from_env(),
            resolve_redis_url(redis_url),
        )

    @property
    def redis_url(self) -> str:
        """A URL for other processes (Spark executors running a state query) to connect."""
        if self.url:
            return self.url
        kw = self.client.connection_pool.connection_kwargs
        auth = f":{kw['password']}@" if kw.get("password") else ""
        if kw.get("path"):
            return f"unix://{auth}{kw['path']}?db={kw.get('db', 0)}"
        return (
            f"redis://{auth}{kw.get('host', '127.0.0.1')}:{kw.get('port', 6379)}/{kw.get('db', 0)}"
        )

    @cached_property
    def plan(self) -> Plan:
        return compile_pipeline(self.pipeline)

    @cached_property
    def ledger(self) -> Ledger:
        return Ledger(self.client, self.pipeline.name)

    @property
    def keyspace(self) -> KeySpace:
        return self.ledger.keys

    @cached_property
    def log(self) -> FileLog:
        return FileLog(self.home / "sources" / self.pipeline.name)

    @property
    def staging_root(self) -> Path:
        """Staging of every generation of this pipeline."""
        return self.home / "staging" / self.pipeline.name

    @cached_property
    def staging(self) -> StagingArea:
        """Staging of this runtime's generation: an emit still running from before a reset
        can never write over (or be read as) a new generation's attempt."""
        return StagingArea(self.staging_root / f"g-{self.ledger.generation}")

    def source_scan(self) -> LogScan:
        """Every partition's head, or why it cannot be read; creates the log (or grows it to
        source.partitions) first. An unavailable partition is never recreated."""
        current = self.log.partitions() if self.log.exists() else 0
        if current < self.pipeline.source.partitions:
            self.log.ensure(self.pipeline.source.partitions)
        return self.log.scan()

    def source_heads(self) -> dict[int, int]:
        """Head offset of every partition (PartitionUnavailable if one cannot be read)."""
        scan = self.source_scan()
        if scan.unavailable:
            partition, reason = min(scan.unavailable.items())
            raise PartitionUnavailable(partition, reason)
        return scan.heads

    def backing(self, state_name: str) -> RedisBackingMap:
        return RedisBackingMap(self.client, self.keyspace, state_name)
