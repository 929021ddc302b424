"""DAG integrity: every DAG parses, has coordinate -> emit -> commit, retries, the Spark
application exists, and the spark-submit argv is exactly what we expect."""

from __future__ import annotations

import copy
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from airflow.models.dagbag import DagBag

from tests.airflow.conftest import ROOT
from tridentflow.engines.spark import quiet_java_options
from tridentflow.errors import TridentflowError
from tridentflow_airflow.hooks import (
    MissingConnectionError,
    TridentflowRedisHook,
    check_spark_connection,
)
from tridentflow_airflow.operators import EMIT_APPLICATION, EmitOperator

EXPECTED_DAGS = {
    "tridentflow_wordcount": None,
    "tridentflow_partitioned_count": "*/10 * * * *",
    "tridentflow_wordcount_continuous": "@continuous",
    "tridentflow_wordcount_on_data": "on-data",
    "tridentflow_user_scores": None,
    "tridentflow_wordcount_drpc": None,
    "tridentflow_wordcount_stream": None,
    "tridentflow_wordcount_postgres": None,
    "tridentflow_wordcount_kafka": None,
    "tridentflow_wordcount_delta": None,
}
WITH_SINKS = {"tridentflow_wordcount_postgres", "tridentflow_wordcount_delta"}
CONSUMER_DAG = "tridentflow_wordcount_consumer"


@pytest.fixture(scope="module")
def dagbag() -> DagBag:
    return DagBag(dag_folder=str(ROOT / "dags"))


def test_no_import_errors(dagbag):
    assert dagbag.import_errors == {}
    assert set(dagbag.dag_ids) == {*EXPECTED_DAGS, CONSUMER_DAG}


def test_every_dag_says_what_it_does(dagbag):
    """The UI's DAG list shows each description."""
    for dag_id, dag in dagbag.dags.items():
        assert dag.description and len(dag.description) > 20, dag_id


def test_commits_emit_asset_events_that_a_consumer_dag_is_scheduled_on(dagbag):
    """Each pipeline's commit task has its AssetAlias outlet; the example consumer DAG is
    scheduled on the word count's `counts` state Asset."""
    from airflow.sdk import AssetAlias

    from tridentflow_airflow.assets import commit_alias, state_asset

    commit = dagbag.dags["tridentflow_wordcount"].get_task("commit")
    assert commit.outlets == [commit_alias("wordcount")]
    assert all(isinstance(o, AssetAlias) for o in commit.outlets)
    consumer = dagbag.dags[CONSUMER_DAG]
    counts = state_asset("wordcount", "counts")
    assert counts.uri == "tridentflow://redis_default/wordcount/counts"
    assert list(consumer.timetable.asset_condition.objects) == [counts]


@pytest.mark.parametrize("dag_id", sorted(EXPECTED_DAGS))
def test_each_dag_is_coordinate_emit_commit(dagbag, dag_id):
    dag = dagbag.dags[dag_id]
    steps = ["coordinate", "emit", "commit"] + (["export"] if dag_id in WITH_SINKS else [])
    assert [t.task_id for t in dag.topological_sort()] == steps
    assert dag.get_task("coordinate").downstream_task_ids == {"emit"}
    assert dag.get_task("emit").downstream_task_ids == {"commit"}
    if dag_id in WITH_SINKS:
        assert dag.get_task("commit").downstream_task_ids == {"export"}
        assert "`export`" in dag.doc_md
    assert dag.max_active_runs == 1
    assert not dag.catchup
    for task in dag.tasks:
        assert task.retries >= 1
        assert task.on_failure_callback
    emit = dag.get_task("emit")
    assert isinstance(emit, EmitOperator)
    assert Path(emit.application).is_file()
    assert Path(emit.application) == EMIT_APPLICATION


def test_schedules(dagbag):
    from tridentflow_airflow.watchers import source_asset

    for dag_id, schedule in EXPECTED_DAGS.items():
        if schedule == "on-data":  # scheduled on the source's asset, which a watcher fires
            pipeline = dagbag.dags[dag_id].get_task("coordinate").pipeline
            watched = source_asset(pipeline, pipeline, dag_id=dag_id)
            assert list(dagbag.dags[dag_id].timetable.asset_condition.objects) == [watched]
            assert watched.watchers, dag_id
        else:
            assert dagbag.dags[dag_id].schedule == schedule


def test_dag_files_do_no_heavy_work():
    for path in (ROOT / "dags").glob("*.py"):
        text = path.read_text()
        assert "sys.path" not in text
        assert "pyspark" not in text and "redis" not in text.replace("redis_conn", "")


