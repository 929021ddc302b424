"""Orchestrator runs bound to txids: adoption, release, leases, one-line failures."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.helpers import produce, runtime, sentences
from tridentflow.engines.local import LocalEngine
from tridentflow.errors import one_line
from tridentflow.ops.status import format_status, status
from tridentflow.steps.runs import (
    RunNotBoundError,
    commit_run,
    coordinate_run,
    emit_run,
    release_run,
)
from tridentflow_spark_jobs import emit_batch

ENGINE = LocalEngine()


def run_all(rt, run_id):
    coordinate_run(rt, run_id)
    emit_run(rt, run_id, ENGINE)
    return commit_run(rt, run_id)


def test_a_cleared_run_whose_txid_was_adopted_binds_a_fresh_txid(redis_url, redis_client, home):
    rt = runtime("wordcount", redis_url, home)
    produce(rt, sentences(6))
    assert coordinate_run(rt, "run-a", batch_size=1)["txid"] == 1
    release_run(rt, "run-a")  # run-a's last retry failed: it gave up
    assert run_all(rt, "run-b")["txid"] == 1  # run-b adopts and commits txid 1
    with pytest.raises(RunNotBoundError, match="txid 1 of run run-a was adopted by run run-b"):
        emit_run(rt, "run-a", ENGINE)  # only run-a's emit cleared: refused, clearly
    cleared = coordinate_run(rt, "run-a", batch_size=1)  # the whole run cleared
    assert (cleared["txid"], cleared["binding"], cleared["committed"]) == (2, "new", False)
    assert emit_run(rt, "run-a", ENGINE) is not None
    assert commit_run(rt, "run-a")["status"] == "committed"
    # run-b, cleared later, finds its own txid committed
    assert coordinate_run(rt, "run-b")["binding"] == "committed"


def test_status_shows_no_owner_for_a_released_txid(redis_url, redis_client, home):
    rt = runtime("wordcount", redis_url, home)
    produce(rt, sentences(4))
    coordinate_run(rt, "live-run", lease_ms=120_000)
    (pending,) = status(rt)["pending"]
    assert pending["owner"] == "live-run" and 100 < pending["lease_expires_in_s"] <= 120
    release_run(rt, "live-run")
    (pending,) = status(rt)["pending"]
    assert (pending["owner"], pending["lease_expires_in_s"]) == (None, None)
    assert "no live owner" in format_status(status(rt))


def test_the_emit_job_renews_the_lease_it_is_given(redis_url, redis_client, home, monkeypatch):
    rt = runtime("wordcount", redis_url, home)
    produce(rt, sentences(4))
    coordinate_run(rt, "r", lease_ms=1_000)
    assert emit_batch.parse_args(["--pipeline", "p", "--txid", "1"]).lease_ms == 15 * 60_000
    args = emit_batch.parse_args(["--pipeline", "p", "--run-id", "r", "--lease-ms", "1800000"])
    from tridentflow.steps.runs import owned_txid

    owned_txid(rt, "r", args.lease_ms)
    (pending,) = status(rt)["pending"]
    assert 1790 < pending["lease_expires_in_s"] <= 1800


def test_the_emit_job_reports_an_unreachable_redis_in_one_line(tmp_path, home):
    error_file = tmp_path / "error"
    env = {
        "PATH": "/usr/bin:/bin",
        "TRIDENTFLOW_REDIS_URL": "redis://127.0.0.1:1/0",
        "TRIDENTFLOW_HOME": str(home),
        "TRIDENTFLOW_ERROR_FILE": str(error_file),
    }
    job = str(ROOT / "spark_jobs" / "emit_batch.py")
    out = subprocess.run(
        [sys.executable, job, "--pipeline", "wordcount", "--run-id", "r"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=60,
    )
    assert out.returncode == 1
    reported = json.loads(error_file.read_text())
    assert out.stderr.strip().splitlines() == [f"emit_batch: error: {reported['line']}"]
    assert "cannot reach Redis at redis://127.0.0.1:1/0" in out.stderr
    assert reported["retry_helps"] is True  # an outage: the task's retries ride it out


def test_the_emit_job_says_a_retry_cannot_import_a_missing_pipeline(tmp_path, home):
    error_file = tmp_path / "error"
    env = {"PATH": "/usr/bin:/bin", "TRIDENTFLOW_ERROR_FILE": str(error_file)}
    job = str(ROOT / "spark_jobs" / "emit_batch.py")
    out = subprocess.run(
        [sys.executable, job, "--pipeline", "my_pipeline:build", "--run-id", "r"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60,
    )  # fmt: skip
    assert out.returncode == 1
    reported = json.loads(error_file.read_text())
    assert "cannot import my_pipeline" in reported["line"]
    assert reported["retry_helps"] is False  # the operator fails the task at once


class FakeSparkError(Exception):
    """Stands in for pyspark.errors.PythonException (same module prefix, same text)."""


FakeSparkError.__module__ = "pyspark.errors.exceptions.captured"


def test_one_line_finds_the_python_exception_inside_a_spark_trace():
    trace = "\n".join(
        [
            "An exception was thrown from the Python worker. Please see the stack trace below.",
            "Traceback (most recent call last):",
            '  File "/w/worker.py", line 1, in main',
            "    process()",
            "tridentflow.errors.PartitionUnavailableError: partition 2 is unavailable: gone",
            "",
            "During handling of the above exception, another exception occurred:",
            "",
            "Traceback (most recent call last):",
            '  File "/w/aggregate.py", line 9, in aggregate',
            "    raise ValueError(\"cannot aggregate 'BOOM'\")",
            "ValueError: cannot aggregate 'BOOM'",
            "",
            "\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handle",
        ]
    )
    assert (
        one_line(FakeSparkError(trace)) == "Spark task failed: ValueError: cannot aggregate 'BOOM'"
    )
    assert one_line(FakeSparkError("Job aborted")) == "Spark: Job aborted"
    assert one_line(ValueError("first\nsecond")) == "first"


def test_the_ledger_keeps_each_commits_result_and_step_timings(redis_url, redis_client, home):
    """What a cleared task's XCom no longer shows stays in Redis: run, sizes, attempts, times."""
    from tridentflow.faults import FaultPlan, InjectedFaultError

    rt = runtime("wordcount-opaque", redis_url, home)
    produce(rt, ["a b", "c d", "e f", "a"])
    run_all(rt, "run-1")
    produce(rt, ["g h"])
    rt = rt.with_(faults=FaultPlan.parse("in-emit@2"))
    coordinate_run(rt, "run-2")
    with pytest.raises(InjectedFaultError):
        emit_run(rt, "run-2", ENGINE)
    emit_run(rt, "run-2", ENGINE)  # the retry
    commit_run(rt, "run-2")
    assert commit_run(rt, "run-2")["status"] == "already-committed"  # no second entry
    newest, oldest = rt.ledger.history()
    assert (newest["txid"], newest["run_id"], newest["records"], newest["keys"]) == (
        2,
        "run-2",
        1,
        2,
    )
    assert (oldest["txid"], oldest["run_id"], oldest["records"]) == (1, "run-1", 4)
    steps = newest["steps"]
    assert [steps[s]["attempts"] for s in ("coordinate", "emit", "commit")] == [1, 2, 1]
    for step in ("coordinate", "emit", "commit"):
        assert steps[step]["started_ms"] <= steps[step]["ended_ms"] <= newest["committed_ms"]
    assert steps["coordinate"]["ended_ms"] <= steps["emit"]["started_ms"]
    info = status(rt)
    assert info["last_commit"] == newest and len(info["history"]) == 2
    assert "txid 2 by run-2: 1 records, 2 keys; coordinate" in format_status(info)


