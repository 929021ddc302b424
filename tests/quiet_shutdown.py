"""A pytest plugin (loaded by tests/conftest.py): the last screen of a test run is its summary.

Airflow's logging setup, imported by the Airflow tests, gives the root logger handlers that
write to the streams pytest captured; those are closed when pytest ends, and py4j (Spark's
gateway) logs from its exit handlers after that: every such record printed
``--- Logging error --- ValueError: I/O operation on closed file`` and a traceback below the
summary. Handlers bound to such streams are taken off every logger when pytest unconfigures,
before any exit handler runs."""

from __future__ import annotations

import logging
import sys


def _real(stream: object) -> bool:
    return stream in (sys.__stdout__, sys.__stderr__)


def detach_capture_handlers() -> int:
    """Remove every StreamHandler whose stream is not the process's own stdout/stderr."""
    removed = 0
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    for logger in loggers:
        for handler in list(getattr(logger, "handlers", ())):
            console = isinstance(handler, logging.StreamHandler) and not isinstance(
                handler, logging.FileHandler
            )
            if console and not _real(handler.stream):
                logger.removeHandler(handler)
                removed += 1
    return removed


def pytest_unconfigure(config) -> None:
    detach_capture_handlers()
