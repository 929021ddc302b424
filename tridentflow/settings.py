"""Numbers read from the environment, each checked: a value that is not one is a one-line
error naming the variable, never a traceback and never silently replaced by the default."""

from __future__ import annotations

import os

from tridentflow.errors import TridentflowError


def env_int(name: str, default: int) -> int:
    """A whole number >= 0 from ``name`` (``default`` when unset or empty)."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise TridentflowError(f"{name} must be a whole number >= 0, got {raw!r}")
    return value


def env_seconds(name: str, default: float, allow_zero: bool = False) -> float:
    """A number of seconds from ``name`` (``default`` when unset or empty): > 0, or >= 0 with
    ``allow_zero``."""
    raw = os.environ.get(name, "").strip()
    try:
        value = float(raw) if raw else default
    except ValueError:
        value = -1.0
    if not (value >= 0 if allow_zero else value > 0):
        bound = ">= 0" if allow_zero else "> 0"
        raise TridentflowError(f"{name} must be a number of seconds {bound}, got {raw!r}")
    return value
