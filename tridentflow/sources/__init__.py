"""Source logs: the interface (``base``), the file log (``filelog``) and Redis Streams
(``redisstream``); ``open_log`` opens either from its locator (what read tasks are given)."""

from __future__ import annotations

from tridentflow.sources.base import SourceLog
from tridentflow.sources.filelog import FileLog
from tridentflow.sources.redisstream import LOCATOR_PREFIX, RedisStreamLog


def open_log(locator: str) -> SourceLog:
    """The log a locator names: a file log's root directory, or a stream log's spec."""
    if locator.startswith(LOCATOR_PREFIX):
        return RedisStreamLog.open(locator)
    return FileLog(locator)


def is_file_log(locator: str) -> bool:
    return not locator.startswith(LOCATOR_PREFIX)
