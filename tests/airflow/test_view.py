"""The tridentflow view's JSON API (tridentflow_airflow.view) on a real Redis. The live
api-server test (test_airflow_runs.py) checks that Airflow mounts it and requires a token."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from tests.helpers import produce, runtime, sentences, word_counts
from tridentflow.engines.local import LocalEngine
from tridentflow.steps.runs import commit_run, coordinate_run, emit_run
from tridentflow_airflow import view


def as_connection(url: str) -> str:
    """``url`` as the redis_default connection in the environment (Airflow's env secrets
    backend answers before the metadata DB, which a live test may have given another one)."""
    import json as _json

    from tridentflow_airflow.launcher import redis_connection

    return _json.dumps(redis_connection(url))


@pytest.fixture
def client(redis_url, redis_client, home, monkeypatch):
    monkeypatch.setenv("TRIDENTFLOW_REDIS_URL", redis_url)
    monkeypatch.setenv("AIRFLOW_CONN_REDIS_DEFAULT", as_connection(redis_url))
    monkeypatch.setenv("TRIDENTFLOW_HOME", str(home))
    view.app.dependency_overrides[view.AUTHENTICATED] = lambda: None
    view.app.dependency_overrides[view.current_user] = lambda: None
    try:
        yield TestClient(view.app)
    finally:
        view.app.dependency_overrides.clear()


def _example_path(path: str) -> str:
    """A route's path with every ``{param}`` filled in."""
    import re

    return re.sub(r"\{[^}]+\}", "1", path)


def test_without_authentication_every_route_is_refused(redis_url, monkeypatch):
    """Every route the app mounts, FastAPI's schema and docs pages included, walked from the
    app itself (a route added later is covered without editing this test)."""
    from starlette.routing import Route

    monkeypatch.setenv("TRIDENTFLOW_REDIS_URL", redis_url)
    monkeypatch.setenv("AIRFLOW_CONN_REDIS_DEFAULT", as_connection(redis_url))
    anonymous = TestClient(view.app)
    routes = [r for r in view.app.routes if isinstance(r, Route)]
    walked = set()
    for route in routes:
        for method in sorted(route.methods - {"HEAD"}):
            path = _example_path(route.path)
            response = anonymous.request(method, path)
            assert response.status_code in (401, 403), (method, path, response.status_code)
            assert response.headers["content-type"].startswith("application/json"), path
            walked.add(route.path)
    assert {"/openapi.json", "/docs", "/redoc", "/ui", "/api/pipelines"} <= walked


