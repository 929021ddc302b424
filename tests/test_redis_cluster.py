"""Against a real local Redis Cluster (3 masters): a URL naming any node is detected as a
cluster, and every step of the word count - and a state query that reads the state from its
read tasks - runs unchanged, each pipeline's keys in one slot (one hash tag); with state
shards, one pipeline's state on every master; the chaos harness's seeds against the cluster."""

from __future__ import annotations

import json

import pytest
import redis

from tests.conftest import SEED_COUNTS, SEED_SENTENCES
from tridentflow.devtools.chaos import run_chaos, schedule_shards
from tridentflow.devtools.devcluster import LocalCluster
from tridentflow.redisconn import connect
from tridentflow_state.keys import KeySpace

pytestmark = pytest.mark.servers


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    started = LocalCluster(tmp_path_factory.mktemp("redis-cluster")).start()
    yield started
    started.stop()


def test_the_word_count_runs_on_a_redis_cluster(tf, cluster, tmp_path):
    client = connect(cluster.url(1))
    assert isinstance(client, redis.RedisCluster)
    client.flushall()  # the module's cluster is shared: the chaos seeds' wordcount had sinks
    env = {"TRIDENTFLOW_REDIS_URL": cluster.url(1), "TRIDENTFLOW_HOME": str(tmp_path / "h")}
    for pipeline in ("wordcount", "wordcount-opaque"):
        produced = tf("produce", pipeline, "-", input="\n".join(SEED_SENTENCES) + "\n", env=env)
        assert produced.returncode == 0, produced.stderr
        ran = tf("run", pipeline, "--engine", "local", "--batch-size", "1", env=env)
        assert ran.returncode == 0, ran.stderr
        out = tf("query", pipeline, *SEED_COUNTS, "--json", env=env)
        rows = json.loads(out.stdout)["values"]
        assert {r["key"][0]: r["value"] for r in rows} == SEED_COUNTS
        assert tf("audit", pipeline, env=env).stdout.strip() == "lost=0 doubled=0"
    slots = {client.keyslot(k) for k in client.scan_iter(match="tf:*")}
    assert len(slots) == 2  # one slot per pipeline: every script's keys on one node

    drpc = {**env, "TRIDENTFLOW_REDIS_URL": cluster.url(2)}
    lines = [json.dumps({"kind": "sentence", "text": s}) for s in SEED_SENTENCES]
    tf("produce", "wordcount-drpc", "-", "--json", input="\n".join(lines) + "\n", env=drpc)
    assert tf("run", "wordcount-drpc", "--engine", "local", env=drpc).returncode == 0
    query = json.dumps({"kind": "query", "text": "how are you"})
    tf("produce", "wordcount-drpc", "-", "--json", input=query + "\n", env=drpc)
    assert tf("run", "wordcount-drpc", "--engine", "local", env=drpc).returncode == 0
    answer = tf("query", "wordcount-drpc", "--state", "answers", "how are you", env=drpc)
    assert answer.stdout.split("\t")[-1].strip() == "4", answer.stdout + answer.stderr

    reset = tf("reset", "wordcount", "--yes", env=env)
    assert reset.returncode == 0, reset.stderr
    starts = (b"generation", b"sinks-allowed")  # what a new generation starts with
    assert not [
        k for k in client.scan_iter(match="tf:{wordcount}:*") if not any(s in k for s in starts)
    ]
    assert client.exists("tf:{wordcount-opaque}:ledger")


def test_a_cluster_node_with_a_database_index_is_a_clear_error(tf, cluster):
    url = cluster.url(0)[:-1] + "3"
    out = tf("status", "wordcount", env={"TRIDENTFLOW_REDIS_URL": url})
    assert out.returncode == 1 and "a cluster has only database 0" in out.stderr