def test_a_python_exception_in_a_spark_task_is_its_own_line_classic_or_connect():
    """Classic Spark starts a line with the Traceback; Spark Connect prefixes it with
    ``[PYTHON_EXCEPTION] ...``. Either way the line is the Python exception."""

    class PythonException(Exception):
        __module__ = "pyspark.errors.exceptions.connect"

    connect = PythonException(
        "\n  An exception was thrown from the Python worker. Please see the stack trace below."
        "\n[PYTHON_EXCEPTION] An exception was thrown from the Python worker: Traceback (most"
        ' recent call last):\n  File "x.py", line 5, in boom\nValueError: bad word\n'
        " SQLSTATE: 38000"
    )
    assert one_line(connect) == "Spark task failed: ValueError: bad word"
    PythonException.__module__ = "pyspark.errors.exceptions.captured"
    classic = PythonException(
        "An exception was thrown from the Python worker. Please see the stack trace below.\n"
        'Traceback (most recent call last):\n  File "x.py", line 5, in boom\n'
        "ModuleNotFoundError: No module named 'tests'\n"
    )
    assert one_line(classic) == "Spark task failed: ModuleNotFoundError: No module named 'tests'"


def test_what_each_task_returns_is_json_native(redis_url, redis_client, home):
    """Airflow shows each task's return value as its XCom: plain JSON, no tuples that
    Airflow would serialise as {"__classname__": "builtins.tuple", ...}."""
    import json

    from tridentflow.steps.runs import emit_summary, owned_txid

    rt = runtime("wordcount-opaque", redis_url, home)
    produce(rt, sentences(20))
    coordinated = coordinate_run(rt, "manual__j")
    staged = emit_run(rt, "manual__j", LocalEngine())
    emitted = emit_summary(rt, owned_txid(rt, "manual__j"), staged)
    committed = commit_run(rt, "manual__j")
    for value in (coordinated, emitted, committed):
        assert json.loads(json.dumps(value)) == value, value
