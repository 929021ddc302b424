"""``wordcount-delta``: the word count, its ``counts`` exported to a Delta Lake table.

The state's new values feed a DeltaSink (delta-rs: no JVM), one Delta commit per committed txid
stamped with it (a ``txn`` action): the table ``TRIDENTFLOW_DELTA_TABLE`` names (a path or an
object store URI), else ``HOME/lake/wordcount_counts`` (HOME: the ``home`` setting, else
~/.tridentflow). Columns ``word``, ``count``, ``txid``. Needs ``tridentflow[delta]``.
"""

from __future__ import annotations

import os
from pathlib import Path

from tridentflow.aggregators import Count
from tridentflow.examples.wordcount import split
from tridentflow.nodes import StateSpec
from tridentflow.pipeline import Pipeline
from tridentflow.settings import explicit_setting
from tridentflow.sinks import DeltaSink
from tridentflow.sources.specs import LogSource, SourceMode
from tridentflow_state.maps import StateKind

TABLE_ENV = "TRIDENTFLOW_DELTA_TABLE"


def table_uri() -> str:
    """Where the example's table lives (TRIDENTFLOW_DELTA_TABLE, else under the home)."""
    if os.environ.get(TABLE_ENV):
        return os.environ[TABLE_ENV]
    home = explicit_setting("TRIDENTFLOW_HOME") or str(Path.home() / ".tridentflow")
    return str(Path(home).expanduser() / "lake" / "wordcount_counts")


def wordcount_delta() -> Pipeline:
    source = LogSource(
        fields=("sentence",), mode=SourceMode.TRANSACTIONAL, partitions=4, batch_size=1000
    )
    uri = table_uri()
    pipeline = Pipeline(
        "wordcount-delta",
        source,
        description=f"word count into an opaque state, exported to the Delta table {uri}",
    )
    counts = (
        pipeline.stream.each("sentence", split, "word")
        .group_by("word")
        .persistent_aggregate(StateSpec("counts", StateKind.OPAQUE), Count(), out_field="count")
    )
    counts.new_values_stream().sink(DeltaSink(uri, name="delta-counts"))
    return pipeline
