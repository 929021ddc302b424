"""Operators' figures (tridentflow.ops.metrics) on a real Redis: what they say after commits,
with a txid pending, and for a pipeline that cannot be read; the Prometheus text parsed back
with prometheus-client's own parser; Airflow's Stats sending them over a real StatsD socket."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from functools import partial

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import produce, runtime, sentences
from tridentflow.devtools.devredis import free_port
from tridentflow.engines.local import LocalEngine
from tridentflow.ops import metrics
from tridentflow.registry import load_pipeline
from tridentflow.steps.runs import commit_run, coordinate_run, emit_run
from tridentflow.steps.runtime import Runtime


def committed_twice_and_one_pending(redis_url, home):
    rt = runtime("wordcount", redis_url, home)
    produce(rt, sentences(40))
    for run in ("manual__1", "manual__2"):
        coordinate_run(rt, run, batch_size=3)
        emit_run(rt, run, LocalEngine())
        commit_run(rt, run)
    coordinate_run(rt, "manual__3", batch_size=3)  # bound, not committed
    return rt


def test_figures_after_two_commits_with_one_txid_pending(redis_url, redis_client, home):
    rt = committed_twice_and_one_pending(redis_url, home)
    got = metrics.figures(rt)
    assert got["committed_txid"] == 2
    assert got["pending_txids"] == 1
    assert got["lag_records"] == 40 - 2 * 3 * rt.pipeline.source.partitions
    assert 0 <= got["oldest_pending_seconds"] < 60
    assert 0 <= got["last_commit_seconds"] < 60
    assert got["quarantined_records"] == 0 and got["unavailable_partitions"] == 0
    no_sink_no_expiry = {"sink_lag_txids", "last_commit_expired_keys"}
    assert set(got) == set(metrics.FIGURES) - no_sink_no_expiry


def test_a_pipeline_never_committed_has_no_last_commit_figure(redis_url, redis_client, home):
    rt = runtime("wordcount", redis_url, home)
    got = metrics.figures(rt)
    assert "last_commit_seconds" not in got
    assert (got["committed_txid"], got["pending_txids"], got["oldest_pending_seconds"]) == (0, 0, 0)


def test_prometheus_text_parses_back_and_an_unreadable_pipeline_is_down_not_missing(
    redis_url, redis_client, home
):
    committed_twice_and_one_pending(redis_url, home)
    pipeline = load_pipeline("wordcount")
    dead_url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    collected = metrics.collect(
        [
            ("wordcount", partial(Runtime.open, pipeline, redis_url, home)),
            ("elsewhere", partial(Runtime.open, pipeline, dead_url, home)),
        ]
    )
    assert collected[1].error and "\n" not in collected[1].error
    text = metrics.prometheus_text(collected).decode()
    samples = {
        (s.name, s.labels["pipeline"]): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[("tridentflow_up", "wordcount")] == 1.0
    assert samples[("tridentflow_up", "elsewhere")] == 0.0
    assert samples[("tridentflow_committed_txid", "wordcount")] == 2.0
    assert samples[("tridentflow_pending_txids", "wordcount")] == 1.0
    assert ("tridentflow_committed_txid", "elsewhere") not in samples  # no figure, not a 0
    for name in metrics.FIGURES:
        assert f"# HELP tridentflow_{name} " in text and f"# TYPE tridentflow_{name} gauge" in text


@pytest.mark.airflow
def test_airflows_stats_sends_the_figures_over_statsd(redis_url, redis_client, home, tmp_path):
    """A real UDP socket as the StatsD server; Airflow's Stats configured as a user would
    ([metrics] statsd_on), in a fresh process."""
    rt = committed_twice_and_one_pending(redis_url, home)
    values = metrics.figures(rt)
    listener = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    listener.bind(("127.0.0.1", 0))
    listener.settimeout(20)
    port = listener.getsockname()[1]
    code = (
        "import json, sys\n"
        "from airflow.sdk._shared.observability.metrics import stats\n"
        "from airflow.sdk.configuration import conf\n"
        "from airflow.sdk.observability.metrics import stats_utils\n"
        "from airflow.sdk.observability.stats import Stats\n"
        "stats.initialize(factory=stats_utils.get_stats_factory(),\n"
        "                 export_legacy_names=conf.getboolean('metrics', 'legacy_names_on'))\n"
        "from tridentflow.ops.metrics import send_to_airflow_stats\n"
        "print(send_to_airflow_stats('wordcount', json.loads(sys.argv[1]), Stats))\n"
    )
    env = {
        "AIRFLOW_HOME": str(tmp_path),
        "AIRFLOW__METRICS__STATSD_ON": "True",
        "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
        "AIRFLOW__METRICS__STATSD_PORT": str(port),
        "AIRFLOW__METRICS__STATSD_PREFIX": "airflow",
    }
    done = subprocess.run(
        [sys.executable, "-c", code, json.dumps(values)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    sent: dict[str, float] = {}  # name -> value, as the StatsD server received them
    wanted = {f"airflow.tridentflow.wordcount.{name}" for name in values}
    try:
        while not wanted <= set(sent):
            for line in listener.recv(65535).decode().splitlines():
                name, rest = line.split(":", 1)
                sent[name] = float(rest.split("|")[0])
    finally:
        listener.close()
    for name, value in values.items():
        assert sent[f"airflow.tridentflow.wordcount.{name}"] == value, (name, sent)
    assert sent["airflow.tridentflow.wordcount.committed_txid"] == 2


def test_the_bounded_reader_answers_fast_reads_slow_ones_and_never_deadlocks():
    """Reads that finish before their callback is attached (the race that once deadlocked
    the reader), a read that raises, and one that outlives the deadline: each is answered,
    and a key whose read still runs is not read a second time."""
    import threading
    import time

    from tridentflow.ops.bounded import BoundedReader, TimedOutError

    reader = BoundedReader(workers=4)
    release = threading.Event()
    started = []

    def slow():
        started.append(1)
        release.wait(30)
        return "late"

    def boom():
        raise KeyError("nope")

    for _ in range(200):  # instant reads: most are done before add_done_callback
        assert reader.read_all({"a": lambda: 1, "b": lambda: 2}, 5) == {"a": 1, "b": 2}
    t0 = time.monotonic()
    got = reader.read_all({"slow": slow, "boom": boom, "ok": lambda: "ok"}, 0.5)
    assert time.monotonic() - t0 < 2
    assert isinstance(got["slow"], TimedOutError) and isinstance(got["boom"], KeyError)
    assert got["ok"] == "ok"
    again = reader.read_all({"slow": slow}, 0.2)  # still running: waited on, not restarted
    assert isinstance(again["slow"], TimedOutError) and len(started) == 1
    release.set()
    assert reader.read_all({"slow": slow}, 5)["slow"] == "late"


def test_a_pipeline_nobody_configured_is_not_reported_down(
    redis_url, redis_client, home, monkeypatch
):
    """A bundled Kafka pipeline with no brokers anywhere (a fresh start): it is reported
    ``tridentflow_configured`` 0 and has no ``tridentflow_up``, so the documented alert on
    up == 0 does not fire out of the box (issue 36 item 4); a configured pipeline is
    configured 1 and up 1, and one whose Redis is gone is still up 0."""
    from tridentflow.sources.kafka import BOOTSTRAP_ENV, CONFIG_ENV

    monkeypatch.delenv(BOOTSTRAP_ENV, raising=False)
    monkeypatch.delenv(CONFIG_ENV, raising=False)
    committed_twice_and_one_pending(redis_url, home)
    kafka = load_pipeline("wordcount-kafka")
    dead_url = f"redis://127.0.0.1:{free_port()}/0"
    collected = metrics.collect(
        [
            ("wordcount", partial(Runtime.open, load_pipeline("wordcount"), redis_url, home)),
            ("wordcount-kafka", partial(Runtime.open, kafka, redis_url, home)),
            ("elsewhere", partial(Runtime.open, load_pipeline("wordcount"), dead_url, home)),
        ]
    )
    assert not collected[1].configured and "needs brokers" in (collected[1].error or "")
    text = metrics.prometheus_text(collected).decode()
    samples = {
        (s.name, s.labels["pipeline"]): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[("tridentflow_configured", "wordcount-kafka")] == 0.0
    assert ("tridentflow_up", "wordcount-kafka") not in samples
    assert samples[("tridentflow_configured", "wordcount")] == 1.0
    assert samples[("tridentflow_up", "wordcount")] == 1.0
    assert samples[("tridentflow_up", "elsewhere")] == 0.0