def _argv(emit: EmitOperator) -> list[str]:
    op = copy.copy(emit)
    op.application_args = ["--pipeline", "wordcount", "--run-id", "RUN"]
    op._hook = None
    return op._get_hook()._build_spark_submit_command(op.application)


COMMON = [
    "--conf",
    "spark.ui.enabled=false",
    "--conf",
    f"spark.driver.extraJavaOptions={quiet_java_options()}",
    "--name",
    "tridentflow-emit-wordcount",
    str(EMIT_APPLICATION),
    "--pipeline",
    "wordcount",
    "--run-id",
    "RUN",
]


@pytest.mark.parametrize(
    ("conn", "master"),
    [
        ('{"conn_type":"spark","host":"local[*]"}', "local[*]"),
        (
            '{"conn_type":"spark","host":"spark://spark-master","port":7077}',
            "spark://spark-master:7077",
        ),
    ],
)
def test_spark_submit_argv_is_exact(dagbag, monkeypatch, conn, master):
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", conn)
    emit = dagbag.dags["tridentflow_wordcount"].get_task("emit")
    assert _argv(emit) == ["spark-submit", "--master", master, *COMMON]


def test_missing_connections_are_clear_errors(monkeypatch):
    monkeypatch.delenv("AIRFLOW_CONN_SPARK_DEFAULT", raising=False)
    monkeypatch.delenv("AIRFLOW_CONN_REDIS_DEFAULT", raising=False)
    with pytest.raises(MissingConnectionError, match="AIRFLOW_CONN_SPARK_DEFAULT"):
        check_spark_connection("spark_default")
    with pytest.raises(MissingConnectionError, match="'redis_default' is not defined"):
        TridentflowRedisHook().get_url()


@pytest.mark.parametrize(
    ("conn", "url"),
    [
        ("redis://127.0.0.1:6390/2", "redis://127.0.0.1:6390/2"),
        (
            '{"conn_type":"redis","host":"r","port":6379,"password":"p@ss","extra":{"db":3}}',
            "redis://:p%40ss@r:6379/3",
        ),
        ('{"conn_type":"redis","host":"r","extra":{"ssl":true}}', "rediss://r:6379/0"),
    ],
)
def test_redis_connection_urls(monkeypatch, conn, url):
    monkeypatch.setenv("AIRFLOW_CONN_REDIS_DEFAULT", conn)
    assert TridentflowRedisHook().get_url() == url


def test_a_secured_redis_url_survives_the_airflow_connection(monkeypatch, tmp_path):
    """ACL user, password with URL-special characters, TLS and its CA: the launcher's
    connection JSON and the hook give back the same URL."""
    import json

    from tridentflow_airflow.launcher import redis_connection

    ca = tmp_path / "ca.crt"
    ca.write_text("test CA")
    url = f"rediss://tf-wc:p%40ss%3Aw@r:6380/2?ssl_ca_certs={ca}"
    conn = redis_connection(url)
    assert conn["login"] == "tf-wc" and conn["password"] == "p@ss:w"
    assert conn["extra"] == {"db": 2, "ssl": True, "ssl_ca_certs": str(ca)}
    monkeypatch.setenv("AIRFLOW_CONN_REDIS_DEFAULT", json.dumps(conn))
    assert TridentflowRedisHook().get_url() == url
    monkeypatch.setenv(
        "AIRFLOW_CONN_REDIS_DEFAULT",
        json.dumps({"conn_type": "rediss", "host": "r", "extra": {"ssl_ca_certs": "/nope.crt"}}),
    )
    with pytest.raises(TridentflowError, match=r"Redis CA file /nope\.crt does not exist"):
        TridentflowRedisHook().get_url()


def test_the_emit_renews_the_dags_lease_and_runs_workers_on_this_interpreter(dagbag, monkeypatch):
    emit = dagbag.dags["tridentflow_wordcount"].get_task("emit")
    assert emit.application_args == [
        "--pipeline",
        "wordcount",
        "--run-id",
        "{{ run_id }}",
        "--lease-ms",
        "1800000",
    ]
    custom = EmitOperator(task_id="e", pipeline="wordcount", lease=timedelta(minutes=5))
    assert custom.application_args[-2:] == ["--lease-ms", "300000"] and custom.lease_ms == 300000
    monkeypatch.setenv("AIRFLOW_CONN_REDIS_DEFAULT", "redis://127.0.0.1:6390/2")
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    assert emit.emit_env()["PYSPARK_PYTHON"] == sys.executable
    monkeypatch.setenv("PYSPARK_PYTHON", "/opt/python3")
    assert emit.emit_env()["PYSPARK_PYTHON"] == "/opt/python3"


