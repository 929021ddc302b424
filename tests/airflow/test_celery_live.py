"""A live run on a real distributed executor: Airflow with the CeleryExecutor (RabbitMQ, this
machine's, as the broker; the metadata DB as the result backend) and two Celery workers that
share nothing but Redis - each its own TRIDENTFLOW_HOME, a Redis Streams source (no file to
share), staging in Redis (the default). The DAG routes each step to a worker's queue, so the
emit runs on one worker and the commit on the other (asserted from Airflow's task instances:
each worker names itself through ``[core] hostname_callable``). Then what an operator does to
such a deployment: clear an emit and a commit from the REST API as the UI does, kill a worker
mid-emit (the whole process group: the worker, its task, its spark-submit) and bring it back.
Exact counts and a clean audit throughout; nothing staged in either home."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.airflow import live
from tests.helpers import runtime, sentences, word_counts
from tests.test_outage import counts
from tridentflow.devtools import devredis
from tridentflow.ops.audit import audit
from tridentflow_airflow import launcher

pytestmark = [pytest.mark.airflow, pytest.mark.spark]

DAG = "counts_on_celery"
IDENTITY = """import os


def hostname():
    return os.environ["TF_WORKER_NAME"]
"""


def rabbitmq_up() -> bool:
    with socket.socket() as sock:
        sock.settimeout(2)
        return sock.connect_ex(("127.0.0.1", 5672)) == 0


class Worker:
    """``airflow celery worker`` serving ``queues``, with a home of its own, in its own
    process group (killed whole, as a lost machine or a killed pod)."""

    def __init__(self, name: str, home: Path, env: dict[str, str], queues: str, tmp: Path):
        self.name, self.queues, self.tmp = name, queues, tmp
        self.env = {
            **env,
            "TRIDENTFLOW_HOME": str(home),
            "TF_WORKER_NAME": name,
            "AIRFLOW__CORE__HOSTNAME_CALLABLE": "worker_identity.hostname",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp), env.get("PYTHONPATH")])),
        }
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        log = (self.tmp / f"{self.name}.log").open("ab")
        self.proc = subprocess.Popen(
            ["airflow", "celery", "worker", "--queues", self.queues, "--concurrency", "2",
             "--celery-hostname", f"{self.name}@%h", "--skip-serve-logs", "--without-gossip",
             "--without-mingle"],
            env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip

    def kill(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        """After the test: its tasks are over, nothing to wait for (a warm shutdown takes
        seconds)."""
        if self.proc is not None and self.proc.poll() is None:
            self.kill()


@pytest.fixture
def celery_stack(tmp_path: Path) -> Iterator[tuple]:
    if not rabbitmq_up():
        pytest.fail("no RabbitMQ at 127.0.0.1:5672: these machines run one (the Celery broker)")
    tag = uuid.uuid4().hex[:8]
    queue = {"a": f"tf-{tag}-a", "b": f"tf-{tag}-b", "default": f"tf-{tag}-default"}
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "counts_on_celery.py").write_text(
        "from tridentflow_airflow import pipeline_dag\n\n"
        f"dag = pipeline_dag('wordcount-stream', dag_id={DAG!r}, schedule=None, queues="
        f"{{'coordinate': {queue['a']!r}, 'emit': {queue['a']!r}, 'commit': {queue['b']!r}}})\n"
    )
    (tmp_path / "worker_identity.py").write_text(IDENTITY)
    home = tmp_path / "scheduler-home"
    redis_port = devredis.free_port()
    redis_proc = devredis.start(redis_port, tmp_path / "redis", appendonly=False)
    redis_url = f"redis://127.0.0.1:{redis_port}/0"
    metadata, _why = launcher.metadata_db(home)
    assert metadata.startswith("postgresql"), "the live Celery run needs the local PostgreSQL"
    env = {
        "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CELERY__BROKER_URL": "amqp://guest:guest@127.0.0.1:5672//",
        "AIRFLOW__CELERY__RESULT_BACKEND": "db+" + metadata,
        "AIRFLOW__OPERATORS__DEFAULT_QUEUE": queue["default"],
        "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "20",
        "TRIDENTFLOW_RETRIES": "4",
        "TRIDENTFLOW_RETRY_DELAY_SECONDS": "1",
        "TRIDENTFLOW_MAX_RETRY_DELAY_SECONDS": "2",
    }
    workers: list[Worker] = []
    try:
        with live.stack(home, redis_url, env, dag=DAG) as api:
            component = launcher.component_env(home)
            workers = [
                Worker("worker-a", tmp_path / "home-a", component,
                       f"{queue['a']},{queue['default']}", tmp_path),
                Worker("worker-b", tmp_path / "home-b", component,
                       f"{queue['b']},{queue['default']}", tmp_path),
            ]  # fmt: skip
            for worker in workers:
                worker.start()
            api.wait_for_dag(DAG, timeout=180)
            api.pause(DAG, paused=False)
            yield api, redis_url, tmp_path, workers
    finally:
        for worker in workers:
            worker.stop()
        redis_proc.terminate()
        redis_proc.wait(timeout=10)


def clear(api, run_id: str, task: str, downstream: bool) -> None:
    """Clear one task of a finished run from the REST API, as the UI's Clear does."""
    api.call("POST", f"/dags/{DAG}/clearTaskInstances",
             {"dry_run": False, "dag_run_id": run_id, "task_ids": [task], "only_failed": False,
              "include_downstream": downstream, "reset_dag_runs": True})  # fmt: skip