def test_the_view_reads_the_redis_the_tasks_write_through(client, redis_url, home, monkeypatch):
    """Configured as docs/install.md says (the ``redis_default`` connection only), the view
    reads the ledger the tasks wrote; the connection wins over a stale TRIDENTFLOW_REDIS_URL;
    neither set is a one-line 503 naming both (found by tests/test_versions.py: a vanilla
    Airflow's view showed txid 0 while the tasks had committed 2)."""
    import json as _json

    from tridentflow_airflow.launcher import redis_connection

    rt = runtime("wordcount", redis_url, home)
    produce(rt, sentences(4))
    coordinate_run(rt, "manual__1", batch_size=10)
    emit_run(rt, "manual__1", LocalEngine())
    commit_run(rt, "manual__1")
    connection = _json.dumps(redis_connection(redis_url))
    for stale in (None, "redis://127.0.0.1:1/0"):
        if stale is None:
            monkeypatch.delenv("TRIDENTFLOW_REDIS_URL")
        else:
            monkeypatch.setenv("TRIDENTFLOW_REDIS_URL", stale)
        monkeypatch.setenv("AIRFLOW_CONN_REDIS_DEFAULT", connection)
        assert client.get("/api/pipelines/wordcount").json()["committed_txid"] == 1
    monkeypatch.delenv("AIRFLOW_CONN_REDIS_DEFAULT")
    monkeypatch.delenv("TRIDENTFLOW_REDIS_URL")
    monkeypatch.setattr(view, "server_redis_url", lambda: None)  # nor in the metadata DB
    refused = client.get("/api/pipelines/wordcount")
    assert refused.status_code == 503
    assert refused.json()["detail"] == (
        "no Redis to read: define the Airflow connection 'redis_default' (the one the tasks "
        "use) or set TRIDENTFLOW_REDIS_URL in the api-server's environment"
    )


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
    # committed, with later txids bound: its ranges still show, kept with its commit (issue 36
    # item 2: they were empty once the txid's own metadata went)
    for n, (start, end) in ((1, (0, 2)), (2, (2, 3))):
        shown = client.get(f"/api/pipelines/wordcount/txids/{n}").json()["partitions"]
        assert [(p["partition"], p["from"], p["to"]) for p in shown] == [
            (p, start, end) for p in range(4)
        ], (n, shown)
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
    page = client.get("/api/pipelines/wordcount/state/counts/keys", params={"limit": 3}).json()
    listed_keys = [v["key"][0] for v in page["values"]]
    while page["next"]:
        page = client.get(
            "/api/pipelines/wordcount/state/counts/keys", params={"limit": 3, "after": page["next"]}
        ).json()
        listed_keys += [v["key"][0] for v in page["values"]]
    assert sorted(listed_keys) == sorted(word_counts(lines))  # 3 per partition: 2 txids hold all

    run = client.get("/api/runs/tridentflow_wordcount/manual__1").json()
    assert (run["txid"], run["status"], run["commit"]["run_id"]) == (1, "committed", "manual__1")
    assert run["commit"]["steps"]["emit"]["attempts"] == 1
    assert run["commit"]["skipped"] == []  # a list, even empty (Lua's cjson writes {})
    run3 = client.get("/api/runs/tridentflow_wordcount/manual__3").json()
    assert (run3["txid"], run3["status"], run3["pending"]["owner"]) == (3, "pending", "manual__3")
    unbound = client.get("/api/runs/tridentflow_wordcount/manual__9").json()
    assert (unbound["txid"], unbound["status"]) == (None, "unbound")
    assert client.get("/api/runs/some_other_dag/manual__1").status_code == 404
    for path in ("/ui", "/run?dag_id=tridentflow_wordcount&run_id=manual__1"):
        html = client.get(path)
        assert html.headers["content-type"].startswith("text/html")
        assert 'fetch("api/"' in html.text  # relative to /tridentflow/

    missing = client.get("/api/pipelines/nope")
    assert missing.status_code == 404 and "nope" in missing.json()["detail"]


def test_no_response_shows_the_redis_password(client, redis_url, monkeypatch):
    secret_url = redis_url.replace("redis://", "redis://:s3cr3t-pw@")
    monkeypatch.setenv("TRIDENTFLOW_REDIS_URL", secret_url)  # no connection: the URL is read
    monkeypatch.delenv("AIRFLOW_CONN_REDIS_DEFAULT")
    monkeypatch.setattr(view, "server_redis_url", lambda: None)
    listed = client.get("/api/pipelines")  # this Redis has no password: the login fails
    assert "s3cr3t-pw" not in listed.text
    assert listed.status_code == 503 or "***" in listed.text


def test_the_launcher_prints_the_admin_password_for_rest_tokens(tmp_path, capsys):
    from tridentflow_airflow import launcher

    assert launcher.main(["password", "--home", str(tmp_path)]) == 0
    printed = capsys.readouterr().out.strip()
    assert printed == launcher.admin_password(tmp_path) and len(printed) >= 8


def test_the_launcher_stores_the_connections_it_sets(tmp_path):
    from tridentflow_airflow import launcher

    env = launcher.airflow_env(tmp_path, "rediss://user:p%40ss@10.0.0.5:6380/3", 8080, {})
    conns = launcher.connections(env)
    assert conns["spark_default"] == {"conn_type": "spark", "host": "local[*]"}
    assert conns["redis_default"] == {
        "conn_type": "redis",
        "host": "10.0.0.5",
        "port": 6380,
        "login": "user",
        "password": "p@ss",
        "extra": {"db": 3, "ssl": True},
    }


