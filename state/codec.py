"""Deterministic encodings of group keys and stored values.

Keys: a group key is a tuple of field values; it is encoded as compact JSON of a list, so
``("man",)`` is ``["man"]``, ``(1,)`` and ``(1.0,)`` differ, ``True`` differs from ``1``, and
dict members are sorted. The encoding is a pure function of the value: the same key always
maps to the same Redis field, whichever process computed it.

The key encoding is injective on values as JSON sees them: ``0.0`` and ``-0.0``, ``1``,
``1.0`` and ``True`` are five different keys even though Python compares some of them equal.
Strings must be valid Unicode (a lone surrogate such as ``"\\ud800"`` cannot be written to
Redis or a UTF-8 file) and floats finite; anything else raises KeyEncodingError.

Values: JSON with int/float preserved (``1`` vs ``1.0``); tuples come back as lists.
``private`` gives user code a value it may mutate without touching anyone else's copy.
"""

from __future__ import annotations

import copy
import json
import math
from json.encoder import encode_basestring as _encode_json_str  # C; what dumps uses here
from typing import Any

from tridentflow_state.errors import KeyEncodingError, StoredValueError

_SCALARS = (str, int, float, bool, type(None))
IMMUTABLE = frozenset(_SCALARS)
"""Exact types ``private`` returns as they are."""


def _check_key_part(value: Any, path: str) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise KeyEncodingError(f"group key {path} is {value!r}: NaN/inf have no stable encoding")
    if isinstance(value, str):
        check_unicode(value, f"group key {path}")
        return
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


def check_unicode(text: str, what: str) -> None:
    """Refuse a string that is not valid Unicode (a lone surrogate): it has no UTF-8 form."""
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = text[exc.start : exc.end]
        raise KeyEncodingError(
            f"{what} holds a lone surrogate {bad.encode('unicode_escape').decode()!r} at index "
            f"{exc.start}: not valid Unicode (a cut emoji?)"
        ) from None


def encode_key(key: tuple[Any, ...] | list[Any]) -> str:
    """Encode a group key (a tuple of field values) deterministically."""
    if isinstance(key, (tuple, list)) and len(key) == 1 and type(key[0]) is str:
        return encode_str_key(key[0])  # the common case, ~15x faster; the same encoding
    if not isinstance(key, (tuple, list)):
        raise KeyEncodingError(f"a group key is a tuple of field values, got {key!r}")
    _check_key_part(list(key), "")
    return json.dumps(list(key), separators=(",", ":"), ensure_ascii=False, sort_keys=True)


def encode_str_key(text: str) -> str:
    """``encode_key((text,))`` for a key of one str (compact JSON, non-ASCII kept): json's own
    C string encoder, without the general path's walk."""
    check_unicode(text, "group key [0]")
    return "[" + _encode_json_str(text) + "]"


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
    return tuple_key(value)


def tuple_key(value: list[Any]) -> tuple[Any, ...]:
    """A decoded key's JSON list as the key tuple (nested lists as tuples)."""
    if all(not isinstance(v, list) for v in value):
        return tuple(value)
    return tuple(_tupled(v) for v in value)


def encode_value(value: Any) -> str:
    """Encode a stored value as JSON (int and float stay distinct); the text is valid UTF-8."""
    try:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except ValueError as exc:
        if "Out of range float" in str(exc):
            raise KeyEncodingError(
                f"value {value!r:.200} holds NaN or an infinity: a state never stores one (an "
                "aggregate that overflowed a float? fix the function, or quarantine such records)"
            ) from exc
        raise KeyEncodingError(f"value {value!r:.200} is not JSON-serialisable: {exc}") from exc
    except TypeError as exc:
        raise KeyEncodingError(f"value {value!r:.200} is not JSON-serialisable: {exc}") from exc
    check_unicode(text, f"value {value!r:.200}")
    return text


def private(value: Any) -> Any:
    """A copy of a JSON-like value that shares no mutable part with ``value``.

    Scalars (immutable) are returned as they are, so numeric states pay one type check; lists,
    dicts and tuples are copied recursively. Given to user code (Combiner.combine, Reducer.reduce,
    StateUpdater.update) wherever the original is still referenced elsewhere.
    """
    kind = type(value)
    if kind is list:
        return [private(v) for v in value]
    if kind is dict:
        return {k: private(v) for k, v in value.items()}
    if kind is tuple:
        return tuple(private(v) for v in value)
    if kind in IMMUTABLE:
        return value
    return copy.deepcopy(value)


def private_args(values: tuple[Any, ...]) -> tuple[Any, ...]:
    """``values`` as they are if all are immutable (the common case: one type check each),
    else a private copy of each."""
    for v in values:
        if type(v) not in IMMUTABLE:
            return tuple(private(x) for x in values)
    return values


def decode_value(encoded: str | bytes | None) -> Any:
    """Inverse of encode_value; StoredValueError if it is not JSON."""
    if encoded is None:
        return None
    try:
        if isinstance(encoded, bytes):
            encoded = encoded.decode("utf-8")
        return json.loads(encoded)
    except ValueError as exc:
        raise StoredValueError(
            f"found {encoded!r:.80}, which is not JSON ({exc}); was it written by something "
            "other than tridentflow?"
        ) from None


def live_stamp(raw: str) -> int | None:
    """The txid stamp of a stored ``[txid,curr,prev]`` (its compact JSON text) whose curr is
    not null; None for a tombstone or a value without a stamp. Reads the text's head only."""
    if not raw.startswith("["):
        return None
    head, _, rest = raw[1:].partition(",")
    if not head.isdigit() or rest.startswith("null,"):
        return None
    return int(head)
