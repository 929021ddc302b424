"""The few names that moved between the supported Airflow lines (3.1 - 3.3), found once here.

Airflow 3.2 moved the Task SDK's exceptions, its Stats and its plugin/listener loading under
``airflow.sdk``; 3.1 has them in ``airflow``. Everything else tridentflow uses is the same on
every supported line (docs/install.md). Each lookup is the newest location first, so a
deprecation shim of an old location is never what answers on a new Airflow.
"""

from __future__ import annotations

from typing import Any

try:  # Airflow >= 3.2
    from airflow.sdk.exceptions import AirflowFailException, AirflowNotFoundException
except ImportError:  # Airflow 3.1
    from airflow.exceptions import (  # type: ignore[no-redef]
        AirflowFailException,
        AirflowNotFoundException,
    )

__all__ = [
    "AirflowFailException",
    "AirflowNotFoundException",
    "airflow_stats",
    "doubling_backoff",
    "load_listeners_and_macros",
]


def doubling_backoff() -> float | bool:
    """``retry_exponential_backoff`` that doubles the delay at each retry: the multiplier 2.0
    on Airflow >= 3.2 (where True would be the multiplier 1, no backoff at all), True on 3.1
    (a bool there, always doubling)."""
    from airflow.sdk.bases.operator import BASEOPERATOR_ARGS_EXPECTED_TYPES

    return True if BASEOPERATOR_ARGS_EXPECTED_TYPES["retry_exponential_backoff"] is bool else 2.0


def airflow_stats() -> Any:
    """Airflow's metrics client (StatsD / OpenTelemetry, whichever the deployment set up)."""
    try:  # Airflow >= 3.2
        from airflow.sdk.observability.stats import Stats
    except ImportError:  # Airflow 3.1
        from airflow.stats import Stats  # type: ignore[no-redef]
    return Stats


def load_listeners_and_macros() -> None:
    """Load the plugins' listeners and macros, as Airflow's task runner does for each task."""
    try:  # Airflow >= 3.2
        from airflow.sdk.listener import get_listener_manager
        from airflow.sdk.plugins_manager import integrate_macros_plugins
    except ImportError:  # Airflow 3.1
        from airflow.listeners.listener import get_listener_manager  # type: ignore[no-redef]
        from airflow.plugins_manager import integrate_macros_plugins  # type: ignore[no-redef]
    get_listener_manager()
    integrate_macros_plugins()
