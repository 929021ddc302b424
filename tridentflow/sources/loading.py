"""Importing a ``module:attribute`` reference a source names (a log function of yours, a
locator's opener): one-line SourceError if it cannot be imported or is not callable."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from tridentflow.errors import SourceError


def import_ref(ref: str) -> Callable[..., Any]:
    module_name, _, attr = ref.partition(":")
    try:
        found = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise SourceError(f"cannot import source log function {ref!r}: {exc}") from None
    if not callable(found):
        raise SourceError(f"source log function {ref!r} is not callable")
    return found
