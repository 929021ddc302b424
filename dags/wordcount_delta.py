"""The word count with its counts exported to a Delta Lake table (``TRIDENTFLOW_DELTA_TABLE``,
else under the home) after every commit, one Delta commit per txid stamped with it:
coordinate -> emit -> commit -> export."""

from __future__ import annotations

from tridentflow_airflow import pipeline_dag

dag = pipeline_dag("wordcount-delta", schedule=None)