def test_no_response_shows_a_secret_of_the_redis_url(redis_client, monkeypatch, tmp_path):
    """The view's ``redis`` field and its error details, for every form a credential takes in
    the URL (tests/test_secrets.py: the same forms through the CLI)."""
    from tests import secure_redis
    from tests.test_secrets import credential_forms

    server = secure_redis.start(tmp_path / "secret-redis")
    monkeypatch.delenv("AIRFLOW_CONN_REDIS_DEFAULT", raising=False)  # the URLs are read
    monkeypatch.setattr(view, "server_redis_url", lambda: None)
    view.app.dependency_overrides[view.AUTHENTICATED] = lambda: None
    try:
        for url, secret in credential_forms(server.port)[:2] + credential_forms(server.port)[3:5]:
            for shown_url in (url, url.replace(f":{server.port}/", ":1/")):  # and unreachable
                monkeypatch.setenv("TRIDENTFLOW_REDIS_URL", shown_url)
                client = TestClient(view.app)
                listed = client.get("/api/pipelines")
                detail = client.get("/api/pipelines/wordcount")
                assert listed.status_code in (200, 503)  # 503: unreachable, said in JSON
                assert "***" in listed.json()["redis"]
                for response in (listed, detail):
                    assert secret not in response.text, response.text
    finally:
        view.app.dependency_overrides.clear()
        server.stop()


def test_metrics_in_prometheus_format_for_every_pipeline(client, redis_url, home):
    from prometheus_client.parser import text_string_to_metric_families

    rt = runtime("wordcount", redis_url, home)
    produce(rt, sentences(12))
    coordinate_run(rt, "manual__1", batch_size=2)
    emit_run(rt, "manual__1", LocalEngine())
    commit_run(rt, "manual__1")
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples = {
        (s.name, s.labels["pipeline"]): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }
    assert samples[("tridentflow_committed_txid", "wordcount")] == 1
    assert samples[("tridentflow_lag_records", "wordcount")] == 12 - 2 * 4
    assert samples[("tridentflow_up", "wordcount-opaque")] == 1  # every known pipeline


def test_the_scrape_token_opens_metrics_and_nothing_else(redis_url, redis_client, monkeypatch):
    """Without Airflow's auth overridden: a scraper's bearer token is the one set in
    TRIDENTFLOW_METRICS_TOKEN, on /metrics only; a wrong one, or none set, is refused."""
    from airflow.api_fastapi.app import init_auth_manager

    monkeypatch.setenv("TRIDENTFLOW_REDIS_URL", redis_url)
    monkeypatch.setenv("AIRFLOW_CONN_REDIS_DEFAULT", as_connection(redis_url))
    init_auth_manager()  # as the api-server does: a wrong token goes to Airflow's auth manager
    anonymous = TestClient(view.app)
    scrape = {"Authorization": "Bearer scrape-s3cret"}
    assert anonymous.get("/metrics", headers=scrape).status_code in (401, 403)  # none set
    monkeypatch.setenv(view.METRICS_TOKEN_ENV, "scrape-s3cret")
    opened = anonymous.get("/metrics", headers=scrape)
    assert opened.status_code == 200 and "tridentflow_up" in opened.text
    assert anonymous.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code in (
        401,
        403,
    )
    assert anonymous.get("/metrics").status_code in (401, 403)
    for path in ("/api/pipelines", "/openapi.json", "/ui"):
        assert anonymous.get(path, headers=scrape).status_code in (401, 403), path


COLLIDING = ["metrics", "..", "%2Fmetrics", "metrics%2F..%2Fmetrics", "x%2F..%2Fmetrics", "."]
"""Path parameters chosen to make a path end like, or resolve towards, /metrics."""


