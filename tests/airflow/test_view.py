"""The tridentflow view's JSON API (tridentflow_airflow.view) on a real Redis. The live
api-server test (test_airflow_runs.py) checks that Airflow mounts it and requires a token."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from tests.helpers import produce, runtime, sentences, word_counts
from tridentflow.engine import LocalEngine
from tridentflow.runs import commit_run, coordinate_run, emit_run
from tridentflow_airflow import view


@pytest.fixture
def client(redis_url, redis_client, home, monkeypatch):
    monkeypatch.setenv("TRIDENTFLOW_REDIS_URL", redis_url)
    monkeypatch.setenv("TRIDENTFLOW_HOME", str(home))
    view.app.dependency_overrides[view.AUTHENTICATED] = lambda: None
    try:
        yield TestClient(view.app)
    finally:
        view.app.dependency_overrides.clear()


def test_without_authentication_every_route_is_refused(redis_url, monkeypatch):
    monkeypatch.setenv("TRIDENTFLOW_REDIS_URL", redis_url)
    anonymous = TestClient(view.app)
    for method, path in [
        ("GET", "/api/pipelines"),
        ("GET", "/api/pipelines/wordcount"),
        ("GET", "/api/pipelines/wordcount/state/counts?key=a"),
        ("POST", "/api/pipelines/wordcount/audit"),
    ]:
        response = anonymous.request(method, path)
        assert response.status_code in (401, 403), (path, response.status_code)


def test_the_view_shows_the_ledger_states_quarantine_and_audit(client, redis_url, home):
    rt = runtime("wordcount", redis_url, home)
    lines = sentences(12)
    produce(rt, lines)
    for run in ("manual__1", "manual__2"):
        coordinate_run(rt, run, batch_size=2)
        emit_run(rt, run, LocalEngine())
        commit_run(rt, run)
    coordinate_run(rt, "manual__3", batch_size=2)  # pending, owned

    listed = client.get("/api/pipelines").json()
    (wordcount,) = [p for p in listed["pipelines"] if p["pipeline"] == "wordcount"]
    assert (wordcount["committed_txid"], wordcount["pending_txids"]) == (2, [3])
    assert wordcount["last_commit"]["run_id"] == "manual__2"

    detail = client.get("/api/pipelines/wordcount").json()
    assert [h["run_id"] for h in detail["history"]] == ["manual__2", "manual__1"]
    assert detail["pending"][0]["owner"] == "manual__3"
    assert {p["partition"] for p in detail["partitions"]} == {0, 1, 2, 3}

    txid = client.get("/api/pipelines/wordcount/txids/1").json()
    assert txid["status"] == "committed" and txid["commit"]["run_id"] == "manual__1"
    pending = client.get("/api/pipelines/wordcount/txids/3").json()
    assert pending["status"] == "pending" and "ranges" in pending["metadata"]
    assert client.get("/api/pipelines/wordcount/txids/9").status_code == 404

    some = sorted(word_counts(lines))[:2]
    values = client.get("/api/pipelines/wordcount/state/counts", params={"key": some}).json()
    assert [v["key"] for v in values["values"]] == [[w] for w in some]
    assert values["committed_txid"] == 2

    audit = client.post("/api/pipelines/wordcount/audit").json()
    assert audit["ok"] and audit["line"] == "lost=0 doubled=0"
    assert client.get("/api/pipelines/wordcount/quarantine").json()["total"] == 0
    missing = client.get("/api/pipelines/nope")
    assert missing.status_code == 404 and "nope" in missing.json()["detail"]


def test_no_response_shows_the_redis_password(client, redis_url, monkeypatch):
    secret_url = redis_url.replace("redis://", "redis://:s3cr3t-pw@")
    monkeypatch.setenv("TRIDENTFLOW_REDIS_URL", secret_url)
    listed = client.get("/api/pipelines")  # this Redis has no password: the login fails
    assert "s3cr3t-pw" not in listed.text
    assert listed.status_code == 503 or "***" in listed.text


def test_the_launcher_prints_the_admin_password_for_rest_tokens(tmp_path, capsys):
    from tridentflow_airflow import launcher

    assert launcher.main(["password", "--home", str(tmp_path)]) == 0
    printed = capsys.readouterr().out.strip()
    assert printed == launcher.admin_password(tmp_path) and len(printed) >= 8
