"""A real Spark standalone cluster (tridentflow.devtools.devspark: a master and two workers from
the pip package): the word count through the CLI (``--master``) and through the Airflow emit task
(``{"conn_type":"spark","host":"spark://127.0.0.1","port":P}``), with one worker and its
executor SIGKILLed while the emit's Python tasks run (staging in Redis: the executors were
writing the txid's blocks). The txid completes on the other worker (or is retried by Airflow)
with the same txid, and the counts are exact. Then a worker whose
host lacks the shared home (a private mount namespace) fails the batch in one line."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from tests.helpers import produce, runtime, sentences, word_counts
from tridentflow.devtools import devredis
from tridentflow.devtools.devspark import StandaloneCluster
from tridentflow.ops.audit import audit
from tridentflow.steps.query import query
from tridentflow_airflow import launcher

pytestmark = [pytest.mark.airflow, pytest.mark.spark, pytest.mark.xdist_group("cluster")]


def counts(rt, words):
    persist = rt.pipeline.states["counts"]
    return dict(zip(words, query(rt, persist, [(w,) for w in words])[1], strict=True))


@pytest.fixture
def cluster(tmp_path):
    started = StandaloneCluster(tmp_path / "spark-cluster").start(workers=2, cores=1)
    yield started
    started.stop()


@pytest.mark.soak  # the soak lane, CI runs it after the suite (README)
def test_a_standalone_cluster_with_a_worker_killed_mid_emit(
    cluster, redis_url, redis_client, home, tf
):
    rt = runtime("wordcount", redis_url, home)
    first = sentences(2000, seed=11)
    produce(rt, first)
    ran = tf("run", "wordcount", "--master", cluster.url, "--no-progress")
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert counts(rt, list(word_counts(first))) == word_counts(first)
    assert rt.ledger.committed_txid() == 1

    env = launcher.airflow_env(home, redis_url, port=devredis.free_port())
    env["AIRFLOW_CONN_SPARK_DEFAULT"] = json.dumps(
        {"conn_type": "spark", "host": "spark://127.0.0.1", "port": cluster.port}
    )
    env["TRIDENTFLOW_RETRY_DELAY_SECONDS"] = "1"
    env["TRIDENTFLOW_RETRIES"] = "2"  # a failure shows in seconds, not minutes
    env["TRIDENTFLOW_MAX_RETRY_DELAY_SECONDS"] = "1"
    env.pop("TRIDENTFLOW_FAULTS", None)
    # staged in Redis by the executors themselves: the killed worker's tasks were writing blocks
    env["TRIDENTFLOW_STAGING"] = "redis"
    env["TRIDENTFLOW_DRIVER_STAGING_RECORDS"] = "0"
    launcher.migrate(env)
    second = sentences(40_000, seed=12)
    produce(rt, second)
    dag = subprocess.Popen(
        # one txid of all 40,000 records (10,000 per partition): a long enough emit
        ["airflow", "dags", "test", "tridentflow_wordcount", "-c", '{"batch_size": 10000}'],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 300
    while not cluster.running_python_tasks(0):
        assert dag.poll() is None, "the emit ended before worker 0 ran a task"
        assert time.monotonic() < deadline, "worker 0 never ran a Python task"
        time.sleep(0.05)
    cluster.kill_worker(0)
    killed_mid_emit = dag.poll() is None
    out, _ = dag.communicate(timeout=600)
    assert dag.returncode == 0 and "state=success" in out.split("DagRun Finished")[-1], out[-4000:]
    assert killed_mid_emit
    expected = word_counts(first + second)
    assert counts(rt, list(expected)) == expected
    assert rt.ledger.committed_txid() == 2  # the DAG run's one txid, whatever was replayed
    assert audit(rt).ok
    assert '"staging": "redis (executors)"' in out, out[-4000:]
    assert not rt.client.exists(rt.keyspace.staged_manifests(rt.ledger.generation, 2))

    # A worker on a host without the shared home (an empty tmpfs covers it): its executor says
    # so in one line, and nothing is committed.
    probe = subprocess.run(["unshare", "--mount", "true"], capture_output=True, text=True)
    assert probe.returncode == 0, (
        f"a worker without the share needs unshare --mount (root, as on CI): {probe.stderr.strip()}"
    )
    cluster.kill_worker(1)
    cluster.add_worker(hide=home)
    deadline = time.monotonic() + 90
    while not (len(cluster.state()["workers"]) == 3 and cluster.alive_workers() == 1):
        assert time.monotonic() < deadline, cluster.state()["workers"]
        time.sleep(0.5)
    produce(rt, sentences(100, seed=13))
    blind = tf("run", "wordcount", "--master", cluster.url, "--no-progress")
    # (the JVM itself may print "WARNING: Using incubator modules" first)
    lines = [line for line in blind.stderr.splitlines() if not line.startswith("WARNING: ")]
    assert blind.returncode == 1 and len(lines) == 1, blind.stderr[-3000:]
    assert (
        f"the source log {home / 'sources' / 'wordcount'} is not visible on this Spark" in lines[0]
    )
    assert "TRIDENTFLOW_HOME must be on storage every Spark worker mounts" in lines[0]
    assert rt.ledger.committed_txid() == 2 and counts(rt, list(expected)) == expected
