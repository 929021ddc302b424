"""Registers tridentflow's Airflow plugin (the api-server scans this folder for plugins)."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from tridentflow_airflow.view import app


class TridentflowPlugin(AirflowPlugin):
    """The tridentflow view: JSON endpoints under /tridentflow (tridentflow_airflow.view)."""

    name = "tridentflow"
    fastapi_apps = [{"app": app, "url_prefix": "/tridentflow", "name": "tridentflow"}]
