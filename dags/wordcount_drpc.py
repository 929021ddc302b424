"""A word count with a state-query stream over its own counts (Trident's DRPC word count).
Trigger it from the UI; the Spark executors read Redis for the query."""

from __future__ import annotations

from tridentflow_airflow import pipeline_dag

dag = pipeline_dag("wordcount-drpc", schedule=None)
