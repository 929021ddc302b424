"""The word count back to back (@continuous): a new txid as soon as the previous run ends.

Created paused: unpause it in the UI to start the loop.
"""

from __future__ import annotations

from tridentflow_airflow import pipeline_dag

dag = pipeline_dag(
    "wordcount-opaque",
    dag_id="tridentflow_wordcount_continuous",
    schedule="@continuous",
    paused=True,
    batch_size=25_000,  # per partition: 100k records per txid amortize each run's scheduling
)