def test_an_acl_user_runs_its_pipeline_on_a_cluster(tf, cluster, tmp_path):
    """`tridentflow acl wordcount --cluster`, set on every node, is all a user needs on a
    cluster: every step of the word count runs, staging in Redis next to its 3 shards; another
    pipeline is refused in one line."""
    from tridentflow.ops import acl

    printed = tf("acl", "wordcount", "--cluster", "--namespace", "acl").stdout.strip()
    assert printed == acl.rules("wordcount", "acl", cluster=True) and "+cluster|slots" in printed
    for port in cluster.ports:
        cluster.node(port).execute_command(
            "ACL", "SETUSER", "tf-wc", "on", ">pw-wc", *printed.split()
        )
    url = f"redis://tf-wc:pw-wc@127.0.0.1:{cluster.ports[2]}/0"
    # staged in Redis: its blocks on every shard's master, under the same rules
    env = {"TRIDENTFLOW_REDIS_URL": url, "TRIDENTFLOW_HOME": str(tmp_path / "h"),
           "TRIDENTFLOW_NAMESPACE": "acl", "TRIDENTFLOW_STATE_SHARDS": "3",
           "TRIDENTFLOW_STAGING": "redis"}  # fmt: skip
    assert isinstance(connect(url), redis.RedisCluster)
    produced = tf("produce", "wordcount", "-", input="\n".join(SEED_SENTENCES) + "\n", env=env)
    assert produced.returncode == 0, produced.stderr
    for step in (("run", "wordcount", "--engine", "local", "--batch-size", "1"),
                 ("status", "wordcount"), ("query", "wordcount", "--all"),
                 ("reset", "wordcount", "--yes")):  # fmt: skip
        out = tf(*step, env=env)
        assert out.returncode == 0, (step, out.stderr)
    refused = tf("status", "wordcount-opaque", env=env)
    assert refused.returncode == 1 and len(refused.stderr.strip().splitlines()) == 1
    assert "has no permission on the keys of pipeline 'wordcount-opaque'" in refused.stderr


def test_state_shards_put_one_pipelines_state_on_every_master(tf, cluster, tmp_path):
    env = {"TRIDENTFLOW_REDIS_URL": cluster.url(0), "TRIDENTFLOW_HOME": str(tmp_path / "h"),
           "TRIDENTFLOW_STATE_SHARDS": "3", "TRIDENTFLOW_NAMESPACE": "sharded"}  # fmt: skip
    produced = tf("produce", "wordcount-opaque", "-", input="\n".join(SEED_SENTENCES) + "\n",
                  env=env)  # fmt: skip
    assert produced.returncode == 0, produced.stderr
    ran = tf("run", "wordcount-opaque", "--engine", "local", "--batch-size", "2", env=env)
    assert ran.returncode == 0, ran.stderr
    rows = json.loads(tf("query", "wordcount-opaque", *SEED_COUNTS, "--json", env=env).stdout)
    assert {r["key"][0]: r["value"] for r in rows["values"]} == SEED_COUNTS
    listed = json.loads(tf("query", "wordcount-opaque", "--all", "--json", env=env).stdout)
    assert {r["key"][0]: r["value"] for r in listed["values"]} == SEED_COUNTS
    assert tf("audit", "wordcount-opaque", env=env).stdout.strip() == "lost=0 doubled=0"
    keys = KeySpace("wordcount-opaque", "sharded", shards=3)
    masters = {cluster.master_of(keys.shard(i).state("counts")) for i in range(3)}
    assert len(masters) == 3  # each shard on a master of its own
    client = connect(cluster.url(1))
    assert all(client.hlen(keys.shard(i).state("counts")) > 0 for i in range(3))

    # the same pipeline asked to run with another count: one line, nothing written
    hashes = [keys.shard(i).state("counts") for i in range(3)]
    before = [client.hgetall(k) for k in hashes]
    tf("produce", "wordcount-opaque", "-", input="how are you\n", env=env)
    other = tf("run", "wordcount-opaque", "--engine", "local",
               env={**env, "TRIDENTFLOW_STATE_SHARDS": "2"})  # fmt: skip
    assert other.returncode == 1 and len(other.stderr.strip().splitlines()) == 1, other.stderr
    assert "stored in 3 shard(s) but this run asks for 2" in other.stderr
    assert [client.hgetall(k) for k in hashes] == before

    # moved to 2 shards without a reset: on two masters, the old layout gone, exact after
    env = {**env, "TRIDENTFLOW_STATE_SHARDS": "2"}
    moved = tf("reshard", "wordcount-opaque", "--shards", "2", "--yes", "--json", env=env)
    assert moved.returncode == 0, moved.stderr
    assert json.loads(moved.stdout)["layout"] == 1
    assert all(client.hlen(k) == 0 for k in hashes)
    two = KeySpace("wordcount-opaque", "sharded", shards=2, layout=1)
    assert len({cluster.master_of(two.shard(i).state("counts")) for i in range(2)}) == 2
    assert all(client.hlen(two.shard(i).state("counts")) > 0 for i in range(2))
    ran = tf("run", "wordcount-opaque", "--engine", "local", env=env)
    assert ran.returncode == 0, ran.stderr
    rows = json.loads(tf("query", "wordcount-opaque", *SEED_COUNTS, "--json", env=env).stdout)
    expected = {w: n + (w in ("how", "are", "you")) for w, n in SEED_COUNTS.items()}
    assert {r["key"][0]: r["value"] for r in rows["values"]} == expected
    assert tf("audit", "wordcount-opaque", env=env).stdout.strip() == "lost=0 doubled=0"
    assert json.loads(tf("status", "wordcount-opaque", "--json", env=env).stdout)["shards"] == 2
    assert tf("reset", "wordcount-opaque", "--yes", env=env).returncode == 0
    left = [k for k in client.scan_iter(match=keys.shard_pattern) if b"generation" not in k]
    assert left == []


