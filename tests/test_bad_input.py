"""Bad input at every entry point is one line naming the problem and the fix - never a
traceback, never silently ignored: CLI arguments, environment variables, the Python API, a
user's pipeline module. (The DAG factory's own cases: tests/airflow/test_dag_integrity.py.)"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from tridentflow import LogSource, Pipeline, StateSpec
from tridentflow.errors import TridentflowError
from tridentflow.ops import cli

ROOT = Path(__file__).resolve().parents[1]


def run_cli(argv: list[str], capsys) -> tuple[int, list[str]]:
    """``tridentflow ARGV`` in this process: (exit code, stderr lines)."""
    try:
        code = cli.main(argv, out=io.StringIO())
    except SystemExit as exc:  # argparse
        code = int(exc.code or 0)
    return code, capsys.readouterr().err.strip().splitlines()


# (argv, environment, what the one line must say)
CASES = [
    (["run", "wordcount", "--batch-size", "0"], {}, "--batch-size: must be a whole number >= 1"),
    (["run", "wordcount", "--batch-size", "x"], {}, "--batch-size: must be a whole number >= 1"),
    (["run", "wordcount", "--batches", "0"], {}, "--batches: must be a whole number >= 1"),
    (["run", "wordcount", "--depth", "-1"], {}, "--depth: must be a whole number >= 1"),
    (["run", "wordcount", "--wait-replicas", "-2"], {}, "--wait-replicas: must be a whole"),
    (["produce", "wordcount", "-", "--partitions", "0"], {}, "--partitions: must be a whole"),
    (["query", "wordcount", "--all", "--limit", "0"], {}, "--limit: must be a whole number"),
    (["quarantine", "wordcount", "--limit", "-5"], {}, "--limit: must be a whole number"),
    (["chaos", "--schedules", "0"], {}, "--schedules: must be a whole number >= 1"),
    (["dev-redis", "--port", "70000"], {}, "--port: must be a whole number >= 1 and <= 65535"),
    (["status", "wordcount", "--namespace", "a b"], {}, "namespace name 'a b' is invalid"),
    (["status", "wordcount"], {"TRIDENTFLOW_NAMESPACE": "x:y"}, "TRIDENTFLOW_NAMESPACE"),
    (["acl", "wordcount", "--namespace", "a{b}"], {}, "namespace name 'a{b}' is invalid"),
    (["acl", "wordcount", "--user", "a b"], {}, "Redis user name 'a b' cannot be written"),
    (["acl", "wordcount", "--user", "tab\tuser"], {}, "cannot be written in an ACL SETUSER"),
    (["status", "wordcount"], {"TRIDENTFLOW_HOME": "__FILE__"}, "is a file, not a directory"),
    (["status", "wordcount"], {"TRIDENTFLOW_WAIT_REPLICAS": "many"}, "TRIDENTFLOW_WAIT_REPLICAS"),
    (["run", "wordcount"], {"TRIDENTFLOW_STATE_SHARDS": "0"}, "TRIDENTFLOW_STATE_SHARDS"),
    (["run", "wordcount"], {"TRIDENTFLOW_WAIT_TIMEOUT_MS": "-1"}, "TRIDENTFLOW_WAIT_TIMEOUT_MS"),
    (["status", "tests.test_bad_input:bad_pipeline_name"], {}, "pipeline name 'bad name'"),
    (["status", "tests.test_bad_input:bad_state_name"], {}, "state name 'no/slash'"),
    (["status", "tests.test_bad_input:raising_pipeline"], {}, "raised KeyError: 'missing'"),
    (["status", "tests.test_bad_input:not_there"], {}, "has no attribute 'not_there'"),
    (["status", "no.such.module:x"], {}, "cannot import no.such.module"),
]


@pytest.mark.parametrize(("argv", "env", "says"), CASES, ids=[" ".join(c[0]) for c in CASES])
def test_every_bad_cli_input_is_one_line(argv, env, says, capsys, monkeypatch, redis_url, tmp_path):
    monkeypatch.setenv("TRIDENTFLOW_REDIS_URL", redis_url)
    monkeypatch.setenv("TRIDENTFLOW_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(ROOT)
    for name, value in env.items():
        if value == "__FILE__":
            value = str(tmp_path / "a-file")
            Path(value).write_text("not a directory\n")
        monkeypatch.setenv(name, value)
    code, lines = run_cli(argv, capsys)
    assert code in (1, 2), (code, lines)
    assert len(lines) == 1, lines
    assert lines[0].startswith("tridentflow"), lines[0]
    assert says in lines[0], lines[0]


def bad_pipeline_name() -> Pipeline:
    return Pipeline("bad name", LogSource(fields=("word",)))


def bad_state_name() -> Pipeline:
    pipeline = Pipeline("fine", LogSource(fields=("word",)))
    pipeline.stream.group_by("word").persistent_aggregate(StateSpec("no/slash"), "count")
    return pipeline


def raising_pipeline() -> Pipeline:
    return {}["missing"]


def test_the_python_api_refuses_the_same_inputs_in_one_line(redis_url, tmp_path, monkeypatch):
    from tests.helpers import runtime
    from tridentflow.engines.local import LocalEngine
    from tridentflow.static_state import RedisHashLookup
    from tridentflow.steps.driver import run_batches, run_pipelined
    from tridentflow.steps.runtime import Runtime, resolve_home

    rt = runtime("wordcount", redis_url, tmp_path / "home")
    rt.ledger.reset(force=True)  # no pending txid another test left: a new one is coordinated
    rt.source_heads()
    rt.log.append_spread(["a b c"])
    attempts = [
        lambda: Runtime.open(rt.pipeline, redis_url, tmp_path, namespace="a b"),
        lambda: run_batches(rt, LocalEngine(), batch_size=0),
        lambda: run_pipelined(rt, LocalEngine(), depth=0),
        lambda: resolve_home(Path(__file__)),
        lambda: Pipeline("a:b", LogSource(fields=("w",))),
        lambda: StateSpec(""),
        lambda: RedisHashLookup(""),
    ]
    for attempt in attempts:
        with pytest.raises(TridentflowError) as info:
            attempt()
        assert "\n" not in str(info.value)
    assert rt.ledger.committed_txid() == 0  # nothing ran with a bad batch size


def test_a_static_lookup_value_that_is_not_utf8_is_one_line(redis_url, redis_client):
    from tridentflow.errors import SourceError
    from tridentflow.static_state import RedisHashLookup

    redis_client.hset("lookup", mapping={"ok": b'"fine"', "bad": b"\xff\xfe"})
    lookup = RedisHashLookup("lookup")
    assert lookup.get(redis_url, ["ok"]) == ["fine"]
    with pytest.raises(SourceError, match="the value of 'bad' is not UTF-8"):
        lookup.get(redis_url, ["ok", "bad"])
