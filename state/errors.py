"""Errors raised by the state layer. Each names the pipeline/txid it concerns."""

from __future__ import annotations


class StateError(Exception):
    """Base class of every error the state layer raises on purpose (the engine's are
    ``tridentflow.errors.TridentflowError``; the state layer imports nothing of it)."""

    retry_helps = True
    """Whether running the step again, unchanged, may succeed (a race, a reshard under way):
    as ``TridentflowError.retry_helps``."""


class StaleTxidError(StateError):
    """A batch is behind the state: its txid is older than the txid stored with a key."""


class CommitOrderError(StateError):
    """Txid N tried to commit while the ledger does not stand at N-1."""


class FencedError(StateError):
    """A commit attempt was superseded by a newer attempt of the same txid (a zombie)."""


class MetadataError(StateError):
    """Batch metadata is missing, malformed, or does not survive a JSON round trip."""


class GenerationError(StateError):
    """A step started before the pipeline was reset (or Redis lost its data): refused, so
    nothing of an old run lands in the fresh pipeline."""


class PipelineBusyError(StateError):
    """A reset was refused: a run holds a live lease on a pending txid (use --force)."""


class RewindingError(StateError):
    """A read was refused: a rewind is under way (tridentflow_state.rewind), so the state is
    no committed txid's until it finishes."""


class RewindError(StateError):
    """A rewind was refused: its target is not retained or not committed, or another
    rewind is under way (tridentflow_state.rewind)."""


class CommitsHeldError(StateError):
    """A reader holds commits back for a moment (state.shards.query_state); ``ms`` left."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.ms = int(message.split()[0]) if message.split() else 0


class RetryError(StateError):
    """The ledger moved while a script ran; the caller retries (never surfaces)."""


class StoredValueError(StateError):
    """A value stored in Redis is not what tridentflow writes (``[txid, curr, prev]`` JSON)."""


class StagedBlockError(StateError):
    """A block of a batch staged in Redis is missing or not what its manifest says (torn,
    expired, overwritten): the batch must not commit; emit it again."""


class KeyEncodingError(StateError, TypeError):
    """A group key holds a value that has no deterministic encoding."""

    retry_helps = False


# Lua scripts report errors with these prefixes; from_lua_error() maps them back.
LUA_ERROR_PREFIXES: dict[str, type[StateError]] = {
    "TFORDER": CommitOrderError,
    "TFFENCED": FencedError,
    "TFSTALE": StaleTxidError,
    "TFMETA": MetadataError,
    "TFGENERATION": GenerationError,
    "TFBUSY": PipelineBusyError,
    "TFREWINDING": RewindingError,
    "TFREWIND": RewindError,
    "TFRETRY": RetryError,
    "TFHELD": CommitsHeldError,
    "TFBLOCK": StagedBlockError,
}


def from_lua_error(message: str) -> StateError | None:
    """Return the StateError a Lua error message stands for, or None if it is not ours."""
    text = message.strip()
    for prefix, cls in LUA_ERROR_PREFIXES.items():
        if text.startswith(prefix):
            return cls(text[len(prefix) :].strip())
    return None


class ReshardUnderWayError(StateError):
    """``tridentflow reshard`` is moving the pipeline's state to another shard layout: a
    commit writes nothing now and succeeds when retried after it (state.reshard)."""


class LayoutMovedError(StateError):
    """A reader's keyspace names a shard layout a reshard has moved the state from: read
    again with the stored one (``query_state`` does)."""