def wait_try(api, run_id: str, task: str, tries: int, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while True:
        ti = api.task(run_id, task, dag_id=DAG)
        done = ti["try_number"] >= tries and ti["state"] in ("success", "failed")
        if done and api.run(run_id, dag_id=DAG)["state"] in ("success", "failed"):
            return
        assert time.monotonic() < deadline, ti
        time.sleep(1)


@pytest.mark.soak  # the soak lane, CI runs it after the suite (README)
def test_two_celery_workers_that_share_only_redis_commit_exactly_through_clears_and_a_kill(
    celery_stack,
):
    api, redis_url, tmp_path, (worker_a, _worker_b) = celery_stack
    rt = runtime("wordcount-stream", redis_url, tmp_path / "producer-home")
    produced = sentences(300, seed=61)
    rt.log.append_spread(produced)

    run1 = api.trigger(DAG)
    assert api.wait_run(run1, timeout=300, dag_id=DAG) == "success", api.task(run1, "emit", DAG)

    hosts = {t: api.task(run1, t, dag_id=DAG)["hostname"] for t in ("coordinate", "emit", "commit")}
    assert hosts == {"coordinate": "worker-a", "emit": "worker-a", "commit": "worker-b"}, hosts
    expected = word_counts(produced)
    assert counts(rt, sorted(expected)) == expected

    clear(api, run1, "emit", downstream=True)  # the emit and the commit again, same txid
    wait_try(api, run1, "commit", tries=2)
    assert api.xcom(run1, "commit", dag_id=DAG)["status"] == "already-committed"
    clear(api, run1, "commit", downstream=False)  # the commit alone
    wait_try(api, run1, "commit", tries=3)
    assert api.run(run1, dag_id=DAG)["state"] == "success"
    assert counts(rt, sorted(expected)) == expected

    more = sentences(2_000, seed=62)
    rt.log.append_spread(more)
    produced += more
    run2 = api.trigger(DAG)
    live.wait_task_running(api, run2, "emit", dag_id=DAG)
    time.sleep(2)  # into the emit: its spark-submit is reading
    worker_a.kill()  # the worker, its task, its Spark job: gone at once
    worker_a.start()  # the machine comes back (its home is as it was; nothing in it matters)
    assert api.wait_run(run2, timeout=420, dag_id=DAG) == "success", api.task(run2, "emit", DAG)
    assert api.task(run2, "emit", dag_id=DAG)["try_number"] >= 2  # the killed try, retried
    expected = word_counts(produced)
    assert counts(rt, sorted(expected)) == expected
    assert audit(rt).ok
    for home in ("home-a", "home-b"):  # staged in Redis: no worker's disk holds any of it
        assert not (tmp_path / home / "staging").exists(), home
    assert not any(k for k in rt.client.scan_iter(match=rt.keyspace.pattern) if b":staged:" in k)
    print(
        json.dumps(
            {"hosts": hosts, "emit_tries_after_kill": api.task(run2, "emit", DAG)["try_number"]}
        ),
        file=sys.stderr,
    )
