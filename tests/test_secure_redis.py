"""Against secured redis-servers this session starts: ACL users limited to one pipeline, TLS
with certificates made here, secrets that appear in no output, pipelines and deployments
sharing one Redis (tests.secure_redis)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis

from tests import secure_redis
from tests.conftest import SEED_COUNTS, SEED_SENTENCES
from tridentflow.ops import acl

USER_PASSWORD = "wc-Us3r-pa55"


@pytest.fixture
def acl_server(tmp_path: Path):
    server = secure_redis.start(tmp_path / "acl-redis")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory):
    server = secure_redis.start(tmp_path_factory.mktemp("tls-redis"), tls=True)
    yield server
    server.stop()


def dump(client: redis.Redis, pattern: str) -> dict[bytes, bytes]:
    """Every key matching ``pattern`` with its DUMP (type, value, encoding: byte for byte)."""
    return {k: client.dump(k) for k in client.scan_iter(match=pattern, count=1000)}


def produce_and_run(tf, pipeline: str, env: dict[str, str], *extra: str) -> None:
    produced = tf("produce", pipeline, "-", *extra, input="\n".join(SEED_SENTENCES) + "\n", env=env)
    assert produced.returncode == 0, produced.stderr
    ran = tf("run", pipeline, "--engine", "local", *extra, env=env)
    assert ran.returncode == 0, ran.stderr


def query_seed(tf, pipeline: str, env: dict[str, str], *extra: str) -> dict[str, int]:
    out = tf("query", pipeline, *SEED_COUNTS, "--json", *extra, env=env)
    assert out.returncode == 0, out.stderr
    return {row["key"][0]: row["value"] for row in json.loads(out.stdout)["values"]}


def one_error_line(proc) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr
    return lines[0]


@pytest.mark.servers
def test_an_acl_user_runs_its_pipeline_and_cannot_touch_another(tf, acl_server, tmp_path):
    """A user holding exactly `tridentflow acl wordcount` runs every step of wordcount; pointed
    at wordcount-opaque it gets one line naming the missing permission, and nothing of
    wordcount-opaque changes (DUMP before and after)."""
    admin_env = {"TRIDENTFLOW_REDIS_URL": acl_server.url(), "TRIDENTFLOW_HOME": str(tmp_path / "h")}
    produce_and_run(tf, "wordcount-opaque", admin_env)
    other = dump(acl_server.admin(), "tf:{wordcount-opaque}:*")
    assert other

    printed = tf("acl", "wordcount")
    assert printed.returncode == 0 and printed.stdout.strip() == acl.rules("wordcount")
    acl_server.add_user("tf-wc", USER_PASSWORD, "wordcount")
    env = {**admin_env, "TRIDENTFLOW_REDIS_URL": acl_server.url("tf-wc", USER_PASSWORD)}
    produce_and_run(tf, "wordcount", env)
    assert query_seed(tf, "wordcount", env) == SEED_COUNTS
    outputs = [printed.stdout]
    for step in (
        ("query", "wordcount", "--all", "--json"),
        ("status", "wordcount", "--json"),
        ("audit", "wordcount"),
        ("quarantine", "wordcount"),
        ("reset", "wordcount", "--yes"),
    ):
        proc = tf(*step, env=env)
        assert proc.returncode == 0, (step, proc.stderr)
        outputs.append(proc.stdout + proc.stderr)
    kept = ("--retain-txids", "3")  # undo logs: query --as-of and rewind need nothing more
    rerun = tf("run", "wordcount", "--engine", "local", *kept, env=env)  # the log again, from 0
    assert rerun.returncode == 0, rerun.stderr
    assert query_seed(tf, "wordcount", env) == SEED_COUNTS
    seed = "\n".join(SEED_SENTENCES) + "\n"
    assert tf("produce", "wordcount", "-", input=seed, env=env).returncode == 0
    twice = tf("run", "wordcount", "--engine", "local", *kept, env=env)
    assert twice.returncode == 0, twice.stderr
    assert query_seed(tf, "wordcount", env, "--as-of", "1") == SEED_COUNTS
    back = tf("rewind", "wordcount", "--to", "1", "--yes", env=env)
    assert back.returncode == 0, back.stderr
    assert query_seed(tf, "wordcount", env) == SEED_COUNTS
    outputs.append(back.stdout + back.stderr)

    for step in (
        ("run", "wordcount-opaque", "--engine", "local"),
        ("reset", "wordcount-opaque", "--yes"),
        ("query", "wordcount-opaque", "you"),
        ("status", "wordcount-opaque"),
    ):
        line = one_error_line(tf(*step, env=env))
        assert "'tf-wc' has no permission on the keys of pipeline 'wordcount-opaque'" in line, line
        assert "tf:{wordcount-opaque}:*" in line and "tridentflow acl wordcount-opaque" in line
        outputs.append(line)
    assert dump(acl_server.admin(), "tf:{wordcount-opaque}:*") == other
    assert not any(USER_PASSWORD in text or secure_redis.ADMIN_PASSWORD in text for text in outputs)


@pytest.mark.servers
def test_an_acl_user_runs_a_pipeline_whose_keys_expire_by_txids_and_batch_time(
    tf, acl_server, tmp_path
):
    """The expiry index and the batch times' sorted set need nothing but the printed line:
    three txids of a state expiring after 3 txids or an hour, status and audit."""
    ref = "tests.pipelines:expiring_either_way_unexported"
    acl_server.add_user("tf-exp", USER_PASSWORD, "expiring-opaque")
    env = {
        "TRIDENTFLOW_REDIS_URL": acl_server.url("tf-exp", USER_PASSWORD),
        "TRIDENTFLOW_HOME": str(tmp_path / "h"),
    }
    for line in ("a b", "b", "c"):
        assert tf("produce", ref, "-", input=line + "\n", env=env).returncode == 0
        ran = tf("run", ref, "--engine", "local", env=env)
        assert ran.returncode == 0, ran.stderr
    for step in (("status", ref), ("audit", ref)):
        proc = tf(*step, env=env)
        assert proc.returncode == 0, (step, proc.stderr)
    assert "expire after 3 txids or 1:00:00 of batch time" in tf("status", ref, env=env).stdout


@pytest.mark.servers
def test_an_acl_user_runs_a_stream_pipeline_with_the_printed_line(tf, acl_server, tmp_path):
    """`tridentflow acl wordcount-stream` adds the streams' keys and the stream commands:
    produce, run (with state shards), query, audit, trim and reset --source all run; the
    other stream pipeline's streams are refused."""
    printed = tf("acl", "wordcount-stream").stdout.split()
    admin = acl_server.admin()
    admin.execute_command("ACL", "SETUSER", "tf-ws", "reset", "on", f">{USER_PASSWORD}", *printed)
    env = {"TRIDENTFLOW_REDIS_URL": acl_server.url("tf-ws", USER_PASSWORD),
           "TRIDENTFLOW_HOME": str(tmp_path / "h"), "TRIDENTFLOW_STATE_SHARDS": "2"}  # fmt: skip
    produce_and_run(tf, "wordcount-stream", env)
    assert query_seed(tf, "wordcount-stream", env) == SEED_COUNTS
    for step in (("audit", "wordcount-stream"), ("trim", "wordcount-stream"),
                 ("reset", "wordcount-stream", "--yes", "--source")):  # fmt: skip
        proc = tf(*step, env=env)
        assert proc.returncode == 0, (step, proc.stderr)
    assert not admin.exists("tridentflow:wordcount-stream:p0")
    refused = tf("produce", "wordcount-stream-tx", "-", input="a b\n", env=env)
    assert refused.returncode == 1 and len(refused.stderr.strip().splitlines()) == 1
    assert not admin.exists("tridentflow:wordcount-stream-tx:p0")