@pytest.mark.soak
def test_chaos_seeds_run_against_the_cluster(cluster):
    """Every fault point, outages, resets in flight and commit races, with 1-3 state shards,
    against the cluster (no Redis restarts: the failover tests kill nodes)."""
    seed, schedules = 1000, 12
    assert {schedule_shards(s) for s in range(seed, seed + schedules)} == {1, 2, 3}
    results = run_chaos(schedules, seed=seed, redis_url=cluster.url(0))
    failed = [r.line() for r in results if not r.ok]
    assert not failed and len(results) == schedules, failed


def test_a_redis_streams_pipeline_runs_on_the_cluster(tf, cluster, tmp_path):
    """The streams of wordcount-stream spread over the masters (no hash tag), the ordinal
    index in the pipeline's slot, the state in shards: produce, run, query, trim, audit."""
    env = {"TRIDENTFLOW_REDIS_URL": cluster.url(2), "TRIDENTFLOW_HOME": str(tmp_path / "h"),
           "TRIDENTFLOW_STATE_SHARDS": "3"}  # fmt: skip
    streams = [f"tridentflow:wordcount-stream:p{p}" for p in range(4)]
    assert len({cluster.master_of(k) for k in streams}) > 1
    half = len(SEED_SENTENCES) // 2
    for part in (SEED_SENTENCES[:half], SEED_SENTENCES[half:]):
        produced = tf("produce", "wordcount-stream", "-", input="\n".join(part) + "\n", env=env)
        assert produced.returncode == 0, produced.stderr
        ran = tf("run", "wordcount-stream", "--engine", "local", "--batch-size", "1", env=env)
        assert ran.returncode == 0, ran.stderr
    assert tf("audit", "wordcount-stream", env=env).stdout.strip() == "lost=0 doubled=0"
    assert tf("trim", "wordcount-stream", env=env).returncode == 0
    client = connect(cluster.url(0))
    assert sum(client.xlen(k) for k in streams) == 0  # every entry committed, then trimmed
    rows = json.loads(tf("query", "wordcount-stream", *SEED_COUNTS, "--json", env=env).stdout)
    assert {r["key"][0]: r["value"] for r in rows["values"]} == SEED_COUNTS


def test_a_cluster_client_does_not_send_a_timed_out_command_again(cluster):
    """A Redis Cluster client never re-sends either (redis-py's cluster client would, up to 3
    times, to follow a failover): the paused master runs the first INCR once it goes on; a
    re-sent one would run too. The next command finds the nodes again."""
    import os
    import signal
    import threading
    import time

    client = connect(cluster.url(0), socket_timeout=0.3)
    client.set("resend:{n}", 0)
    pid = cluster.process(cluster.master_of("resend:{n}")).pid
    os.kill(pid, signal.SIGSTOP)
    threading.Timer(1.5, os.kill, (pid, signal.SIGCONT)).start()
    with pytest.raises((redis.TimeoutError, redis.ConnectionError)):
        client.incr("resend:{n}")
    time.sleep(2.0)  # the master went on: it ran what it had
    assert int(client.get("resend:{n}")) == 1
