"""Seed 000's word count: transactional source, opaque state. Trigger it from the UI."""

from __future__ import annotations

from tridentflow_airflow import pipeline_dag

dag = pipeline_dag("wordcount", schedule=None)
