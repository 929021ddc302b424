"""Every error tridentflow raises on purpose, under one base (``TridentflowError``, with
``retry_helps``): the pipeline's definition, sources, batches, sinks, settings, the
operators' commands, the tools. One clear line each. The state layer keeps its own
(``tridentflow_state.errors``: it imports nothing of tridentflow) and the Airflow
integration its own (``tridentflow_airflow.errors``). Not here on purpose: the fault
injector's ``InjectedFaultError`` and ``SimulatedCrash`` (tridentflow.faults), which stand
for foreign failures and a process's death."""

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


class DataFrameStepError(PipelineError):
    """A DataFrame or SQL step (Stream.spark / Stream.sql) broke its contract at emit, before
    any write: its output lacks a declared column or has another type, or it is
    non-deterministic and feeds a transactional state."""


class InvalidNameError(PipelineError, ValueError):
    """A pipeline, state or namespace name that cannot name Redis keys (still a ValueError,
    as it was before it became one of tridentflow's one-line errors)."""


class SourceError(TridentflowError):
    """The source log is missing, malformed, or a range cannot be read."""


class NotConfiguredError(SourceError):
    """The pipeline lacks a setting it needs (its message says which, and where to give it):
    it is not configured, which is not a failure - the view shows it as such, and the metrics
    report ``tridentflow_configured`` 0 instead of ``tridentflow_up`` 0."""

    retry_helps = False


class FileOverwrittenError(SourceError):
    """A file a FileSource took was overwritten since (``on_overwrite="fail"``): only a
    person can choose - put the original back, or take it again - so it is not retried."""

    retry_helps = False


class PartitionUnavailableError(SourceError):
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


class TooManyBadRecordsError(TridentflowError):
    """A batch has more quarantined records than the pipeline allows: it fails, visibly."""


# Refusals of an operator's command (nothing was changed)


class ReshardRefusedError(TridentflowError):
    """A reshard that cannot apply as asked: nothing was changed."""

    retry_helps = False


class EvolveRefusedError(TridentflowError):
    """An evolution step that cannot apply as asked: nothing was changed."""

    retry_helps = False


class RewindRefusedError(TridentflowError):
    """A rewind that would lose or duplicate something outside Redis: nothing was changed."""


# Settings


class SettingsConflictError(TridentflowError):
    """The environment variable and the platform's configuration disagree."""

    retry_helps = False


class SettingsDisagreeError(TridentflowError):
    """This process's settings differ from the ones recorded with the pipeline."""


class StateShapeChangedError(SettingsDisagreeError):
    """The code makes a state's values another way than the one that made the stored values
    (another kind, aggregator or key fields): refused before anything is written; retrying
    cannot help (an Airflow task fails at once)."""

    retry_helps = False


class StateEvolvingError(SettingsDisagreeError):
    """A state of this code is being renamed or migrated (``tridentflow evolve``): the
    commit writes nothing now and succeeds when retried after it."""


# Sinks


class SinkError(TridentflowError):
    """A sink could not apply a txid (one line: which sink, which txid, why, what to do)."""


class SinkRefusedError(SinkError):
    """A sink refuses what it was given - a value its table cannot hold, a table another
    writer wrote, columns that are not the stream's: running the export again, unchanged,
    is refused the same way, so an orchestrator fails the task at once (one line, its fix)
    instead of retrying it."""

    retry_helps = False


class ReloadNeededError(SinkError):
    """A sink cannot apply a txid from its rows alone, but can from the whole state: what it
    holds does not reach the txid before (a table not created yet, the txids before having
    written nothing it could type), or the txid's values need a wider column than the
    table's (a DeltaSink widens a column by rewriting the table). The export then reloads it,
    as for a change log that is gone."""


# Steps, tools and the test harness


class RunNotBoundError(TridentflowError):
    """The run has no txid, or lost it to another run."""


class TimedOutError(TridentflowError):
    """A read that did not finish within the deadline (it may still be running)."""


class FaultSpecError(TridentflowError, ValueError):
    """A fault specification (``TF_FAULTS``, ``--fault``) that does not parse."""

    retry_helps = False


class TestingError(TridentflowError):
    """A run of ``run_batches`` cannot go on: bad input, or a record your code fails on."""

    __test__ = False  # not a pytest test class


class PortTakenError(TridentflowError):
    """Another redis-server answers on the port a new one was to listen on."""


PartitionUnavailable = PartitionUnavailableError
"""The name before 0.x, kept for sources of your own that raise it."""


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
