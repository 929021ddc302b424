"""Seed 002's user-score pipeline, and a per-user score sum in an opaque state.

Seed 002 (Storm):

    topology.newStream("spout1", spout)
        .partitionBy(new Fields("user"))
        .partitionAggregate(new Fields("user", "score", "batchId"),
                            new OriginUserCountAggregator(), new Fields("result", "aggBatchId"))
        .parallelismHint(3)
        .global()
        .aggregate(new Fields("result", "aggBatchId"), new AggAgg(), new Fields("agg"))
        .each(new Fields("agg"), new PrintEachFunc(), new Fields());

Here: the batch's tuples are partitioned by user over 3 partitions, each partition counts its
users into ``{txid: {user: count}}`` (a full Aggregator, told the txid by ``init``), all
partial maps go to one partition and are merged by a Combiner; the merged map of each batch is
kept in the ``per_batch`` state under its txid (Trident printed it). Its first batch of
``[nickt1, 1], [nickt2, 1], [nickt3, 1]`` gives ``{nickt1: 1, nickt2: 1, nickt3: 1}``.

``score_sum`` sums each user's scores into an opaque state (group_by + persistent_aggregate).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from tridentflow.aggregators import Aggregator, BatchInfo, Combiner, Sum
from tridentflow.nodes import StateSpec
from tridentflow.pipeline import Pipeline
from tridentflow.sources.specs import LogSource, SourceMode
from tridentflow_state.maps import StateKind

SEED_BATCH = [["nickt1", 1], ["nickt2", 1], ["nickt3", 1]]


class OriginUserCountAggregator(Aggregator):
    """Per partition: ``{txid: {user: number of tuples}}`` and the txid it belongs to."""

    def init(self, batch: BatchInfo) -> dict[str, Any]:
        return {"txid": batch.txid, "users": {}}

    def aggregate(self, acc: dict[str, Any], user: str, score: Any) -> dict[str, Any]:
        acc["users"][user] = acc["users"].get(user, 0) + 1
        return acc

    def complete(self, acc: dict[str, Any]) -> Iterator[tuple[Any, ...]]:
        yield ({str(acc["txid"]): acc["users"]}, acc["txid"])


class AggAgg(Combiner):
    """Merges ``{txid: {user: count}}`` maps, adding counts."""

    def init(self, result: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
        return result

    def combine(self, a: dict, b: dict) -> dict:
        merged = {batch: dict(users) for batch, users in a.items()}
        for batch, users in b.items():
            into = merged.setdefault(batch, {})
            for user, count in users.items():
                into[user] = into.get(user, 0) + count
        return merged

    def zero(self) -> dict:
        return {}


def batches_of(agg: dict[str, dict[str, int]]) -> Iterator[tuple[int, dict[str, int]]]:
    """One (txid, {user: count}) tuple per batch in the merged map."""
    for batch, users in sorted(agg.items()):
        yield (int(batch), dict(sorted(users.items())))


def keep_latest(current: Any, tuples: list[tuple[Any, ...]]) -> Any:
    """A state updater: the key's value becomes the batch's last value."""
    return tuples[-1][0] if tuples else current


def user_scores() -> Pipeline:
    pipeline = Pipeline(
        "user-scores",
        LogSource(fields=("user", "score"), mode=SourceMode.TRANSACTIONAL, partitions=2),
        description="seed 002: partition by user, per-partition counts, global merge",
    )
    (
        pipeline.stream.partition_by("user")
        .partition_aggregate(
            ["user", "score"], OriginUserCountAggregator(), ["result", "agg_batch_id"]
        )
        .parallelism_hint(3)
        .global_()
        .aggregate("result", AggAgg(), "agg")
        .each("agg", batches_of, ["txid", "users"])
        .partition_persist(
            StateSpec("per_batch", StateKind.OPAQUE),
            keep_latest,
            key_fields="txid",
            in_fields="users",
        )
    )
    pipeline.stream.group_by("user").persistent_aggregate(
        StateSpec("score_sum", StateKind.OPAQUE), Sum(), in_fields="score", out_field="sum"
    )
    return pipeline
