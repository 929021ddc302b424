"""Errors of the engine (pipeline definition, sources, batches). One clear line each."""

from __future__ import annotations

import re

NON_FINITE = (
    "a number that is not finite (NaN, Infinity, or beyond ±1.8e308): JSON has no such "
    "number and no state may hold one; write null or a string"
)
"""Why a record, a staged partial or a stored value holding NaN or an infinity is refused."""


class TridentflowError(Exception):
    """Base class of errors the CLI reports as a single line."""

    retry_helps = True
    """Whether running the step again, unchanged, may succeed (an outage, a race). False for
    what only a person can fix - a pipeline that does not import, a setting that is missing:
    an orchestrator fails the task at once instead of retrying it for minutes."""


class PipelineError(TridentflowError):
    """The pipeline definition is invalid or its semantics are refused."""

    retry_helps = False


class InvalidNameError(PipelineError, ValueError):
    """A pipeline, state or namespace name that cannot name Redis keys (still a ValueError,
    as it was before it became one of tridentflow's one-line errors)."""


class SourceError(TridentflowError):
    """The source log is missing, malformed, or a range cannot be read."""


class NotConfigured(SourceError):
    """The pipeline lacks a setting it needs (its message says which, and where to give it):
    it is not configured, which is not a failure - the view shows it as such, and the metrics
    report ``tridentflow_configured`` 0 instead of ``tridentflow_up`` 0."""

    retry_helps = False


class FileOverwrittenError(SourceError):
    """A file a FileSource took was overwritten since (``on_overwrite="fail"``): only a
    person can choose - put the original back, or take it again - so it is not retried."""

    retry_helps = False


class PartitionUnavailable(SourceError):
    """A partition cannot be read right now (a dark partition)."""

    def __init__(self, partition: int, reason: str = "unreadable") -> None:
        super().__init__(f"partition {partition} is {reason}")
        self.partition = partition
        self.reason = reason


class BadRecordError(SourceError):
    """A record cannot be turned into a tuple of the source's fields."""


class NotReadyError(TridentflowError):
    """A step cannot run yet (an earlier txid must be coordinated or committed first)."""


class IncompleteBatchError(TridentflowError):
    """Staged output is missing or disagrees with its record counts: it must not commit."""


class ReplicationError(TridentflowError):
    """A commit is on the Redis master, but fewer replicas than asked acknowledged it."""


class StateUpdateError(TridentflowError):
    """A persisted aggregator or updater failed on a key at commit: the txid is not committed,
    and its retry replays safely (the failure repeats until the code or the input is fixed)."""


class StagingValueError(TridentflowError):
    """A value to stage cannot be written as JSON (an aggregator returned e.g. a set)."""


class TooManyBadRecords(TridentflowError):
    """A batch has more quarantined records than the pipeline allows: it fails, visibly."""


_EXCEPTION_LINE = re.compile(
    r"^([A-Za-z_][\w.]*(?:Error|Exception|Unavailable|Fault|Exit|Interrupt)\b.*)$"
)


REDIS_OOM = "command not allowed when used memory > 'maxmemory'"
"""What Redis answers a write over its ``maxmemory`` (policy ``noeviction``)."""
OUT_OF_MEMORY = (
    "Redis is out of memory (used_memory over maxmemory, policy noeviction): the txid is not "
    "committed (what its step wrote is its retry's to redo or roll back); free memory or raise "
    "maxmemory (sizing: docs/redis.md), then retry - the txid replays exactly"
)


def one_line(exc: BaseException) -> str:
    """An error as one line that names its cause.

    Spark wraps a Python exception raised in a task in pages of JVM and Python traces whose
    first line says only "An exception was thrown from the Python worker": the line returned
    is then the Python exception itself (``ValueError: bad word``), found after the last
    ``Traceback``. Redis errors are prefixed ``Redis:``; others give their first line.
    """
    text = str(exc).strip()
    module = type(exc).__module__
    if REDIS_OOM in text:  # Redis's own, or a Spark task's that wrote to it
        return OUT_OF_MEMORY
    if module.startswith(("py4j", "pyspark")):
        cause = _python_cause(text)
        return f"Spark task failed: {cause}" if cause else f"Spark: {_first(text, exc)}"
    if module.startswith("grpc"):  # a Connect client's raw gRPC error (a _MultiThreadedRendezvous)
        try:
            code, details = exc.code().name, exc.details()  # type: ignore[attr-defined]
        except Exception:
            code, details = type(exc).__name__, text
        return f"Spark Connect: {code}: {_first(details or '', exc)}"
    if module.startswith("redis"):
        if type(exc).__name__ == "NoPermissionError":
            return (
                f"Redis refused this user (ACL): {_first(text, exc)}; "
                "`tridentflow acl PIPELINE` prints the rules tridentflow needs"
            )
        return f"Redis: {type(exc).__name__}: {_first(text, exc)}"
    return _first(text, exc)


def _first(text: str, exc: BaseException) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[0].strip() if lines else type(exc).__name__


def _python_cause(text: str) -> str | None:
    lines = text.splitlines()
    # classic Spark starts the line with it; Spark Connect prefixes "[PYTHON_EXCEPTION] ..."
    starts = [i for i, line in enumerate(lines) if "Traceback (most recent call last)" in line]
    if not starts:
        return None
    for line in lines[starts[-1] + 1 :]:
        if line and not line[0].isspace() and _EXCEPTION_LINE.match(line):
            return line.strip()
    return None
