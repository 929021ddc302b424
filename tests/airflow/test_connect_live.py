"""The live stack over Spark Connect (`tridentflow-airflow up --spark-connect`): a Connect
server killed mid-emit and kept away through every retry; once it is back, the next run commits
everything, with nobody clearing anything (issue 22, goal 1)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.airflow import live
from tests.airflow.live import view_json
from tests.helpers import runtime, sentences, word_counts
from tridentflow.devtools import connect_server, devredis
from tridentflow.ops.audit import audit
from tridentflow.steps.query import query
from tridentflow_airflow import launcher
from tridentflow_airflow.backfill_guard import backwards_refusal
from tridentflow_airflow.rest import AirflowApi

pytestmark = [pytest.mark.airflow, pytest.mark.spark, pytest.mark.xdist_group("connect-live")]
"""One worker runs this module's tests, on one stack (two stacks at once crowd 2 cores)."""
DAG = "tridentflow_wordcount"


@pytest.fixture(scope="module")
def connect_stack(tmp_path_factory) -> Iterator[tuple[AirflowApi, str, Path, int]]:
    home = tmp_path_factory.mktemp("connect-live-home")
    redis_port, connect_port = devredis.free_port(), devredis.free_port()
    server = devredis.start(redis_port, home / "redis")
    redis_url = f"redis://127.0.0.1:{redis_port}/0"
    env = {  # short retries and Connect deadlines: every try fails within seconds
        "TRIDENTFLOW_RETRY_DELAY_SECONDS": "1",
        "TRIDENTFLOW_RETRIES": "2",
        "TRIDENTFLOW_MAX_RETRY_DELAY_SECONDS": "1",
        "TRIDENTFLOW_CONNECT_TIMEOUT_S": "4",
        "TRIDENTFLOW_CONNECT_RETRY_S": "4",
    }
    try:
        with live.stack(home, redis_url, env, spark_connect=connect_port) as api:
            yield api, redis_url, home, connect_port
    finally:
        server.kill()


def kill_connect_server(home: Path, port: int) -> None:
    """SIGKILL the server's JVM (no graceful stop: a crash)."""
    pid_files = list(connect_server.state_dir(home).glob(f"*tridentflow-{port}*.pid"))
    assert len(pid_files) == 1, pid_files
    pid = int(pid_files[0].read_text().strip())
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while connect_server.answering(port):
        assert time.monotonic() < deadline, "the Connect server still answers after SIGKILL"
        time.sleep(0.2)


def counts(rt, words):
    persist = rt.pipeline.states["counts"]
    return dict(zip(words, query(rt, persist, [(w,) for w in words])[1], strict=True))


@pytest.mark.soak  # the soak lane, CI runs it after the suite (README)
def test_a_connect_server_killed_mid_emit_heals_with_nobody_clearing(connect_stack):
    api, redis_url, home, port = connect_stack
    ready = launcher.status(home, int(api.base.rsplit(":", 1)[1]))
    assert ready["spark_connect"]["answering"], ready  # `status` shows the Connect server
    rt = runtime("wordcount", redis_url, home)
    committed = rt.ledger.committed_txid()
    lines = sentences(20_000, seed=31)
    rt.source_heads()
    rt.log.append_spread(lines)
    doomed = api.trigger()
    live.wait_task_running(api, doomed, "emit")
    time.sleep(0.5)  # the emit's client is talking to the server (its first job: workers start)
    kill_connect_server(home, port)
    assert api.wait_run(doomed, timeout=300) == "failed"  # every try failed without a server
    emit = api.task(doomed, "emit")
    assert emit["try_number"] == 3, emit  # retries=2: the outage outlasted every retry
    assert rt.ledger.committed_txid() == committed

    connect_server.start(home, port, "local[2]")
    back = time.monotonic()
    healed = api.trigger()
    assert api.wait_run(healed, timeout=240) == "success"
    bound = api.xcom(healed, "coordinate")
    assert bound["txid"] == committed + 1, bound  # the failed run's txid, not a new one
    heads = rt.log.heads()  # the rest in the next runs (the DAG's batch size caps a txid)
    while rt.ledger.committed_offsets() != heads:
        assert api.wait_run(api.trigger(), timeout=240) == "success"
        assert time.monotonic() - back < 180, rt.ledger.committed_offsets()
    took = time.monotonic() - back
    expected = word_counts(lines)
    assert counts(rt, sorted(expected)) == expected
    assert audit(rt).ok
    assert took < 120, f"{took:.0f}s from the Connect server back to everything committed"


