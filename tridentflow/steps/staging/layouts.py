"""Where a batch staged in Redis lies once ``tridentflow reshard`` moved the state: a manifest
names the layout its blocks were written in (``"layout": [shards, layout]``), which is the
pipeline's current one unless a reshard ran between the emit and the commit. Reads only."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from tridentflow_state.keys import KeySpace
from tridentflow_state.staged import BlockSpace

LAYOUT = "layout"
"""The manifest's field: [shards, layout] of the keyspace its blocks lie in."""


def layout_field(keyspace: KeySpace) -> list[int]:
    """What a manifest records of the layout it stages in."""
    return [keyspace.shards, keyspace.layout]


def staged_layout(current: KeySpace, manifest: dict[str, Any]) -> KeySpace:
    """The keyspace an attempt's blocks lie in: the layout its manifest names, else (a
    manifest from before layouts were recorded) ``current``."""
    if LAYOUT not in manifest:
        return current
    shards, layout = (int(n) for n in manifest[LAYOUT])
    if (shards, layout) == (current.shards, current.layout):
        return current
    return replace(current, shards=shards, layout=layout)


def staged_space(
    current: KeySpace, generation: str, txid: int, attempt: int, manifest: dict[str, Any]
) -> BlockSpace:
    """The block space of one attempt, in the layout its manifest names."""
    return BlockSpace(staged_layout(current, manifest), generation, int(txid), int(attempt))


def staged_layouts(current: KeySpace, manifests: Iterable[dict[str, Any]]) -> list[KeySpace]:
    """``current`` and every other layout one of ``manifests`` was staged in."""
    spaces = {(current.shards, current.layout): current}
    for manifest in manifests:
        space = staged_layout(current, manifest)
        spaces.setdefault((space.shards, space.layout), space)
    return list(spaces.values())


def same_layout(one: KeySpace, other: KeySpace) -> bool:
    return (one.shards, one.layout) == (other.shards, other.layout)
