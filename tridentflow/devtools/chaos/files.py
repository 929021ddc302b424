"""The chaos harness's file and table pipelines: a FileSource and a DeltaSource under every
fault (issue 69).

The word count over JSON-lines files in a landing directory of the schedule's own: each of
the harness's appends is one file ``produce`` renames in whole, a txid takes at most two files
(``batch_size``), and every fault, Redis restart or loss, rewind and reset of the other
families meets the manifest of taken files. The same over a Delta table of the schedule's
own: each append is one table version (``DeltaLog.produce``), a txid reads at most two. The
checks are the word count's: every word counted exactly once.
"""

from __future__ import annotations

from pathlib import Path

from tridentflow.aggregators import Count
from tridentflow.examples.wordcount import split
from tridentflow.nodes import StateSpec
from tridentflow.pipeline import Pipeline
from tridentflow.sources.specs import DeltaSource, FileSource, SourceMode
from tridentflow_state.maps import StateKind

FILES_PIPELINE = "tridentflow.devtools.chaos.files:files_wordcount"
"""The pipeline, as the harness loads it (its landing directory set per schedule)."""
FILES_NAME = "chaos-files"
FILES_DF_PIPELINE = "tridentflow.devtools.chaos.files:files_df_wordcount"
"""The same over Parquet files, counted by a SQL step (Spark: ``--remote``): its files read in
columns (tridentflow.engines.columnar)."""
FILES_DF_NAME = "chaos-files-df"
DELTA_PIPELINE = "tridentflow.devtools.chaos.files:delta_wordcount"
"""The table pipeline, as the harness loads it (its table set per schedule)."""
DELTA_NAME = "chaos-delta"


def files_wordcount(landing: str = "landing") -> Pipeline:
    """The word count of the JSON-lines files under ``landing`` (transactional: a replay
    reads the files its txid froze), into an opaque and a transactional state."""
    source = FileSource(fields=("sentence",), uri=landing, format="json", min_age_s=0,
                        batch_size=2, mode=SourceMode.TRANSACTIONAL)  # fmt: skip
    pipeline = Pipeline(FILES_NAME, source, description="word count of files in a directory")
    words = pipeline.stream.each("sentence", split, "word").group_by("word")
    words.persistent_aggregate(StateSpec("counts", StateKind.OPAQUE), Count(), out_field="count")
    words.persistent_aggregate(StateSpec("seen", StateKind.TRANSACTIONAL), Count(), out_field="n")
    return pipeline


def files_df_wordcount(landing: str = "landing") -> Pipeline:
    """The word count of the Parquet files under ``landing`` (each append one file ``produce``
    writes), its words split by a SQL step; an opaque and a transactional state."""
    from tridentflow.examples.wordcount_df import SQL

    source = FileSource(fields=("sentence",), schema="sentence string", uri=landing,
                        format="parquet", min_age_s=0, batch_size=2)  # fmt: skip
    pipeline = Pipeline(FILES_DF_NAME, source, description="word count of Parquet files, in SQL")
    words = pipeline.stream.sql(SQL, schema="word string").group_by("word")
    words.persistent_aggregate(StateSpec("counts", StateKind.OPAQUE), Count(), out_field="count")
    words.persistent_aggregate(StateSpec("seen", StateKind.TRANSACTIONAL), Count(), out_field="n")
    return pipeline


def delta_wordcount(table: str = "table") -> Pipeline:
    """The word count of the appends to the Delta table at ``table``, one version each
    (transactional: a replay reads the versions its txid froze)."""
    source = DeltaSource(fields=("sentence",), uri=table, batch_size=2)
    pipeline = Pipeline(DELTA_NAME, source, description="word count of a Delta table's appends")
    words = pipeline.stream.each("sentence", split, "word").group_by("word")
    words.persistent_aggregate(StateSpec("counts", StateKind.OPAQUE), Count(), out_field="count")
    words.persistent_aggregate(StateSpec("seen", StateKind.TRANSACTIONAL), Count(), out_field="n")
    return pipeline


def create_sentences_table(uri: Path) -> None:
    """An empty Delta table of sentences at ``uri`` (version 0), unless one is there."""
    import pyarrow as pa
    from deltalake import DeltaTable

    if not DeltaTable.is_deltatable(str(uri)):
        DeltaTable.create(str(uri), schema=pa.schema([("sentence", pa.string())]))
