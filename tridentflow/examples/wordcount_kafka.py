"""``wordcount-kafka``: the word count, reading Kafka topic ``wordcount`` (4 partitions).

The brokers: ``TRIDENTFLOW_KAFKA_BOOTSTRAP`` on the CLI, the Airflow connection
``kafka_default`` under Airflow. Records are JSON (``{"sentence": "..."}`` or a JSON string);
``tridentflow produce wordcount-kafka FILE`` creates the topic if it is missing. A txid reads
a fixed offset range of every partition (transactional): a replay reads exactly that range.
"""

from __future__ import annotations

from tridentflow.aggregators import Count
from tridentflow.examples.wordcount import split
from tridentflow.nodes import StateSpec
from tridentflow.pipeline import Pipeline
from tridentflow.sources.specs import KafkaSource, SourceMode
from tridentflow_state.maps import StateKind

TOPIC = "wordcount"


def wordcount_kafka(mode: SourceMode = SourceMode.TRANSACTIONAL) -> Pipeline:
    source = KafkaSource(
        fields=("sentence",), mode=mode, partitions=4, batch_size=10_000, topic=TOPIC
    )
    opaque = mode is SourceMode.OPAQUE
    pipeline = Pipeline(
        "wordcount-kafka-opaque" if opaque else "wordcount-kafka",
        source,
        description=f"word count of Kafka topic {TOPIC} ({mode.value}) into an opaque state",
    )
    (
        pipeline.stream.each("sentence", split, "word")
        .group_by("word")
        .persistent_aggregate(StateSpec("counts", StateKind.OPAQUE), Count(), out_field="count")
    )
    return pipeline


def wordcount_kafka_opaque() -> Pipeline:
    """The same, opaque: a broker that does not answer is skipped and caught up later."""
    return wordcount_kafka(SourceMode.OPAQUE)
