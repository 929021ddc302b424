"""Airflow glue for tridentflow: hooks, thin operators, a DAG factory, the view.

A DAG file needs only ``from tridentflow_airflow import pipeline_dag``. The package itself
imports nothing of Airflow: Airflow's ProvidersManager imports ``tridentflow_airflow.provider``
(the distribution's ``apache_airflow_provider`` entry point) while its own configuration is
still loading, so ``pipeline_dag`` is loaded on first use.
"""

from __future__ import annotations

from typing import Any

__all__ = ["pipeline_dag"]


def __getattr__(name: str) -> Any:
    if name == "pipeline_dag":
        from tridentflow_airflow.dag_factory import pipeline_dag

        return pipeline_dag
    raise AttributeError(f"module 'tridentflow_airflow' has no attribute {name!r}")
