"""Errors of the Airflow integration (one line each, as the engine's)."""

from __future__ import annotations

from tridentflow.errors import TridentflowError


class MissingConnectionError(TridentflowError):
    """An Airflow connection the pipeline names is not defined (Admin > Connections)."""


class OutOfOrderWaitError(TridentflowError):
    """The earlier run did not bind within ORDER_WAIT_S: the coordinator's try fails and its
    retry looks again."""


class EmitFailedError(TridentflowError):
    """The emit job failed; the message is its one-line cause."""
