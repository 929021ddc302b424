"""Executors staging a state's (key, staged value) pairs as blocks in Redis themselves
(``TRIDENTFLOW_STAGING=redis``, a big batch): what the Spark engine's tasks run, on RDDs and
on DataFrames alike. Runs on Spark executors."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from tridentflow.engines.base import staged_json
from tridentflow.redisconn import connect
from tridentflow_state.staged import BlockRef, BlockSpace, BlockWriter

_EXECUTOR_CLIENTS: dict[str, Any] = {}
"""One Redis client per URL in each Python worker (Spark reuses workers between tasks)."""


def write_state_blocks(
    redis_url: str,
    space: BlockSpace,
    names: list[str],
    pairs: Iterable[tuple[int, tuple[str, Any]]],
) -> Iterator[tuple[int, list[BlockRef]]]:
    """(state index, its block refs) after writing this task's (state index, (key, staged
    value)) pairs as blocks (``tridentflow_state.staged.BlockWriter``). Block names carry the
    state, the Spark partition and the task attempt: a retried or speculative task never
    overwrites another attempt's blocks, and only the refs of the attempt Spark kept reach
    the manifest."""
    from pyspark import TaskContext

    task = TaskContext.get()
    where = f"{task.partitionId()}.{task.attemptNumber()}" if task else "0.0"
    client = _EXECUTOR_CLIENTS.get(redis_url)
    if client is None:
        client = _EXECUTOR_CLIENTS[redis_url] = connect(redis_url)
    writers: dict[int, tuple[BlockWriter, str]] = {}
    for index, (key, value) in pairs:
        found = writers.get(index)
        if found is None:
            writer = BlockWriter(client, space, f"{names[index]}.{where}")
            found = writers[index] = (writer, f"state {names[index]}")
        found[0].add(key, staged_json(value, found[1]))
    for index, (writer, _what) in writers.items():
        yield index, writer.close()
