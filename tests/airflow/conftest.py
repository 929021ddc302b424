"""Airflow tests run against a throwaway AIRFLOW_HOME (set before Airflow is imported)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_home = tempfile.mkdtemp(prefix="tf-airflow-home-")
os.environ["AIRFLOW_HOME"] = _home
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(ROOT / "dags")
os.environ["AIRFLOW__CORE__PLUGINS_FOLDER"] = str(ROOT / "plugins")
os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = f"sqlite:///{_home}/airflow.db"
# The Airflow tests are about the Spark emit (spark-submit, Connect) unless they say otherwise:
# their batches are small, and a small batch is emitted without Spark by default (the tests of
# that path set the variable themselves).
os.environ["TRIDENTFLOW_LOCAL_EMIT_MAX_RECORDS"] = "0"