ON_DATA = "tridentflow_wordcount_on_data"


def committed_all(rt, timeout: float) -> float:
    """Seconds until every record in the source is committed (AssertionError past
    ``timeout``): nobody triggers anything, the watcher does."""
    started = time.monotonic()
    while rt.ledger.committed_offsets() != rt.log.heads():
        assert time.monotonic() - started < timeout, (
            f"not committed within {timeout:.0f}s: {rt.ledger.committed_offsets()} of "
            f"{rt.log.heads()}"
        )
        time.sleep(0.2)
    return time.monotonic() - started


@pytest.mark.soak  # the soak lane, CI runs it after the suite (README)
def test_on_data_runs_when_records_arrive_through_a_triggerer_crash_and_merged_bursts(
    connect_stack,
):
    """issue 38, goal 1: the on-data DAG's watcher starts runs as records arrive - a trickle,
    a burst while the triggerer is down (SIGKILL, restarted), two bursts close together that
    Airflow merges - with nobody triggering; every record in exactly one txid."""
    api, redis_url, home, _port = connect_stack
    rt = runtime("wordcount-opaque", redis_url, home)
    produced = sentences(5, seed=40)
    rt.source_heads()
    rt.log.append_spread(produced)
    api.wait_for_dag(ON_DATA)
    api.pause(ON_DATA, paused=False)
    try:
        committed_all(rt, timeout=180)  # the first run pays the DAG's first parse and Spark
        trickle = sentences(3, seed=41)
        rt.log.append_spread(trickle)
        produced += trickle
        took = committed_all(rt, timeout=120)

        launcher.restart(home, "triggerer", grace=0)  # a crash; the watcher comes back
        burst = sentences(2_000, seed=42)
        rt.log.append_spread(burst)
        produced += burst
        committed_all(rt, timeout=180)

        for seed in (43, 44):  # two bursts while one run is on the first: merged
            more = sentences(1_000, seed=seed)
            rt.log.append_spread(more)
            produced += more
            time.sleep(0.5)
        committed_all(rt, timeout=180)
    finally:
        api.pause(ON_DATA)
    runs = api.call("GET", f"/dags/{ON_DATA}/dagRuns?limit=100")["dag_runs"]
    assert runs and {r["run_type"] for r in runs} == {"asset_triggered"}, runs
    assert all(r["state"] in ("success", "running", "queued") for r in runs), runs
    # the view knows the DAG from its declaration (its id is not tridentflow_<pipeline>, and
    # the continuous DAG runs the same pipeline): the run tab, the txid page's runs
    done = next(r["dag_run_id"] for r in runs if r["state"] == "success")
    tab = view_json(api, f"runs/{ON_DATA}/{urllib.parse.quote(done, safe='')}")
    assert (tab["pipeline"], tab["status"]) == ("wordcount-opaque", "committed"), tab
    page = view_json(api, f"pipelines/wordcount-opaque/txids/{tab['txid']}")
    assert page["dag_id"] == ON_DATA and page["runs"][0]["state"] == "success", page
    assert set(view_json(api, "pipelines/wordcount-opaque")["dag_ids"]) >= {
        ON_DATA,
        "tridentflow_wordcount_continuous",
    }
    expected = word_counts(produced)
    assert counts(rt, sorted(expected)) == expected
    assert audit(rt).ok
    print(f"on-data: a trickle of 3 records committed {took:.1f}s after it was appended")


SCHEDULED = "tridentflow_partitioned_count"
"""A DAG on a time-based schedule (every 10 minutes): what a backfill is for."""