@pytest.mark.servers
def test_a_missing_command_permission_is_named(tf, acl_server, tmp_path):
    """A user whose ACL lacks one command tridentflow needs: the error names the command, and
    the committed state is untouched."""
    env = {"TRIDENTFLOW_REDIS_URL": acl_server.url(), "TRIDENTFLOW_HOME": str(tmp_path / "h")}
    produce_and_run(tf, "wordcount", env)
    before = dump(acl_server.admin(), "tf:{wordcount}:*")
    acl_server.add_user("tf-wc", USER_PASSWORD, "wordcount")
    acl_server.admin().execute_command("ACL", "SETUSER", "tf-wc", "-evalsha")
    env["TRIDENTFLOW_REDIS_URL"] = acl_server.url("tf-wc", USER_PASSWORD)
    produced = tf("produce", "wordcount", "-", input="one more line\n", env=env)
    assert produced.returncode == 0, produced.stderr
    line = one_error_line(tf("run", "wordcount", "--engine", "local", env=env))
    assert "Redis refused this user (ACL)" in line and "'evalsha'" in line, line
    assert "tridentflow acl PIPELINE" in line and USER_PASSWORD not in line
    after = dump(acl_server.admin(), "tf:{wordcount}:*")
    for key in (b"tf:{wordcount}:ledger", b"tf:{wordcount}:state:counts"):
        assert after[key] == before[key], key  # nothing committed, the counts as they were