def test_the_scrape_token_opens_exactly_one_route(redis_url, redis_client, monkeypatch):
    """Every route the app mounts, each path parameter filled with names that collide with
    the metrics route (``metrics``, ``..``, encoded slashes), with only the scrape token:
    exactly one route answers, /metrics; every other one is refused."""
    from airflow.api_fastapi.app import init_auth_manager
    from starlette.routing import Route

    monkeypatch.setenv("TRIDENTFLOW_REDIS_URL", redis_url)
    monkeypatch.setenv("AIRFLOW_CONN_REDIS_DEFAULT", as_connection(redis_url))
    monkeypatch.setenv(view.METRICS_TOKEN_ENV, "scrape-s3cret")
    init_auth_manager()
    scraper = TestClient(view.app, follow_redirects=False)
    scrape = {"Authorization": "Bearer scrape-s3cret"}
    opened: set[str] = set()
    for route in [r for r in view.app.routes if isinstance(r, Route)]:
        for method in sorted(route.methods - {"HEAD"}):
            paths = {route.path}
            for fill in COLLIDING:  # every parameter colliding, or a real pipeline's others
                paths.add(re.sub(r"\{[^}]+\}", fill, route.path))
                named = route.path.replace("{name}", "wordcount").replace("{dag_id}", "d")
                paths.add(re.sub(r"\{[^}]+\}", fill, named))
            for path in sorted(paths - {route.path} if "{" in route.path else paths):
                for tail in ("", "?next=/metrics", "/"):
                    response = scraper.request(method, path + tail, headers=scrape)
                    unrouted = response.status_code == 404 and response.json() == {
                        "detail": "Not Found"
                    }  # the router found no route: no handler ran
                    if response.status_code not in (401, 403, 405, 307) and not unrouted:
                        opened.add(f"{method} {path}{tail} -> {response.status_code}")
    assert opened == {"GET /metrics -> 200", "GET /metrics?next=/metrics -> 200"}, opened


def test_the_route_check_itself_tells_routes_apart():
    """The guard's own check: true for the metrics route's scope, false for a state route
    whose path ends in /metrics (what the path-suffix check let through)."""
    from starlette.requests import Request

    by_path = {r.path: r for r in view.app.routes if hasattr(r, "endpoint")}
    metrics_scope = {"type": "http", "route": by_path["/metrics"], "path": "/metrics"}
    state_route = by_path["/api/pipelines/{name}/state/{state}"]
    state_scope = {"type": "http", "route": state_route, "path": "/api/pipelines/p/state/metrics"}
    assert view.is_metrics_route(Request(metrics_scope))
    assert not view.is_metrics_route(Request(state_scope))
    assert not view.is_metrics_route(Request({"type": "http", "path": "/metrics"}))


@pytest.mark.parametrize("broker", ["refuses", "never-answers"])
def test_a_source_that_does_not_answer_keeps_the_scrape_and_the_listing_in_bound(
    client, monkeypatch, broker
):
    """The bundled Kafka pipelines pointed at a broker that refuses connections, or at one
    that accepts them and never answers: one scrape and one listing each answer within the
    bound (TRIDENTFLOW_READ_DEADLINE_S, 2 s here) plus a second; the Kafka pipelines show
    up 0 with why, every other pipeline reports as usual; a second scrape starts no second
    read of a source still hung (the workers stay bounded)."""
    import socket
    import time

    from prometheus_client.parser import text_string_to_metric_families

    from tridentflow.devtools.devredis import free_port
    from tridentflow.ops.bounded import READER
    from tridentflow.sources.kafka import BOOTSTRAP_ENV

    listener = None
    if broker == "refuses":
        port = free_port()
    else:
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        port = listener.getsockname()[1]
    monkeypatch.setenv(BOOTSTRAP_ENV, f"127.0.0.1:{port}")
    monkeypatch.setenv(view.READ_DEADLINE_ENV, "2")
    try:
        for _ in range(2):
            started = time.monotonic()
            scraped = client.get("/metrics")
            took = time.monotonic() - started
            assert scraped.status_code == 200 and took < 3.5, took
            up = {
                s.labels["pipeline"]: s.value
                for f in text_string_to_metric_families(scraped.text)
                for s in f.samples
                if s.name == "tridentflow_up"
            }
            assert up["wordcount"] == 1 and up["wordcount-opaque"] == 1, up
            assert up["wordcount-kafka"] == 0 and up["wordcount-kafka-opaque"] == 0, up
            started = time.monotonic()
            listed = client.get("/api/pipelines")
            took = time.monotonic() - started
            assert listed.status_code == 200 and took < 3.5, took
            body = listed.json()
            names = {p["pipeline"] for p in body["pipelines"]}
            assert "wordcount" in names and "wordcount-kafka" not in names, names
            why = {u["pipeline"]: u["error"] for u in body["unreadable"]}
            assert "wordcount-kafka" in why and "\n" not in why["wordcount-kafka"], why
        with READER._lock:
            hung = [k for k, f in READER._in_flight.items() if "kafka" in k and not f.done()]
        assert len(hung) == len(set(hung)) <= 4, hung  # one read per key, never piled up
    finally:
        if listener is not None:
            listener.close()


