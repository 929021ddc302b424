"""The backfill guard reads ``run_backwards`` as Airflow's own request model does: every value
Airflow takes for true is refused, not only JSON's ``true`` (a live api-server answered the
dry run 200 with the dates reversed for ``"true"``)."""

from __future__ import annotations

import pytest

from tridentflow_airflow.backfill_guard import runs_backwards

pytestmark = [pytest.mark.airflow]


@pytest.mark.parametrize("value", [True, "true", "True", 1, "1", "yes", "on", "y", "t"])
def test_every_value_airflow_reads_as_true_runs_backwards(value):
    from airflow.api_fastapi.core_api.datamodels.backfills import BackfillPostBody

    body = {"dag_id": "d", "from_date": "2026-01-01T00:00:00Z", "to_date": "2026-01-02T00:00:00Z"}
    assert BackfillPostBody.model_validate({**body, "run_backwards": value}).run_backwards
    assert runs_backwards({"run_backwards": value})


@pytest.mark.parametrize("value", [False, "false", 0, "no", "off", "maybe", None, [1]])
def test_false_and_what_airflow_refuses_itself_are_left_to_airflow(value):
    assert not runs_backwards({"run_backwards": value})
    assert not runs_backwards({})