def runs_of(api: AirflowApi, dag_id: str, run_type: str) -> list[dict]:
    """The DAG's runs of ``run_type``, by logical date."""
    found = api.call("GET", f"/dags/{dag_id}/dagRuns?limit=100")["dag_runs"]
    return sorted((r for r in found if r["run_type"] == run_type), key=lambda r: r["logical_date"])


def wait_backfill(api: AirflowApi, backfill_id: int, timeout: float = 240) -> None:
    """Until Airflow marks the backfill complete (every run of it finished)."""
    deadline = time.monotonic() + timeout
    while api.call("GET", f"/backfills/{backfill_id}")["completed_at"] is None:
        assert time.monotonic() < deadline, api.call("GET", f"/backfills/{backfill_id}")
        time.sleep(1)


def create_backfill(api: AirflowApi, body: dict, tries: int = 10) -> dict:
    """POST /backfills with the DAG paused (no scheduler at work on it meanwhile), unpaused
    after. Airflow answers 503 ("Database is locked") when SQLite - the live stack's metadata
    DB - is busy: the backfill's row is written before the lock and its runs rolled back, so
    that empty backfill is cancelled and the POST tried again."""
    api.pause(body["dag_id"])
    try:
        for _ in range(tries - 1):
            try:
                return api.call("POST", "/backfills", body)
            except urllib.error.HTTPError as exc:
                if exc.code != 503:
                    raise
            cancel_unfinished_backfills(api, body["dag_id"])
            time.sleep(1)
        return api.call("POST", "/backfills", body)
    finally:
        api.pause(body["dag_id"], paused=False)  # a paused DAG's backfill runs do not start


def cancel_unfinished_backfills(api: AirflowApi, dag_id: str) -> None:
    """Cancel the DAG's backfills still open: one a locked SQLite left without its runs."""
    for backfill in api.call("GET", f"/backfills?dag_id={dag_id}")["backfills"]:
        if backfill["completed_at"] is None:
            api.call("PUT", f"/backfills/{backfill['id']}/cancel")


def refused(api: AirflowApi, route: str, body: dict) -> tuple[int, object]:
    """(status, detail) of a POST Airflow's API refuses."""
    with pytest.raises(urllib.error.HTTPError) as answer:
        api.call("POST", route, body)
    return answer.value.code, json.loads(answer.value.read())["detail"]


def total(rt) -> int:
    persist = rt.pipeline.states["total"]
    return int(query(rt, persist, [()])[1][0] or 0)


