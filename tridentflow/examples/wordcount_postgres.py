"""``wordcount-postgres``: the word count, its ``counts`` exported to PostgreSQL.

The state's new values (Trident's newValuesStream) feed a PostgresSink writing table
``wordcount_counts`` (columns ``word``, ``count``), one SQL transaction per committed txid. The
DSN: ``TRIDENTFLOW_POSTGRES_DSN`` on the CLI, the Airflow connection ``postgres_default`` under
Airflow. ``tridentflow run wordcount-postgres`` exports after each commit.
"""

from __future__ import annotations

from tridentflow.aggregators import Count
from tridentflow.examples.wordcount import split
from tridentflow.nodes import StateSpec
from tridentflow.pipeline import Pipeline
from tridentflow.sinks import PostgresSink
from tridentflow.sources.specs import LogSource, SourceMode
from tridentflow_state.maps import StateKind

TABLE = "wordcount_counts"


def wordcount_postgres() -> Pipeline:
    source = LogSource(
        fields=("sentence",), mode=SourceMode.TRANSACTIONAL, partitions=4, batch_size=1000
    )
    pipeline = Pipeline(
        "wordcount-postgres",
        source,
        description=f"word count into an opaque state, exported to PostgreSQL table {TABLE}",
    )
    counts = (
        pipeline.stream.each("sentence", split, "word")
        .group_by("word")
        .persistent_aggregate(StateSpec("counts", StateKind.OPAQUE), Count(), out_field="count")
    )
    counts.new_values_stream().sink(PostgresSink(TABLE, conn_id="postgres_default"))
    return pipeline
