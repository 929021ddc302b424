"""Modules a tridentflow task needs, imported once by the scheduler's forkserver.

Airflow 3.3's LocalExecutor starts its workers with the ``[core] mp_start_method``; with
``forkserver`` and ``[core] mp_forkserver_preload = tridentflow_airflow.preload`` the fork
server imports this module once, every worker is forked from it, and every task process is
forked from a worker (the Task SDK's supervisor), so a task starts with Airflow's task runner,
the Spark provider, tridentflow and the Spark Connect client already imported instead of
importing them again (about 0.5-1 s of a task's start on 2 cores; see docs/airflow.md).
`tridentflow-airflow up` sets both options; set them in your own airflow.cfg to get the same.

Importing this module has no side effect beyond the imports; a module that cannot be imported
(pyspark's Connect client without pandas or grpc, say) is skipped, and the task imports what it
needs itself as before.
"""

from __future__ import annotations

import importlib

PRELOADED = (
    "airflow.executors.local_executor",
    "airflow.sdk.execution_time.supervisor",
    "airflow.sdk.execution_time.task_runner",
    "airflow.providers.apache.spark.operators.spark_submit",
    "airflow.providers.apache.spark.hooks.spark_connect",
    "tridentflow_airflow.operators",
    "tridentflow_airflow.dag_factory",
    "tridentflow.engines.spark",
    "pyspark.sql.connect.session",
    "pyspark.sql.connect.functions",
)
"""Heaviest first is not needed: each import is independent; order only matters for speed."""


def preload(modules: tuple[str, ...] = PRELOADED) -> list[str]:
    """Import ``modules``; returns those that could not be imported (never raises)."""
    missing = []
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # an optional part missing: the task imports it itself, or fails there
            missing.append(name)
    return missing


def load_plugins() -> None:
    """Load Airflow's plugins (listeners, macros) as the task runner would in every task; a
    scheduler that forks its workers has loaded them already, a fork server has not."""
    try:
        from tridentflow_airflow.compat import load_listeners_and_macros

        load_listeners_and_macros()
    except Exception:  # the task runner loads them itself, and reports what fails there
        pass


MISSING = preload()
load_plugins()
