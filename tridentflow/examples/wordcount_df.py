"""The word count written as a DataFrame step and as a SQL step (issue 68).

* ``wordcount-df``: sentences -> ``Stream.spark(explode(split(...)))`` -> group_by(word) ->
  persistent_aggregate(Count) into a transactional state; Spark's own ``groupBy().count()``
  computes each word's partial, tridentflow commits it exactly once.
* ``wordcount-sql``: the same step in Spark SQL over the view ``batch``.

Both count what ``wordcount``'s ``str.split()`` counts: words are runs of non-whitespace.
They need the Spark engine (``--engine spark``); ``--engine local`` refuses them in one line.
"""

from __future__ import annotations

from typing import Any

from tridentflow.aggregators import Count
from tridentflow.nodes import StateSpec
from tridentflow.pipeline import Pipeline
from tridentflow.sources.specs import LogSource, SourceMode
from tridentflow_state.maps import StateKind

SQL = (
    "SELECT word FROM (SELECT explode(split(trim(sentence), '\\\\s+')) AS word FROM batch) "
    "WHERE word <> ''"
)


def words(df: Any) -> Any:
    """Each sentence's words, one row each (deterministic: the transactional state takes it)."""
    from pyspark.sql import functions as F

    exploded = df.select(F.explode(F.split(F.trim("sentence"), r"\s+")).alias("word"))
    return exploded.where(F.col("word") != "")


def _source() -> LogSource:
    return LogSource(
        fields=("sentence",),
        schema="sentence string",
        mode=SourceMode.TRANSACTIONAL,
        partitions=4,
        batch_size=1000,
    )


def _counted(name: str, description: str, step: Any) -> Pipeline:
    pipeline = Pipeline(name, _source(), description=description)
    (
        step(pipeline.stream)
        .group_by("word")
        .persistent_aggregate(
            StateSpec("counts", StateKind.TRANSACTIONAL), Count(), out_field="count"
        )
    )
    return pipeline


def wordcount_df() -> Pipeline:
    return _counted(
        "wordcount-df",
        "word count as a DataFrame step into a transactional state",
        lambda stream: stream.spark(words, schema="word string"),
    )


def wordcount_sql() -> Pipeline:
    return _counted(
        "wordcount-sql",
        "word count as a Spark SQL step into a transactional state",
        lambda stream: stream.sql(SQL, schema="word string"),
    )
