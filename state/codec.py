"""Deterministic encodings of group keys and stored values.

Keys: a group key is a tuple of field values; it is encoded as compact JSON of a list, so
``("man",)`` is ``["man"]``, ``(1,)`` and ``(1.0,)`` differ, ``True`` differs from ``1``, and
dict members are sorted. The encoding is a pure function of the value: the same key always
maps to the same Redis field, whichever process computed it.

Values: JSON with int/float preserved (``1`` vs ``1.0``); tuples come back as lists.
"""

from __future__ import annotations

import json
import math
from typing import Any

from state.errors import KeyEncodingError

_SCALARS = (str, int, float, bool, type(None))


def _check_key_part(value: Any, path: str) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise KeyEncodingError(f"group key {path} is {value!r}: NaN/inf have no stable encoding")
    if isinstance(value, _SCALARS):
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_key_part(item, f"{path}[{i}]")
        return
    if isinstance(value, dict):
        for k, item in value.items():
            if not isinstance(k, str):
                raise KeyEncodingError(f"group key {path} has a non-string dict key {k!r}")
            _check_key_part(item, f"{path}.{k}")
        return
    raise KeyEncodingError(
        f"group key {path} is a {type(value).__name__} ({value!r}); use str, int, float, bool,"
        " None, or lists/tuples/dicts of them"
    )


def encode_key(key: tuple[Any, ...] | list[Any]) -> str:
    """Encode a group key (a tuple of field values) deterministically."""
    if not isinstance(key, (tuple, list)):
        raise KeyEncodingError(f"a group key is a tuple of field values, got {key!r}")
    _check_key_part(list(key), "")
    return json.dumps(list(key), separators=(",", ":"), ensure_ascii=False, sort_keys=True)


def _tupled(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_tupled(v) for v in value)
    return value


def decode_key(encoded: str | bytes) -> tuple[Any, ...]:
    """Inverse of encode_key; nested lists come back as tuples (hashable)."""
    if isinstance(encoded, bytes):
        encoded = encoded.decode("utf-8")
    value = json.loads(encoded)
    if not isinstance(value, list):
        raise KeyEncodingError(f"not an encoded group key: {encoded!r}")
    return tuple(_tupled(v) for v in value)


def encode_value(value: Any) -> str:
    """Encode a stored value as JSON (int and float stay distinct)."""
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise KeyEncodingError(f"value {value!r} is not JSON-serialisable: {exc}") from exc


def decode_value(encoded: str | bytes | None) -> Any:
    if encoded is None:
        return None
    if isinstance(encoded, bytes):
        encoded = encoded.decode("utf-8")
    return json.loads(encoded)
