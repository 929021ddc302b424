"""tridentflow's Airflow plugin, registered by the installed distribution's ``airflow.plugins``
entry point: installing ``tridentflow[airflow]`` into Airflow's environment is all it takes
(no plugins folder to copy or point at)."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from tridentflow_airflow.backfill_guard import BackfillGuard
from tridentflow_airflow.links import TridentflowRunLink
from tridentflow_airflow.view import app


class TridentflowPlugin(AirflowPlugin):
    """The tridentflow view (tridentflow_airflow.view): JSON endpoints and two pages under
    /tridentflow; the pages appear as a "tridentflow" entry in the navigation and a
    "tridentflow" tab on every DAG run (external views: the UI frames them, same origin)."""

    name = "tridentflow"
    operator_extra_links = [TridentflowRunLink()]  # serialized DAGs keep the tasks' link
    fastapi_apps = [{"app": app, "url_prefix": "/tridentflow", "name": "tridentflow"}]
    # a backfill that runs backwards on a tridentflow DAG: refused where the UI and the REST
    # API create it (tridentflow_airflow.backfill_guard)
    fastapi_root_middlewares = [
        {"middleware": BackfillGuard, "name": "tridentflow-backfill-order"},
    ]
    external_views = [
        {
            "name": "tridentflow",
            "href": "tridentflow/ui",
            "destination": "nav",
            "url_route": "tridentflow",
            "category": "browse",
        },
        {
            "name": "tridentflow",
            "href": "tridentflow/run?dag_id={DAG_ID}&run_id={RUN_ID}",
            "destination": "dag_run",
            "url_route": "tridentflow-run",
        },
    ]
