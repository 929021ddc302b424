"""Seed 002's user scores: partition by user, per-partition counts, a global merge, and a
per-user score sum in an opaque state. Trigger it from the UI."""

from __future__ import annotations

from tridentflow_airflow import pipeline_dag

dag = pipeline_dag("user-scores", schedule=None)
