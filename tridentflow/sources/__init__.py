"""Source logs: the interface (``base``), the file log (``filelog``), Redis Streams
(``redisstream``) and Kafka (``kafka``); ``open_log`` opens any of them from its locator (what
read tasks are given)."""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from typing import Any

from tridentflow.errors import SourceError
from tridentflow.sources.base import SourceLog
from tridentflow.sources.filelog import FileLog
from tridentflow.sources.kafka import LOCATOR_PREFIX as KAFKA_PREFIX
from tridentflow.sources.kafka import KafkaLog
from tridentflow.sources.redisstream import LOCATOR_PREFIX, RedisStreamLog
from tridentflow.sources.specs import CustomSource

CUSTOM_PREFIX = "python:"
"""A locator of a log of your own: ``python:`` + JSON {"opener": "module:function", "spec"}."""


def custom_locator(opener: str, spec: Any) -> str:
    """The locator of a log of your own: read tasks call ``opener`` (``module:function``, a
    function of ``spec``, a JSON value) to open it. What its ``root`` returns."""
    _import(opener)  # fail here, in one line, rather than on an executor
    return CUSTOM_PREFIX + json.dumps({"opener": opener, "spec": spec}, sort_keys=True)


def _import(ref: str) -> Callable[..., Any]:
    module_name, _, attr = ref.partition(":")
    try:
        found = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise SourceError(f"cannot import source log function {ref!r}: {exc}") from None
    if not callable(found):
        raise SourceError(f"source log function {ref!r} is not callable")
    return found


def build_custom_log(source: CustomSource, pipeline: str) -> SourceLog:
    """The log a CustomSource's ``log`` function builds for ``pipeline``."""
    return _import(source.log)(source, pipeline)


def open_log(locator: str) -> SourceLog:
    """The log a locator names: a file log's root directory, a stream or Kafka log's spec, or
    a log of your own (``custom_locator``)."""
    if locator.startswith(CUSTOM_PREFIX):
        found = json.loads(locator[len(CUSTOM_PREFIX) :])
        return _import(found["opener"])(found["spec"])
    if locator.startswith(LOCATOR_PREFIX):
        return RedisStreamLog.open(locator)
    if locator.startswith(KAFKA_PREFIX):
        return KafkaLog.open(locator)
    return FileLog(locator)


def is_file_log(locator: str) -> bool:
    return not locator.startswith((LOCATOR_PREFIX, KAFKA_PREFIX, CUSTOM_PREFIX))