def test_a_backfill_from_the_rest_api_binds_txids_in_date_order_and_replays_completed_runs(
    connect_stack,
):
    """issue 38, goal 3: a backwards backfill is refused in one line where the API creates it;
    a forward one with three active runs binds its txids in date order; re-running its
    completed runs replays their txids as no-ops (no Spark job); every record once."""
    api, redis_url, home, _ = connect_stack
    rt = runtime("partitioned-count", redis_url, home)
    rt.source_heads()
    rt.log.append_spread([f"event-{i}" for i in range(240)])
    window = {
        "dag_id": SCHEDULED,
        "from_date": "2026-11-20T00:00:00Z",
        "to_date": "2026-11-20T00:20:00Z",
        "max_active_runs": 3,
        "dag_run_conf": {"batch_size": 5},  # 80 records a txid: each run has work
    }
    for route in ("/backfills", "/backfills/dry_run"):
        for backwards in (True, "true", 1, "yes"):  # whatever Airflow itself reads as true
            status, detail = refused(api, route, {**window, "run_backwards": backwards})
            assert (status, detail) == (422, backwards_refusal(SCHEDULED)), (route, backwards)
    assert api.call("GET", f"/backfills?dag_id={SCHEDULED}")["total_entries"] == 0
    anonymous = AirflowApi.__new__(AirflowApi)  # no token: Airflow's own answer, not ours
    anonymous.base, anonymous.token = api.base, "not-a-token"
    status, detail = refused(anonymous, "/backfills", {**window, "run_backwards": True})
    assert status in (401, 403) and detail != backwards_refusal(SCHEDULED)

    created = create_backfill(api, window)
    try:
        wait_backfill(api, created["id"])
        backfilled = runs_of(api, SCHEDULED, "backfill")
        assert [r["state"] for r in backfilled] == ["success"] * 3
        txids = [rt.ledger.txid_of_run(r["dag_run_id"]) for r in backfilled]
        assert txids == sorted(txids) and len(set(txids)) == 3, txids  # in date order
        counted = total(rt)
        assert audit(rt).ok

        again = create_backfill(api, {**window, "reprocess_behavior": "completed"})
        wait_backfill(api, again["id"])
        replayed = runs_of(api, SCHEDULED, "backfill")
        assert [r["dag_run_id"] for r in replayed] == [r["dag_run_id"] for r in backfilled]
        for run, txid in zip(replayed, txids, strict=True):
            assert run["state"] == "success"
            bound = api.xcom(run["dag_run_id"], "coordinate", SCHEDULED)
            assert (bound["txid"], bound["binding"]) == (txid, "committed")
            emitted = api.xcom(run["dag_run_id"], "emit", SCHEDULED)
            assert emitted["status"] == "already-committed"  # no Spark job
            assert rt.ledger.txid_of_run(run["dag_run_id"]) == txid
        assert total(rt) == counted  # (a scheduled run of the unpaused DAG may commit too)
    finally:
        api.pause(SCHEDULED)
    while rt.ledger.committed_offsets() != rt.log.heads():  # the rest, in runs of no date
        assert api.wait_run(api.trigger(SCHEDULED), timeout=120, dag_id=SCHEDULED) == "success"
    assert total(rt) == 240
    assert audit(rt).ok


def test_a_backwards_backfill_from_the_cli_is_refused_run_by_run(connect_stack):
    """The CLI creates a backfill in-process, past the API server: each run whose earlier
    date is still queued is refused by its coordinator, in one line, binding nothing."""
    api, redis_url, home, _ = connect_stack
    rt = runtime("partitioned-count", redis_url, home)
    before = {r["dag_run_id"] for r in runs_of(api, SCHEDULED, "backfill")}
    for _ in range(10):  # SQLite, the live stack's metadata DB, may be busy: tried again
        created = subprocess.run(
            ["airflow", "backfill", "create", "--dag-id", SCHEDULED,
             "--from-date", "2026-11-19T00:00:00+00:00", "--to-date", "2026-11-19T00:20:00+00:00",
             "--run-backwards", "--max-active-runs", "1"],
            env=launcher.component_env(home), capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        if "database is locked" not in created.stderr:
            break
        cancel_unfinished_backfills(api, SCHEDULED)
        before = {r["dag_run_id"] for r in runs_of(api, SCHEDULED, "backfill")}
    assert created.returncode == 0, created.stdout + created.stderr
    api.pause(SCHEDULED, paused=False)  # created while paused: no scheduler at work on it
    try:
        runs = [r for r in runs_of(api, SCHEDULED, "backfill") if r["dag_run_id"] not in before]
        assert len(runs) == 3
        for run in runs:
            api.wait_run(run["dag_run_id"], timeout=180, dag_id=SCHEDULED)
    finally:
        api.pause(SCHEDULED)
    runs = [api.run(r["dag_run_id"], SCHEDULED) for r in runs]
    assert [r["state"] for r in runs] == ["success", "failed", "failed"]  # by date
    for run in runs[1:]:
        assert rt.ledger.txid_of_run(run["dag_run_id"]) is None
        coordinate = api.task(run["dag_run_id"], "coordinate", SCHEDULED)
        last = coordinate["try_number"]  # the refusal is the last try: it is not retried
        log = api.call(
            "GET",
            f"/dags/{SCHEDULED}/dagRuns/{urllib.parse.quote(run['dag_run_id'], safe='')}"
            f"/taskInstances/coordinate/logs/{last}?full_content=true",
        )
        assert "is still queued before it: a backfill that runs backwards" in json.dumps(log)
    assert audit(rt).ok
