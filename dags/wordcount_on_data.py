"""The word count when data arrives: a run as soon as records past the committed offsets appear
in the source (an asset watcher in Airflow's triggerer polls the ledger and the source's heads),
none while it is quiet.

The same pipeline as ``tridentflow_wordcount_continuous`` (@continuous): run one of the two.
Created paused: unpause it in the UI, then append records (``tridentflow produce``).
"""

from __future__ import annotations

from tridentflow_airflow import pipeline_dag

dag = pipeline_dag(
    "wordcount-opaque",
    dag_id="tridentflow_wordcount_on_data",
    schedule="on-data",
    paused=True,
    # a backlog drains in txids of at most this many records per partition; the watcher fires
    # again after each commit while records wait, so nothing is left behind
    batch_size=100_000,
)