def test_a_pipeline_nobody_configured_is_listed_as_such_not_as_a_failure(client, monkeypatch):
    """A fresh start: the bundled Kafka pipelines have no brokers anywhere. The listing puts
    them under ``not_configured`` with what to set (one line), not under ``unreadable``
    (issue 36 item 4); the page shows that line muted, not red (check_the_view_in_a_browser in
    tests/airflow/test_airflow_runs.py reads it there against this answer)."""
    from tridentflow.sources.kafka import BOOTSTRAP_ENV, CONFIG_ENV

    monkeypatch.delenv(BOOTSTRAP_ENV, raising=False)
    monkeypatch.delenv(CONFIG_ENV, raising=False)
    monkeypatch.delenv("AIRFLOW_CONN_KAFKA_DEFAULT", raising=False)
    from tridentflow.ops.bounded import BoundedReader

    # a reader of its own: one an earlier test left waiting on a hung broker answers "not yet"
    monkeypatch.setattr(view, "READER", BoundedReader())
    body = client.get("/api/pipelines").json()
    needs = {n["pipeline"]: n["needs"] for n in body["not_configured"]}
    assert set(needs) == {"wordcount-kafka", "wordcount-kafka-opaque"}, body
    assert all(
        v.startswith("a KafkaSource needs brokers: set TRIDENTFLOW_KAFKA_BOOTSTRAP")
        and "\n" not in v
        for v in needs.values()
    ), needs
    assert not [u for u in body["unreadable"] if u["pipeline"] in needs], body["unreadable"]
    assert "wordcount" in {p["pipeline"] for p in body["pipelines"]}


def test_redis_unreachable_is_a_503_with_a_json_reason(client, monkeypatch):
    from tridentflow.devtools.devredis import free_port

    dead = f"redis://127.0.0.1:{free_port()}/0"
    monkeypatch.setenv("TRIDENTFLOW_REDIS_URL", dead)
    monkeypatch.setenv("AIRFLOW_CONN_REDIS_DEFAULT", as_connection(dead))
    listed = client.get("/api/pipelines")
    assert listed.status_code == 503
    body = listed.json()
    assert body["pipelines"] == [] and body["unreadable"]
    assert (
        body["detail"].startswith("no pipeline can be read from Redis")
        and "\n" not in body["detail"]
    )
    assert client.get("/api/pipelines/wordcount").status_code == 503
    metrics = client.get("/metrics")  # still answers: every pipeline down
    assert metrics.status_code == 200 and 'tridentflow_up{pipeline="wordcount"} 0.0' in metrics.text


def test_a_blocked_pipeline_is_shown_and_released_by_an_operator(
    client, redis_url, home, monkeypatch
):
    """The owner run's state comes from Airflow's metadata DB in the api-server; here that
    lookup is given (the live stack has the DB): unknown first, then failed."""
    rt = runtime("wordcount", redis_url, home)
    produce(rt, sentences(8))
    coordinate_run(rt, "manual__1", batch_size=1)
    states = {}
    monkeypatch.setattr(view, "airflow_run_state", lambda dag_id, run_id: states.get(run_id))
    detail = client.get("/api/pipelines/wordcount").json()
    assert detail["blocked"] is None and detail["dag_id"] == "tridentflow_wordcount"
    refused = client.post("/api/pipelines/wordcount/txids/1/release")
    assert refused.status_code == 409 and "keeps txid 1" in refused.json()["detail"]

    states["manual__1"] = "failed"
    listed = client.get("/api/pipelines").json()
    (wordcount,) = [p for p in listed["pipelines"] if p["pipeline"] == "wordcount"]
    assert wordcount["blocked"]["owner"] == "manual__1" and wordcount["blocked"]["txid"] == 1
    released = client.post("/api/pipelines/wordcount/txids/1/release")
    assert released.status_code == 200, released.text
    assert released.json()["owner_state"] == "failed"
    after = client.get("/api/pipelines/wordcount").json()["blocked"]
    assert after["owner"] is None and "trigger a run" in after["line"]
    assert client.post("/api/pipelines/nope/txids/1/release").status_code == 404


