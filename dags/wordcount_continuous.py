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
    # at most this many per partition: a backlog drains in txids big enough to amortize each
    # run's fixed cost (scheduling, three task processes); a trickle still commits at once
    batch_size=100_000,
)
