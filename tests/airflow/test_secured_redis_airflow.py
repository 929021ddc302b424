"""Airflow and Spark against a secured Redis: TLS with a test CA, an ACL user limited to one
pipeline, a password; then every place the project writes or shows is searched for it."""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests import secure_redis
from tests.conftest import SEED_SENTENCES
from tests.helpers import runtime
from tridentflow.devtools import devredis
from tridentflow.engines.local import LocalEngine
from tridentflow.steps.committer import commit
from tridentflow.steps.coordinator import coordinate
from tridentflow.steps.emitter import emit
from tridentflow.steps.query import query
from tridentflow_airflow import launcher, view

pytestmark = [pytest.mark.airflow, pytest.mark.spark]
PASSWORD = "drpc-Tls-Acl-s3cret"


class ArgvWatch:
    """Every process command line seen while it runs (/proc/*/cmdline, every 0.1 s)."""

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._stop.wait(0.1):
            for proc in Path("/proc").glob("[0-9]*/cmdline"):
                try:
                    self.seen.add(proc.read_bytes().replace(b"\0", b" ").decode(errors="replace"))
                except OSError:
                    continue

    def __enter__(self) -> ArgvWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def files_under(*roots: Path) -> Iterator[Path]:
    for root in roots:
        yield from (p for p in root.rglob("*") if p.is_file())


def redis_value(client, key: bytes) -> bytes:
    """Everything ``key`` holds, its kind read as such, as one byte string."""
    kind = client.type(key)
    if kind == b"string":
        return client.get(key) or b""
    if kind == b"hash":
        return b" ".join(k + b"=" + v for k, v in client.hgetall(key).items())
    if kind == b"list":
        return b" ".join(client.lrange(key, 0, -1))
    if kind == b"set":
        return b" ".join(client.smembers(key))
    if kind == b"zset":
        return b" ".join(client.zrange(key, 0, -1))
    if kind == b"stream":
        entries = client.xrange(key)
        return b" ".join(k + b"=" + v for _, fields in entries for k, v in fields.items())
    raise AssertionError(f"{key!r}: a Redis type this search does not read: {kind!r}")


def test_a_secured_redis_end_to_end_leaks_no_secret(tmp_path, home, tf):
    """wordcount-drpc through `airflow dags test` (spark-submit; executors query Redis) as an
    ACL user over TLS: the answers are exact, and the password is in no task log, no process
    argv, no XCom or other metadata, no staged file, no CLI output, no plugin API answer."""
    server = secure_redis.start(tmp_path / "redis", tls=True)
    try:
        server.add_user("tf-drpc", PASSWORD, "wordcount-drpc")
        url = server.url("tf-drpc", PASSWORD)
        drpc = runtime("wordcount-drpc", url, home)
        drpc.source_heads()
        drpc.log.append_spread([{"kind": "sentence", "text": s} for s in SEED_SENTENCES])
        coordinate(drpc, 1)
        emit(drpc, 1, LocalEngine())
        commit(drpc, 1)
        drpc.log.append_spread([{"kind": "query", "text": q} for q in ("how are you", "you no")])

        sqlite = f"sqlite:///{launcher.airflow_home(home) / 'airflow.db'}"  # a file to search
        env = launcher.airflow_env(home, url, port=devredis.free_port(), metadata=sqlite)
        env.pop("TRIDENTFLOW_FAULTS", None)
        launcher.migrate(env)
        with ArgvWatch() as argv:
            proc = subprocess.run(
                ["airflow", "dags", "test", "tridentflow_wordcount_drpc"],
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
            )
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0 and "state=success" in out.split("DagRun Finished")[-1], out[
            -3000:
        ]
        answers = query(drpc, drpc.pipeline.states["answers"], [("how are you",), ("you no",)])
        assert drpc.ledger.committed_txid() == 2 and answers[1] == [4, 2]
        assert any("spark-submit" in cmd or "SparkSubmit" in cmd for cmd in argv.seen)
        assert "tridentflow-emit-wordcount-drpc" in out  # the task logs (dags test prints them)

        cli_env = {"TRIDENTFLOW_REDIS_URL": url, "TRIDENTFLOW_HOME": str(home)}
        status = tf("status", "wordcount-drpc", "--json", env=cli_env)
        assert status.returncode == 0, status.stderr
        os.environ["TRIDENTFLOW_REDIS_URL"], saved = url, os.environ.get("TRIDENTFLOW_REDIS_URL")
        view.app.dependency_overrides[view.AUTHENTICATED] = lambda: None
        try:
            client = TestClient(view.app)
            api = [
                client.get(path).text
                for path in (
                    "/api/pipelines",
                    "/api/pipelines/wordcount-drpc",
                    "/api/pipelines/wordcount-drpc/txids/2",
                    "/api/pipelines/wordcount-drpc/state/answers/keys",
                    "/api/pipelines/wordcount",  # a pipeline this user may not read: 503
                )
            ]
        finally:
            view.app.dependency_overrides.clear()
            if saved is None:
                os.environ.pop("TRIDENTFLOW_REDIS_URL")
            else:
                os.environ["TRIDENTFLOW_REDIS_URL"] = saved
        assert '"committed_txid":2' in api[1] and "no permission on the keys of pipeline" in api[4]

        leaks = [f"argv: {cmd[:200]}" for cmd in argv.seen if PASSWORD in cmd]
        shown = {"dags test": out, "status": status.stdout + status.stderr, "api": "".join(api)}
        leaks += [f"output of {name}" for name, text in shown.items() if PASSWORD in text]
        # the metadata DB (XCom, rendered fields, serialized DAGs), staged manifests and
        # partials, source logs: everything under the home
        drpc.log.append_spread([{"kind": "query", "text": "a"}])
        coordinate(drpc, 3)
        emit(drpc, 3, LocalEngine())  # staged, not committed: a manifest and partials to search
        files = list(files_under(home))
        assert any(p.name == "airflow.db" for p in files)  # XCom, rendered fields, DAGs
        leaks += [f"file {path}" for path in files if PASSWORD.encode() in path.read_bytes()]
        # staged in Redis (the default): the staged blocks, the ledger, every value Redis holds
        assert drpc.ledger.staged_attempt(3) is not None
        admin = server.admin()
        held = list(admin.scan_iter(count=1000))
        assert any(b"staged" in key or b"staging" in key for key in held), held[:20]
        leaks += [f"redis {key!r}" for key in held if PASSWORD.encode() in redis_value(admin, key)]
        assert not leaks, leaks
    finally:
        server.stop()