def test_a_txids_page_has_its_ranges_runs_adoptions_and_steps(client, redis_url, home):
    from tridentflow.steps.runs import note_task, release_run

    rt = runtime("wordcount", redis_url, home)
    produce(rt, sentences(12))
    coordinate_run(rt, "manual__1", batch_size=2)
    release_run(rt, "manual__1")  # it gave up: the next run adopts txid 1
    coordinate_run(rt, "manual__2", batch_size=5)
    pending = client.get("/api/pipelines/wordcount/txids/1").json()
    assert pending["status"] == "pending" and pending["owner"] == "manual__2"
    emit_run(rt, "manual__2", LocalEngine())
    note_task(rt, 1, "commit", 1, 1_000, done=False)  # as the commit task does, try 1
    commit_run(rt, "manual__2")
    page = client.get("/api/pipelines/wordcount/txids/1").json()
    assert page["status"] == "committed" and page["dag_id"] == "tridentflow_wordcount"
    assert [(p["partition"], p["from"], p["to"], p["records"]) for p in page["partitions"]] == [
        (p, 0, 2, 2) for p in range(4)
    ]  # the metadata frozen on the first attempt, reused by the adopting run
    dag = "tridentflow_wordcount"
    assert page["runs"] == [
        {"run_id": "manual__1", "dag_id": dag, "state": None, "adopted_by": "manual__2"},
        {"run_id": "manual__2", "dag_id": dag, "state": None, "adopted_by": None},
    ]
    assert page["commit"]["run_id"] == "manual__2" and page["commit"]["records"] == 8
    assert page["replays"] == []
    assert page["commit"]["steps"]["commit"]["tries"] == 1
    note_task(rt, 1, "commit", 2, 2_000, done=True)  # a clear: found it committed, no change
    (replay,) = client.get("/api/pipelines/wordcount/txids/1").json()["replays"]
    assert (replay["step"], replay["tries_at_commit"], replay["tries_now"]) == ("commit", 1, 2)
    assert replay["last_ended_ms"]
    assert client.get("/api/pipelines/wordcount/txids/0").status_code == 404
    assert client.get("/api/pipelines/wordcount/txids/2").status_code == 404
    html = client.get("/txid?pipeline=wordcount&txid=1")
    assert html.headers["content-type"].startswith("text/html") and "txidPage" in html.text


def test_a_pipelines_sinks_show_their_position_and_lag(
    client, redis_url, home, pg_dsn, monkeypatch
):
    from tridentflow.steps.driver import run_batches
    from tridentflow.steps.export import export

    monkeypatch.setenv("TRIDENTFLOW_POSTGRES_DSN", pg_dsn)
    rt = runtime("wordcount-postgres", redis_url, home)
    produce(rt, sentences(12))
    run_batches(rt, LocalEngine(), max_batches=1, batch_size=1)
    export(rt)
    run_batches(rt, LocalEngine(), max_batches=2, batch_size=1)
    [sink] = client.get("/api/pipelines/wordcount-postgres").json()["sinks"]
    assert (sink["sink"], sink["position"], sink["lag"]) == ("postgres-wordcount_counts", 1, 2)
    assert (
        sink["target"].startswith("PostgreSQL table wordcount_counts")
        and "tf_test_" in sink["target"]
    )


def test_a_kafka_pipeline_reads_its_brokers_from_the_airflow_connection(
    client, redis_url, home, monkeypatch
):
    """The view (in the api-server, not a task) finds a KafkaSource's brokers in the
    kafka_default connection too: partitions with committed offset, head and lag."""
    import json as _json

    from tridentflow.devtools.devkafka import LocalKafka
    from tridentflow.sources.kafka import KafkaLog

    monkeypatch.delenv("TRIDENTFLOW_KAFKA_BOOTSTRAP", raising=False)
    with LocalKafka() as broker:
        conn = {"conn_type": "kafka", "extra": {"bootstrap.servers": broker.bootstrap}}
        monkeypatch.setenv("AIRFLOW_CONN_KAFKA_DEFAULT", _json.dumps(conn))
        log = KafkaLog("wordcount", {"bootstrap.servers": broker.bootstrap}, "wordcount-kafka")
        log.create(4)
        log.append_spread(sentences(10))
        info = client.get("/api/pipelines/wordcount-kafka").json()
    assert [(p["committed"], p["head"], p["lag"]) for p in info["partitions"]] == [
        (0, 3, 3),
        (0, 3, 3),
        (0, 2, 2),
        (0, 2, 2),
    ]
    assert info["lag"] == 10


