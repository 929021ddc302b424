"""Airflow glue for tridentflow: hooks, thin operators, and a DAG factory.

Airflow puts ``plugins/`` on sys.path, and the package is also installed (editable) into the
project's venv, so DAG files import it without sys.path edits.
"""

from __future__ import annotations

from tridentflow_airflow.dag_factory import pipeline_dag

__all__ = ["pipeline_dag"]
