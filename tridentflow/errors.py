"""Errors of the engine (pipeline definition, sources, batches). One clear line each."""

from __future__ import annotations


class TridentflowError(Exception):
    """Base class of errors the CLI reports as a single line."""


class PipelineError(TridentflowError):
    """The pipeline definition is invalid or its semantics are refused."""


class SourceError(TridentflowError):
    """The source log is missing, malformed, or a range cannot be read."""


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


class StateUpdateError(TridentflowError):
    """A persisted aggregator or updater failed on a key at commit: the txid is not committed,
    and its retry replays safely (the failure repeats until the code or the input is fixed)."""


class StagingValueError(TridentflowError):
    """A value to stage cannot be written as JSON (an aggregator returned e.g. a set)."""


class TooManyBadRecords(TridentflowError):
    """A batch has more quarantined records than the pipeline allows: it fails, visibly."""
