"""Which DAGs run which pipeline (tridentflow_airflow.catalog): what the DAGs declare in their
serialized form, loaded as their tasks load it - a custom ``dag_id``, a user's pipeline module
next to its DAG file, two DAGs of one pipeline - never ``tridentflow_<pipeline>`` guessed.
The view answers from it (the live stack: tests/airflow/test_connect_live.py)."""

from __future__ import annotations

import textwrap

import pytest
from fastapi.testclient import TestClient

from tests.airflow.test_view import as_connection
from tests.helpers import produce, runtime, sentences
from tridentflow.engines.local import LocalEngine
from tridentflow.steps.runs import commit_run, coordinate_run, emit_run
from tridentflow_airflow import catalog as catalog_module
from tridentflow_airflow import view
from tridentflow_airflow.catalog import DeclaredDag, _pipeline_ref, build_catalog

pytestmark = [pytest.mark.airflow]

USER_PIPELINE = textwrap.dedent(
    """
    from tridentflow import Count, LogSource, Pipeline, SourceMode, StateKind, StateSpec

    def split(sentence):
        for word in sentence.split():
            yield (word,)

    def build():
        p = Pipeline("my-counts", LogSource(fields=("sentence",), mode=SourceMode.OPAQUE))
        p.stream.each("sentence", split, "word").group_by("word").persistent_aggregate(
            StateSpec("counts", StateKind.OPAQUE), Count())
        return p
    """
)


def test_the_serialized_dag_names_its_pipeline_whatever_its_dag_id():
    from airflow.serialization.serialized_objects import DagSerialization

    from tridentflow_airflow.dag_factory import pipeline_dag

    dag = pipeline_dag("wordcount-opaque", dag_id="counts_on_my_terms", schedule=None)
    assert _pipeline_ref(DagSerialization.to_dict(dag)) == "wordcount-opaque"


def test_a_user_module_next_to_its_dag_file_loads_and_a_broken_one_is_not_configured(tmp_path):
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "user_counts_module.py").write_text(USER_PIPELINE)
    declared = [
        DeclaredDag("my_counts", "user_counts_module:build", str(dags / "my_dag.py")),
        DeclaredDag("also_counts", "user_counts_module:build", str(dags / "other.py")),
        DeclaredDag("typo_dag", "user_counts_modul:build", str(dags / "typo.py")),
        DeclaredDag("kafka_dag", "wordcount-kafka", None),
    ]
    cat = build_catalog(declared, extra_refs=[])
    assert cat.from_airflow and set(cat.pipelines) == {"my-counts", "wordcount-kafka"}
    assert cat.dags["my-counts"] == ["also_counts", "my_counts"]
    assert cat.pipeline_of["my_counts"] == "my-counts" and cat.dag_of("my-counts") is None
    assert cat.dag_of("wordcount-kafka") == "kafka_dag"
    assert "cannot import user_counts_modul" in cat.not_configured["typo_dag"]
    assert "wordcount" not in cat.pipelines  # a bundled example no DAG runs is not shown


@pytest.fixture
def declared_client(redis_url, redis_client, home, monkeypatch):
    """The view's app over a catalog of DAGs as Airflow's metadata DB would list them."""
    monkeypatch.setenv("TRIDENTFLOW_REDIS_URL", redis_url)
    monkeypatch.setenv("AIRFLOW_CONN_REDIS_DEFAULT", as_connection(redis_url))
    declared = [
        DeclaredDag("counts_on_data", "wordcount-opaque"),
        DeclaredDag("broken_dag", "nowhere_module:build"),
    ]
    monkeypatch.setattr(catalog_module, "declared_dags", lambda: declared)
    catalog_module.forget()
    view.app.dependency_overrides[view.AUTHENTICATED] = lambda: None
    view.app.dependency_overrides[view.current_user] = lambda: None
    try:
        yield TestClient(view.app)
    finally:
        view.app.dependency_overrides.clear()
        catalog_module.forget()


def test_the_view_answers_for_a_custom_dag_id_and_says_what_it_does_not_know(
    declared_client, redis_url, home
):
    rt = runtime("wordcount-opaque", redis_url, home)
    produce(rt, sentences(8))
    run_id = "manual__2026-11-27T10:00:00+00:00"
    coordinate_run(rt, run_id)
    emit_run(rt, run_id, LocalEngine())
    commit_run(rt, run_id)
    # the run tab: the DAG declares its pipeline (its id is not tridentflow_<pipeline>)
    answer = declared_client.get(f"/api/runs/counts_on_data/{run_id}").json()
    assert (answer["pipeline"], answer["txid"], answer["status"]) == (
        "wordcount-opaque",
        1,
        "committed",
    )
    # Airflow 3.1 puts the run id into the tab's URL unencoded: "+" arrives as a space
    mangled = run_id.replace("+", " ")
    assert declared_client.get(f"/api/runs/counts_on_data/{mangled}").json()["status"] == (
        "committed"
    )
    page = declared_client.get("/api/pipelines/wordcount-opaque/txids/1").json()
    assert page["dag_id"] == "counts_on_data"
    assert [r["dag_id"] for r in page["runs"]] == ["counts_on_data"]
    status = declared_client.get("/api/pipelines/wordcount-opaque").json()
    assert status["dag_ids"] == ["counts_on_data"] and status["history"][0]["dag_id"] == (
        "counts_on_data"
    )
    listing = declared_client.get("/api/pipelines").json()
    assert [p["pipeline"] for p in listing["pipelines"]] == ["wordcount-opaque"]
    (broken,) = listing["not_configured"]
    assert broken["dag_id"] == "broken_dag" and "cannot import nowhere_module" in broken["needs"]
    refused = declared_client.get(f"/api/runs/broken_dag/{run_id}")
    assert refused.status_code == 409 and "cannot load" in refused.json()["detail"]
    unknown = declared_client.get(f"/api/runs/tridentflow_wordcount_opaque/{run_id}")
    assert unknown.status_code == 404  # the guessed id: no DAG declares it