def items(page: dict) -> dict:
    return {tuple(v["key"]): v["value"] for v in page["values"]}


def test_state_as_of_an_older_txid_and_a_rewind_from_the_view(client, redis_url, home, monkeypatch):
    """With undo logs kept, the state browser reads values as of a retained txid, and an
    operator with edit rights rewinds the pipeline (403 without; 409 in one line outside
    the retained range, nothing changed): the runs of the rewound txids then read
    "rewound", and the pipeline page lists the rewind."""
    monkeypatch.setenv("TRIDENTFLOW_RETAIN_TXIDS", "3")
    rt = runtime("wordcount", redis_url, home)
    produce(rt, sentences(16))
    noted = {}
    for n in range(1, 5):
        coordinate_run(rt, f"manual__{n}", batch_size=1)
        emit_run(rt, f"manual__{n}", LocalEngine())
        commit_run(rt, f"manual__{n}")
        noted[n] = client.get("/api/pipelines/wordcount/state/counts/keys?limit=1000").json()
    detail = client.get("/api/pipelines/wordcount").json()
    assert detail["rewindable"] == {"oldest": 1, "newest": 4, "retain_txids": 3}
    as_of = client.get("/api/pipelines/wordcount/state/counts/keys?as_of=2").json()
    assert items(as_of) == items(noted[2]) != items(noted[4]) and as_of["committed_txid"] == 2
    word = noted[2]["values"][0]["key"][0]
    one = client.get("/api/pipelines/wordcount/state/counts", params={"key": word, "as_of": 2})
    assert one.json()["values"] == [noted[2]["values"][0]]

    monkeypatch.setattr(view, "may_edit_runs", lambda user, dag_id: False)
    assert client.post("/api/pipelines/wordcount/rewind?to=2").status_code == 403
    monkeypatch.setattr(view, "may_edit_runs", lambda user, dag_id: True)
    refused = client.post("/api/pipelines/wordcount/rewind?to=0")
    assert refused.status_code == 409
    assert refused.json()["detail"] == ("txid 0 is outside what the undo logs retain (txids 1..4)")
    done = client.post("/api/pipelines/wordcount/rewind?to=2")
    assert done.status_code == 200, done.text
    assert sorted(done.json()["runs_rewound"]) == ["manual__3", "manual__4"]
    after = client.get("/api/pipelines/wordcount").json()
    assert after["committed_txid"] == 2 and after["rewinds"][0]["to"] == 2
    listed = client.get("/api/pipelines/wordcount/state/counts/keys?limit=1000").json()
    assert items(listed) == items(noted[2])
    run = client.get("/api/runs/tridentflow_wordcount/manual__4").json()
    assert (run["status"], run["txid"], run["rewound_to"]) == ("rewound", 4, 2)