def test_the_dag_factory_refuses_bad_arguments_in_one_line(monkeypatch):
    """What a DAG file may pass (or the environment may set) that no run could use: one line,
    which Airflow shows as the DAG file's import error."""
    from datetime import timedelta

    import pytest

    from tridentflow.errors import TridentflowError
    from tridentflow_airflow import pipeline_dag

    for kwargs, says in [
        ({"retries": 0}, "retries must be a whole number >= 1"),
        ({"batch_size": 0}, "batch_size must be a whole number >= 1"),
        ({"batch_size": 2.5}, "batch_size must be a whole number >= 1"),
        ({"max_active_runs": 0}, "max_active_runs must be >= 1"),
        ({"lease": timedelta(0)}, "lease must be positive"),
        ({"retry_delay": timedelta(seconds=-1)}, "retry_delay must be >= 0"),
    ]:
        with pytest.raises(TridentflowError, match=says) as info:
            pipeline_dag("wordcount", dag_id="bad_args", **kwargs)
        assert "\n" not in str(info.value)
    monkeypatch.setenv("TRIDENTFLOW_RETRY_DELAY_SECONDS", "soon")
    with pytest.raises(TridentflowError, match="TRIDENTFLOW_RETRY_DELAY_SECONDS"):
        pipeline_dag("wordcount", dag_id="bad_env")


def test_retries_ride_out_a_few_minutes_of_outage(dagbag, monkeypatch):
    """Every tridentflow task retries with doubling delays up to a cap (issue 36 item 8: 2
    retries x 10 s gave up on a 60 s Redis outage): by Airflow's own lower bound on each
    backoff, its retries wait more than four minutes in all before the run fails. The
    environment shortens them (tests, demos); a bad value is one line naming the variable."""
    from tridentflow_airflow import pipeline_dag
    from tridentflow_airflow.compat import doubling_backoff

    for dag_id in EXPECTED_DAGS:
        for task in dagbag.dags[dag_id].tasks:
            assert task.retries == 6 and task.retry_delay == timedelta(seconds=5), task
            assert task.retry_exponential_backoff == doubling_backoff() not in (0, 1.0, False)
            assert task.max_retry_delay == timedelta(seconds=120), task
            waits = [  # Airflow: ceil(delay * 2 ** (try - 1)), capped by max_retry_delay
                min(5 * 2 ** (attempt - 1), 120) for attempt in range(1, task.retries + 1)
            ]
            assert sum(waits) == 275 > 4 * 60, waits
    monkeypatch.setenv("TRIDENTFLOW_RETRIES", "2")
    monkeypatch.setenv("TRIDENTFLOW_MAX_RETRY_DELAY_SECONDS", "1")
    short = pipeline_dag("wordcount", dag_id="short_retries").get_task("commit")
    assert (short.retries, short.max_retry_delay) == (2, timedelta(seconds=1))
    monkeypatch.setenv("TRIDENTFLOW_RETRIES", "many")
    with pytest.raises(TridentflowError, match="TRIDENTFLOW_RETRIES must be a whole number") as e:
        pipeline_dag("wordcount", dag_id="bad_retries")
    assert "\n" not in str(e.value)


def test_every_tridentflow_task_links_to_its_runs_txid_through_serialization(dagbag):
    """Each task's "tridentflow txid" link (the run's tridentflow tab), kept by a serialized
    DAG as the scheduler and the UI see it (the plugin registers the link's class)."""
    from types import SimpleNamespace

    from airflow.serialization.serialized_objects import DagSerialization

    from tridentflow_airflow.links import TridentflowRunLink

    for dag_id in EXPECTED_DAGS:
        dag = dagbag.dags[dag_id]
        restored = DagSerialization.from_dict(DagSerialization.to_dict(dag))
        for task_id in ("coordinate", "emit", "commit"):
            links = restored.get_task(task_id).extra_links
            assert "tridentflow txid" in links, (dag_id, task_id, links)
    key = SimpleNamespace(
        dag_id="tridentflow_wordcount", run_id="manual__2026-01-01T00:00:00+00:00"
    )
    assert TridentflowRunLink().get_link(None, ti_key=key) == (
        "/dags/tridentflow_wordcount/runs/manual__2026-01-01T00%3A00%3A00%2B00%3A00"
        "/plugin/tridentflow-run"
    )
