"""Seed 003: a global count over 16 partitions of an opaque source, every 10 minutes."""

from __future__ import annotations

from tridentflow_airflow import pipeline_dag

dag = pipeline_dag("partitioned-count", schedule="*/10 * * * *")