@pytest.mark.servers
def test_tls_with_the_ca_as_an_option_or_in_the_url_and_no_silent_fallback(
    tf, tls_server, tmp_path
):
    home = str(tmp_path / "h")
    in_url = {"TRIDENTFLOW_REDIS_URL": tls_server.url(), "TRIDENTFLOW_HOME": home}
    produce_and_run(tf, "wordcount", in_url)
    assert query_seed(tf, "wordcount", in_url) == SEED_COUNTS

    bare = tls_server.url().split("?")[0]  # rediss:// without a CA
    ca = str(tls_server.tls / "ca.crt")
    by_option = {"TRIDENTFLOW_REDIS_URL": bare, "TRIDENTFLOW_HOME": home}
    assert query_seed(tf, "wordcount", by_option, "--redis-ca", ca) == SEED_COUNTS

    wrong = tf("status", "wordcount", "--redis-ca", str(tls_server.tls / "other-ca.crt"),
               env=by_option)  # fmt: skip
    line = one_error_line(wrong)
    assert "TLS with Redis at" in line and "could not be verified" in line, line
    assert "--redis-ca FILE" in line and secure_redis.ADMIN_PASSWORD not in line
    no_ca = one_error_line(tf("status", "wordcount", env=by_option))  # system CAs: refused
    assert "could not be verified" in no_ca, no_ca
    plain = bare.replace("rediss://", "redis://")
    refused = one_error_line(
        tf("status", "wordcount", env={**by_option, "TRIDENTFLOW_REDIS_URL": plain})
    )
    assert "cannot reach Redis" in refused or "TLS" in refused, refused
    needs_tls = one_error_line(tf("status", "wordcount", "--redis-ca", ca,
                                  env={**by_option, "TRIDENTFLOW_REDIS_URL": plain}))  # fmt: skip
    assert "only used over TLS" in needs_tls, needs_tls


def test_pipelines_and_deployments_sharing_one_redis_never_touch_each_other(
    tf, redis_server, redis_client, tmp_path
):
    """Two pipelines in one database, the same pipeline in two deployments (namespaces) of one
    database, and in another database: each sees only its own keys, and a reset of one
    leaves every other key byte for byte as it was."""
    base = f"redis://127.0.0.1:{redis_server}"
    redis.Redis.from_url(f"{base}/1").flushdb()
    tenants = {
        "db0 wordcount": ("wordcount", {"TRIDENTFLOW_REDIS_URL": f"{base}/0"}, "tf:{wordcount}:*"),
        "db0 wordcount-opaque": (
            "wordcount-opaque",
            {"TRIDENTFLOW_REDIS_URL": f"{base}/0"},
            "tf:{wordcount-opaque}:*",
        ),
        "db0 team-b wordcount": (
            "wordcount",
            {"TRIDENTFLOW_REDIS_URL": f"{base}/0", "TRIDENTFLOW_NAMESPACE": "team-b"},
            "tf:team-b:{wordcount}:*",
        ),
        "db1 wordcount": ("wordcount", {"TRIDENTFLOW_REDIS_URL": f"{base}/1"}, "tf:{wordcount}:*"),
    }
    for i, (pipeline, env, _pattern) in enumerate(tenants.values()):
        env["TRIDENTFLOW_HOME"] = str(tmp_path / f"home{i}")
        produce_and_run(tf, pipeline, env)
        assert query_seed(tf, pipeline, env) == SEED_COUNTS  # its own batch only, not 2x

    def snapshot() -> dict[str, dict[bytes, bytes]]:
        out = {}
        for name, (_pipeline, env, pattern) in tenants.items():
            client = redis.Redis.from_url(env["TRIDENTFLOW_REDIS_URL"])
            keys = dump(client, pattern.replace("{", "\\{").replace("}", "\\}"))
            out[name] = keys
        return out

    before, done = snapshot(), set()
    # the default namespace's pattern also matches no team-b key, and vice versa
    assert not set(before["db0 wordcount"]) & set(before["db0 team-b wordcount"])
    for victim in ("db0 team-b wordcount", "db0 wordcount"):
        pipeline, env, _pattern = tenants[victim]
        assert tf("reset", pipeline, "--yes", env=env).returncode == 0
        after = snapshot()
        for name in tenants:
            if name != victim and name not in done:
                assert after[name] == before[name], (victim, name)
        done.add(victim)


def test_the_docs_acl_line_is_the_one_tridentflow_prints():
    readme = (Path(__file__).resolve().parents[1] / "docs" / "redis.md").read_text()
    assert acl.setuser_line("wordcount", "tf-wordcount") in readme
