"""Static state (Trident's newStaticState): read-only reference data that ``state_query`` can
look keys up in, to join a stream against it (e.g. TridentReach's followers and tweeters).

Two stores:

* ``RedisHashLookup(key)``: one Redis hash the user fills (``HSET key field value``); a
  one-field key is looked up by its value as text (``"US"``, ``"42"``, ``"true"``), a
  compound key by its JSON array (``'["ann",3]'``); values are JSON (``values="json"``, the
  default) or taken as they are (``values="text"``). Read from the executors with the
  pipeline's Redis URL.
* ``FileLookup(path)``: a JSON object file ``{key: value}``, keys as above, loaded once per
  process (again when the file changes). Every executor must see it at that path.

Static means tridentflow never writes it and does not version it: a query answers what the
store holds when the batch runs, so a replay can see other values if the data changed in
between. A state fed by a static lookup is therefore held to the state-query rule: opaque,
not transactional (pipeline._persist). An ACL user needs read access to the hash
(``%R~KEY``) beyond its pipeline's keys.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tridentflow.errors import PipelineError, SourceError
from tridentflow_state.codec import private

QUERY_CHUNK = 1000
VALUE_KINDS = ("json", "text")


def lookup_field(key: tuple[Any, ...]) -> str:
    """The field or JSON key a group key is looked up by: a one-field key by its value as
    text (a str as it is, any other scalar as JSON: ``42``, ``1.0``, ``true``, ``null``, so
    the int 1 and the str "1" read the same field, as text fields do), anything else by its
    JSON array."""
    if len(key) == 1 and not isinstance(key[0], (list, tuple, dict)):
        return key[0] if isinstance(key[0], str) else json.dumps(key[0])
    return json.dumps(list(key), separators=(",", ":"), ensure_ascii=False)


def _decode(raw: Any, values: str, where: str, field: str = "") -> Any:
    if raw is None:
        return None
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError:
        raise SourceError(
            f"static state {where}: the value of {field!r} is not UTF-8 ({raw[:40]!r}): store "
            "it as UTF-8 text"
        ) from None
    if values == "text":
        return text
    try:
        return json.loads(text)
    except ValueError:
        raise SourceError(
            f"static state {where}: value {text[:80]!r} is not JSON (use values='text' for "
            "plain strings)"
        ) from None


@dataclass(frozen=True)
class RedisHashLookup:
    key: str
    values: str = "json"

    def __post_init__(self) -> None:
        if not self.key:
            raise PipelineError("RedisHashLookup needs the name of a Redis hash")
        if self.values not in VALUE_KINDS:
            raise PipelineError(f"values must be one of {VALUE_KINDS}, got {self.values!r}")

    def get(self, redis_url: str, fields: Sequence[str]) -> list[Any]:
        from tridentflow.redisconn import connect

        client = connect(redis_url)
        try:
            out: list[Any] = []
            for i in range(0, len(fields), QUERY_CHUNK):
                chunk = list(fields[i : i + QUERY_CHUNK])
                raw = client.hmget(self.key, chunk)
                where = f"hash {self.key}"
                out.extend(
                    _decode(r, self.values, where, f) for r, f in zip(raw, chunk, strict=True)
                )
            return out
        finally:
            client.close()


_FILES: dict[str, tuple[float, dict[str, Any]]] = {}


@dataclass(frozen=True)
class FileLookup:
    path: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", str(Path(self.path).expanduser().resolve()))

    def get(self, redis_url: str, fields: Sequence[str]) -> list[Any]:
        table = self._table()
        return [table.get(f) for f in fields]

    def _table(self) -> dict[str, Any]:
        try:
            mtime = os.stat(self.path).st_mtime
        except OSError as exc:
            raise SourceError(
                f"static state file {self.path} cannot be read here: {exc.strerror} (every "
                "Spark worker must see it at that path)"
            ) from None
        cached = _FILES.get(self.path)
        if cached is None or cached[0] != mtime:
            try:
                table = json.loads(Path(self.path).read_text(encoding="utf-8"))
            except ValueError as exc:
                raise SourceError(f"static state file {self.path} is not JSON: {exc}") from None
            if not isinstance(table, dict):
                raise SourceError(f"static state file {self.path} is not a JSON object")
            cached = _FILES[self.path] = (mtime, table)
        return cached[1]


Lookup = RedisHashLookup | FileLookup


@dataclass(frozen=True)
class StaticState:
    """A read-only state for ``state_query`` (see the module doc); made by
    ``Pipeline.static_state(name, lookup)``."""

    name: str
    lookup: Lookup


@dataclass(frozen=True)
class StaticQuery:
    """The per-partition lookup: each tuple with the static value at its key (None if absent),
    one round trip per partition and QUERY_CHUNK distinct keys."""

    redis_url: str
    lookup: Lookup
    key_idx: tuple[int, ...]

    def __call__(self, partition: int, rows: Iterable[tuple]) -> list[tuple]:
        rows = list(rows)
        if not rows:
            return []
        fields = [lookup_field(tuple(row[i] for i in self.key_idx)) for row in rows]
        distinct = list(dict.fromkeys(fields))
        found = dict(zip(distinct, self.lookup.get(self.redis_url, distinct), strict=True))
        # private copies: a user function that mutates one tuple's value touches no other
        return [(*row, private(found[f])) for row, f in zip(rows, fields, strict=True)]
