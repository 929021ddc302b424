"""The deployment's connections travel with the runtime (tridentflow.connections): two
pipelines in one process each see only their own, and a source or sink without one of its
own and without the deployment's says which setting to give, in one line."""

from __future__ import annotations

import pytest

from tests.helpers import runtime
from tridentflow.connections import Connections
from tridentflow.errors import SourceError
from tridentflow.sinks.base import ExportContext, SinkError
from tridentflow.sinks.postgres import PostgresSink, dsn_of_uri
from tridentflow.sources.kafka import CONN_ID, resolve_config
from tridentflow.sources.specs import KafkaSource


def kafka_at(brokers: str) -> Connections:
    return Connections(
        settings=lambda conn_id: {"bootstrap.servers": brokers} if conn_id == CONN_ID else None
    )


def test_two_runtimes_in_one_process_see_their_own_kafka_connection(
    redis_url, redis_client, home, monkeypatch
):
    monkeypatch.delenv("TRIDENTFLOW_KAFKA_BOOTSTRAP", raising=False)
    monkeypatch.delenv("TRIDENTFLOW_KAFKA_CONFIG", raising=False)
    source = KafkaSource(("text",), topic="words")
    first = kafka_at("broker-a:9092")
    second = kafka_at("broker-b:9092")
    assert resolve_config(source, first)["bootstrap.servers"] == "broker-a:9092"
    assert resolve_config(source, second)["bootstrap.servers"] == "broker-b:9092"
    with pytest.raises(SourceError, match="a KafkaSource needs brokers") as refused:
        resolve_config(source)  # the CLI: no deployment connections
    assert "\n" not in str(refused.value)
    rt_a = runtime("wordcount", redis_url, home)
    rt_b = runtime("wordcount", redis_url, home)
    rt_a = rt_a.with_(connections=first)
    assert (rt_a.connections, rt_b.connections) == (first, Connections())
    own = KafkaSource(("text",), topic="words", config={"bootstrap.servers": "mine:9092"})
    assert resolve_config(own, first)["bootstrap.servers"] == "mine:9092"  # its own wins


def test_a_postgres_sink_resolves_its_conn_id_through_the_export_context(monkeypatch):
    monkeypatch.delenv("TRIDENTFLOW_POSTGRES_DSN", raising=False)
    sink = PostgresSink("counts", conn_id="warehouse")
    uris = {"warehouse": "postgres://u:p@db-a:5432/sales"}
    ctx = ExportContext("p", "g", None, "", connections=Connections(uri=uris.get))  # type: ignore[arg-type]
    assert sink.resolve_dsn(ctx.connections) == dsn_of_uri(uris["warehouse"])
    with pytest.raises(SinkError, match="define the connection warehouse") as refused:
        sink.resolve_dsn()
    assert "\n" not in str(refused.value)
    monkeypatch.setenv("TRIDENTFLOW_POSTGRES_DSN", "postgresql://env@127.0.0.1/x")
    assert sink.resolve_dsn(ctx.connections) == "postgresql://env@127.0.0.1/x"  # env first
