"""Source logs: the interface (``base``), the file log (``filelog``), Redis Streams
(``redisstream``) and Kafka (``kafka``); ``open_log`` opens any of them from its locator (what
read tasks are given). A locator is a path (the file log), a string starting with a prefix
registered by ``register_locator`` (the built-in streams and Kafka register theirs below, as a
log of yours may), or ``custom_locator``'s."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from tridentflow.errors import SourceError
from tridentflow.sources.base import SourceLog
from tridentflow.sources.delta import LOCATOR_PREFIX as DELTA_PREFIX
from tridentflow.sources.delta import DeltaLog
from tridentflow.sources.filelog import FileLog
from tridentflow.sources.files import LOCATOR_PREFIX as FILES_PREFIX
from tridentflow.sources.files import FilesLog
from tridentflow.sources.iceberg import LOCATOR_PREFIX as ICEBERG_PREFIX
from tridentflow.sources.iceberg import IcebergLog
from tridentflow.sources.kafka import LOCATOR_PREFIX as KAFKA_PREFIX
from tridentflow.sources.kafka import KafkaLog
from tridentflow.sources.loading import import_ref
from tridentflow.sources.redisstream import LOCATOR_PREFIX, RedisStreamLog

CUSTOM_PREFIX = "python:"
"""A locator of a log of your own: ``python:`` + JSON {"opener": "module:function", "spec"}."""


def custom_locator(opener: str, spec: Any) -> str:
    """The locator of a log of your own: read tasks call ``opener`` (``module:function``, a
    function of ``spec``, a JSON value) to open it. What its ``root`` returns."""
    import_ref(opener)  # fail here, in one line, rather than on an executor
    return CUSTOM_PREFIX + json.dumps({"opener": opener, "spec": spec}, sort_keys=True)


LOCATORS: dict[str, Callable[[str], SourceLog]] = {}
"""Locator prefix -> the function that opens a log from a locator with that prefix."""


def register_locator(prefix: str, opener: Callable[[str], SourceLog]) -> None:
    """Read tasks open a locator starting with ``prefix`` with ``opener(locator)``. A prefix
    is registered once (two kinds of log cannot share one)."""
    if not prefix or LOCATORS.get(prefix, opener) is not opener:
        raise SourceError(f"locator prefix {prefix!r} is empty or registered already")
    LOCATORS[prefix] = opener


def _open_custom(locator: str) -> SourceLog:
    found = json.loads(locator[len(CUSTOM_PREFIX) :])
    return import_ref(found["opener"])(found["spec"])


register_locator(CUSTOM_PREFIX, _open_custom)
register_locator(LOCATOR_PREFIX, RedisStreamLog.open)
register_locator(KAFKA_PREFIX, KafkaLog.open)
register_locator(FILES_PREFIX, FilesLog.open)
register_locator(DELTA_PREFIX, DeltaLog.open)
register_locator(ICEBERG_PREFIX, IcebergLog.open)


def open_log(locator: str) -> SourceLog:
    """The log a locator names: one of a registered prefix, else a file log's root
    directory."""
    for prefix, opener in LOCATORS.items():
        if locator.startswith(prefix):
            return opener(locator)
    return FileLog(locator)


def is_file_log(locator: str) -> bool:
    """Whether ``locator`` names a file log (a path: no registered prefix)."""
    return not locator.startswith(tuple(LOCATORS))
