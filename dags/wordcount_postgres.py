"""The word count with its counts exported to PostgreSQL table ``wordcount_counts`` (through the
``postgres_default`` connection) after every commit: coordinate -> emit -> commit -> export."""

from __future__ import annotations

from tridentflow_airflow import pipeline_dag

dag = pipeline_dag("wordcount-postgres", schedule=None)
