"""Against a real Redis Cluster with replicas (3 masters + 3 replicas, asynchronous
replication): a commit with --wait-replicas succeeds only once a replica has its mark, so
killing the master right after loses nothing the step reported; a commit whose WAIT falls short
fails in one line and its retry redoes nothing; a commit killed half-way whose master is then
killed replays exactly on the promoted replica."""

from __future__ import annotations

import pytest
import redis

from tests.conftest import SEED_COUNTS, SEED_SENTENCES
from tests.redis_cluster import LocalCluster


@pytest.fixture
def replicated(tmp_path_factory):
    """A cluster of its own per test: each kills a master."""
    started = LocalCluster(tmp_path_factory.mktemp("redis-failover"), replicas=1).start()
    yield started
    started.stop()


def alive_url(cluster: LocalCluster, not_port: int) -> str:
    port = next(p for p in cluster.ports if p != not_port and cluster.process(p).poll() is None)
    return f"redis://127.0.0.1:{port}/0"


def counts(tf, pipeline: str, env: dict) -> dict[str, int]:
    out = tf("query", pipeline, *SEED_COUNTS, env=env)
    assert out.returncode == 0, out.stderr
    return {w: int(n) for w, n in (line.split("\t") for line in out.stdout.splitlines())}


def test_a_waited_commit_survives_its_master_being_killed_at_once(tf, replicated, tmp_path):
    cluster = replicated
    env = {"TRIDENTFLOW_REDIS_URL": cluster.url(0), "TRIDENTFLOW_HOME": str(tmp_path / "h")}
    seeds = "\n".join(SEED_SENTENCES) + "\n"
    assert tf("produce", "wordcount", "-", input=seeds * 4, env=env).returncode == 0
    ran = tf("run", "wordcount", "--engine", "local", "--batch-size", "1",
             "--wait-replicas", "1", env=env)  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    ledger = "tf:{wordcount}:ledger"
    master = cluster.master_of(ledger)
    committed = int(redis.Redis(port=master).hget(ledger, "committed"))
    assert committed == 3  # 12 sentences over 4 partitions, one per partition per txid
    assert cluster.replicas_of(master)

    cluster.kill(master)  # at once: no time for replication that WAIT did not already see
    promoted = cluster.wait_promoted(ledger, master)
    env["TRIDENTFLOW_REDIS_URL"] = alive_url(cluster, master)
    assert int(redis.Redis(port=promoted).hget(ledger, "committed")) == committed
    assert counts(tf, "wordcount", env) == {w: 4 * n for w, n in SEED_COUNTS.items()}

    # the promoted master has no replica left: a commit that asks for one fails in one line,
    # stands on the master, and its retry (without the wait) redoes nothing
    assert tf("produce", "wordcount", "-", input=seeds, env=env).returncode == 0
    short = tf("run", "wordcount", "--engine", "local", "--batches", "1", "--wait-replicas",
               "1", env={**env, "TRIDENTFLOW_WAIT_TIMEOUT_MS": "300"})  # fmt: skip
    assert short.returncode == 1
    line = short.stderr.strip().splitlines()[-1]
    assert "is committed on the Redis master but only 0 of 1 replica(s) acknowledged" in line
    assert int(redis.Redis(port=promoted).hget(ledger, "committed")) == committed + 1
    again = tf("run", "wordcount", "--engine", "local", env=env)
    assert again.returncode == 0, again.stderr
    assert counts(tf, "wordcount", env) == {w: 5 * n for w, n in SEED_COUNTS.items()}
    assert tf("audit", "wordcount", env=env).stdout.strip() == "lost=0 doubled=0"


def test_a_half_done_commit_replays_exactly_on_the_promoted_replica(tf, replicated, tmp_path):
    cluster = replicated
    env = {"TRIDENTFLOW_REDIS_URL": cluster.url(1), "TRIDENTFLOW_HOME": str(tmp_path / "h")}
    seeds = "\n".join(SEED_SENTENCES * 50) + "\n"
    assert tf("produce", "wordcount-opaque", "-", input=seeds, env=env).returncode == 0
    ledger = "tf:{wordcount-opaque}:ledger"
    killed = tf("run", "wordcount-opaque", "--engine", "local", "--faults",
                "mid-commit@1=kill", env=env)  # fmt: skip
    assert killed.returncode in (-9, 137), killed.stderr
    master = cluster.master_of(ledger)
    written = redis.Redis(port=master)
    assert written.hget(ledger, "committed") in (None, b"0")
    assert written.exists("tf:{wordcount-opaque}:state:counts")  # the first half is there
    cluster.kill(master)
    cluster.wait_promoted(ledger, master)
    env["TRIDENTFLOW_REDIS_URL"] = alive_url(cluster, master)
    resumed = tf("run", "wordcount-opaque", "--engine", "local", env=env)
    assert resumed.returncode == 0, resumed.stderr
    out = tf("query", "wordcount-opaque", *SEED_COUNTS, env=env)
    got = {w: int(n) for w, n in (line.split("\t") for line in out.stdout.splitlines())}
    assert got == {w: 50 * n for w, n in SEED_COUNTS.items()}
    assert tf("audit", "wordcount-opaque", env=env).stdout.strip() == "lost=0 doubled=0"
