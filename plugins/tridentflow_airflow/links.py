"""The link every tridentflow task shows in Airflow's UI (the task's "Links" buttons, as
providers' operators give theirs): the run's tridentflow tab, which shows the run's txid and
links to that txid's page.

Airflow 3 computes an operator's links when its task ends (the task runner stores each as an
XCom) and the UI reads them back; the plugin (tridentflow_airflow.plugin) registers the class
so that serialized DAGs keep it.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from airflow.sdk import BaseOperatorLink


class TridentflowRunLink(BaseOperatorLink):
    """``/dags/D/runs/R/plugin/tridentflow-run``: the run's txid, its commit, its page."""

    name = "tridentflow txid"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        return (
            f"/dags/{quote(ti_key.dag_id, safe='')}/runs/{quote(ti_key.run_id, safe='')}"
            "/plugin/tridentflow-run"
        )
