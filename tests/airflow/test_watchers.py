"""The asset watcher on a pipeline's source (tridentflow_airflow.watchers), as the triggerer runs
it: fires when records arrive, not while idle, not again while a run holds the txid; keeps
polling through a Redis outage; serializes to what the triggerer stores (no secrets)."""

from __future__ import annotations

import asyncio
import contextlib
import json

import pytest
from airflow.sdk import AssetWatcher
from airflow.triggers.base import BaseEventTrigger

from tests.helpers import produce, runtime, sentences
from tridentflow.devtools import devredis
from tridentflow.engines.local import LocalEngine
from tridentflow.errors import TridentflowError
from tridentflow.steps.driver import run_batches
from tridentflow.steps.runs import coordinate_run
from tridentflow_airflow import pipeline_dag
from tridentflow_airflow.launcher import redis_connection
from tridentflow_airflow.watchers import SourceDataTrigger, source_asset

pytestmark = pytest.mark.airflow


@pytest.fixture
def redis_conn(redis_url, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_REDIS_DEFAULT", json.dumps(redis_connection(redis_url)))


async def events_within(trigger: SourceDataTrigger, seconds: float, at_most: int = 5) -> list:
    """The events ``trigger.run()`` yields within ``seconds`` (stops after ``at_most``)."""
    got: list = []

    async def collect() -> None:
        async for event in trigger.run():
            got.append(event.payload)
            if len(got) >= at_most:
                return

    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(collect(), seconds)
    return got


def test_fires_when_records_arrive_and_not_while_idle_or_held(
    redis_url, redis_client, redis_conn, home
):
    rt = runtime("wordcount-opaque", redis_url, home)
    trigger = SourceDataTrigger("wordcount-opaque", home=str(home), poll_interval=0.05)
    assert asyncio.run(events_within(trigger, 0.6)) == []  # no log, no records: no event
    produce(rt, sentences(6))
    events = asyncio.run(events_within(trigger, 0.6))
    assert len(events) == 1, events  # once: the fire is unanswered, not repeated within 10 s
    assert events[0]["pipeline"] == "wordcount-opaque" and events[0]["records"] == 6
    coordinate_run(rt, "run-1")
    assert asyncio.run(events_within(trigger, 0.6)) == []  # a live run holds the txid
    run_batches(rt, LocalEngine())  # adopts and commits everything
    assert asyncio.run(events_within(trigger, 0.6)) == []


def test_keeps_polling_through_a_redis_outage(tmp_path, home, monkeypatch):
    port = devredis.free_port()
    url = f"redis://127.0.0.1:{port}/0"
    monkeypatch.setenv("AIRFLOW_CONN_REDIS_DEFAULT", json.dumps(redis_connection(url)))
    trigger = SourceDataTrigger("wordcount", home=str(home), poll_interval=0.05)

    async def outage_then_records() -> list:
        watching = asyncio.ensure_future(events_within(trigger, 8, at_most=1))
        await asyncio.sleep(0.5)  # Redis is not there: the watcher logs and retries
        assert not watching.done()
        server = devredis.start(port, tmp_path / "redis")
        try:
            produce(runtime("wordcount", url, home), sentences(3))
            return await watching
        finally:
            server.kill()

    events = asyncio.run(outage_then_records())
    assert [e["records"] for e in events] == [3]


def test_serializes_without_secrets_and_round_trips():
    trigger = SourceDataTrigger("wordcount", "redis_default", "/data/tf", 2.0, 30.0, "d")
    classpath, kwargs = trigger.serialize()
    assert classpath == "tridentflow_airflow.watchers.SourceDataTrigger"
    assert kwargs == {
        "pipeline": "wordcount",
        "redis_conn_id": "redis_default",
        "home": "/data/tf",
        "poll_interval": 2.0,
        "refire_after": 30.0,
        "dag_id": "d",
    }
    assert SourceDataTrigger(**kwargs).serialize() == (classpath, kwargs)
    assert isinstance(trigger, BaseEventTrigger)
    assert trigger.run_state("any-run") is None  # not in a triggerer: it cannot tell
    with pytest.raises(ValueError, match="poll_interval must be > 0"):
        SourceDataTrigger("wordcount", poll_interval=0)


def test_on_data_schedules_the_dag_on_the_watched_source_asset():
    dag = pipeline_dag("wordcount-opaque", dag_id="on_data_test", schedule="on-data")
    (asset,) = list(dag.timetable.asset_condition.objects)
    assert asset == source_asset("wordcount-opaque", "wordcount-opaque", dag_id="on_data_test")
    assert (asset.name, asset.uri) == (
        "tridentflow/wordcount-opaque",
        "tridentflow://redis_default/wordcount-opaque",
    )
    (watcher,) = asset.watchers
    assert isinstance(watcher, AssetWatcher)
    kwargs = watcher.trigger.serialize()[1]
    assert (kwargs["pipeline"], kwargs["dag_id"]) == ("wordcount-opaque", "on_data_test")
    with pytest.raises(TridentflowError, match="watch_interval must be > 0 seconds"):
        pipeline_dag("wordcount", schedule="on-data", watch_interval=0)


def test_fires_for_a_redis_stream_and_a_kafka_topic_as_for_the_file_log(
    redis_url, redis_client, redis_conn, home, monkeypatch
):
    """The watcher reads a source's heads through its log, whatever the source: records
    XADDed to a pipeline's streams, or produced to its Kafka topic (a real broker, Tansu),
    fire it once; after a run commits them, nothing."""
    from tridentflow.devtools.devkafka import LocalKafka
    from tridentflow.sources.kafka import KafkaLog

    with LocalKafka() as broker:
        monkeypatch.setenv("TRIDENTFLOW_KAFKA_BOOTSTRAP", broker.bootstrap)
        topic = KafkaLog("wordcount", {"bootstrap.servers": broker.bootstrap}, "wordcount-kafka")
        topic.create(4)
        for pipeline in ("wordcount-stream", "wordcount-kafka"):
            rt = runtime(pipeline, redis_url, home)
            trigger = SourceDataTrigger(pipeline, home=str(home), poll_interval=0.05)
            assert asyncio.run(events_within(trigger, 0.6)) == [], pipeline
            if pipeline == "wordcount-kafka":
                topic.append_spread(sentences(7, seed=11))
            else:
                produce(rt, sentences(7, seed=11))
            events = asyncio.run(events_within(trigger, 3, at_most=1))
            assert [(e["pipeline"], e["records"]) for e in events] == [(pipeline, 7)], pipeline
            run_batches(rt, LocalEngine())
            assert asyncio.run(events_within(trigger, 0.6)) == [], pipeline