def test_an_operator_reshards_from_the_view_and_the_next_commits_land_in_the_new_shards(
    client, redis_url, home, monkeypatch
):
    """Reshard from the view: 403 without edit rights, 409 in one line when there is nothing
    to do (nothing changed); done, the pipeline's answer says 3 shards, the audit log gets
    an entry, and the txids after it commit exactly into the new layout."""
    rt = runtime("wordcount", redis_url, home)
    lines = sentences(12, seed=7)
    produce(rt, lines)
    for n in (1, 2):
        coordinate_run(rt, f"manual__{n}", batch_size=6)
        emit_run(rt, f"manual__{n}", LocalEngine())
        commit_run(rt, f"manual__{n}")
    assert client.get("/api/pipelines/wordcount").json()["shards"] == 1
    logged = []
    monkeypatch.setattr(view, "audit_log", lambda *a, **kw: logged.append((a, kw)))
    monkeypatch.setattr(view, "may_edit_runs", lambda user, dag_id: False)
    refused = client.post("/api/pipelines/wordcount/reshard?shards=3")
    assert refused.status_code == 403
    assert refused.json()["detail"].startswith("resharding a pipeline needs edit rights")
    monkeypatch.setattr(view, "may_edit_runs", lambda user, dag_id: True)
    same = client.post("/api/pipelines/wordcount/reshard?shards=1")
    assert same.status_code == 409
    assert same.json()["detail"] == "pipeline wordcount's state is in 1 shard(s) already"
    assert client.post("/api/pipelines/wordcount/reshard?shards=0").status_code == 422
    done = client.post("/api/pipelines/wordcount/reshard?shards=3")
    assert done.status_code == 200, done.text
    said = done.json()
    assert (said["from_shards"], said["to_shards"]) == (1, 3) and said["keys_copied"] > 0
    assert said["line"].startswith("reshard: pipeline wordcount moved from 1 to 3 shard(s)")
    ((_args, kwargs),) = logged
    assert kwargs == {"event": "tridentflow.reshard"} and _args[3]["to_shards"] == 3
    info = client.get("/api/pipelines/wordcount").json()
    assert (info["shards"], info["resharding"]) == (3, None)
    more = sentences(6, seed=8)
    produce(rt, more)
    rt = runtime("wordcount", redis_url, home)  # a fresh process: it reads the stored layout
    coordinate_run(rt, "manual__3", batch_size=6)
    emit_run(rt, "manual__3", LocalEngine())
    commit_run(rt, "manual__3")
    listed = client.get("/api/pipelines/wordcount/state/counts/keys?limit=1000").json()
    assert listed["committed_txid"] == 3
    assert {k[0]: v for k, v in items(listed).items()} == word_counts(lines + more)
    assert client.post("/api/pipelines/wordcount/audit").json()["line"] == "lost=0 doubled=0"


def test_settings_that_disagree_with_the_recorded_ones_are_shown_in_one_line(
    client, redis_url, home, monkeypatch
):
    """A component (here: the api-server) whose TRIDENTFLOW_RETAIN_TXIDS differs from the
    retention the pipeline's commits recorded: the pipeline's answer says so, and reads the
    recorded value (issue 36, item 6)."""
    monkeypatch.setenv("TRIDENTFLOW_RETAIN_TXIDS", "4")
    rt = runtime("wordcount", redis_url, home)
    produce(rt, sentences(6))
    coordinate_run(rt, "manual__1")
    emit_run(rt, "manual__1", LocalEngine())
    commit_run(rt, "manual__1")
    info = client.get("/api/pipelines/wordcount").json()
    assert info["settings"]["recorded"]["retain_txids"] == "4"
    assert info["settings"]["disagreements"] == [] and info["retain_txids"] == 4
    monkeypatch.setenv("TRIDENTFLOW_RETAIN_TXIDS", "1")
    info = client.get("/api/pipelines/wordcount").json()
    (line,) = info["settings"]["disagreements"]
    assert line.startswith("TRIDENTFLOW_RETAIN_TXIDS=1 in this process, but wordcount's commits")
    assert info["retain_txids"] == 4 and info["rewindable"]["retain_txids"] == 4


def test_the_views_docstring_lists_every_route_and_no_other():
    """The module docstring is the view's inventory: every route the app serves, and only
    those (methods included)."""
    from fastapi.routing import APIRoute

    served = {
        (method, f"/tridentflow{route.path}")
        for route in view.app.routes
        if isinstance(route, APIRoute)
        for method in route.methods
    }
    doc = view.__doc__ or ""
    listed = {
        (method, path) for method, path in re.findall(r"``(GET|POST)\s+(/tridentflow[^`?]*)", doc)
    }
    listed |= {("GET", path) for path in re.findall(r"``(/tridentflow/[a-z./]+)``", doc)}
    pages = re.findall(r"``/tridentflow/(\w+)\?", doc)  # a page with its query string
    listed |= {("GET", f"/tridentflow/{page}") for page in pages}
    assert served == listed, (served - listed, listed - served)
