"""Settings that change what commits write are recorded with the pipeline in Redis
(tridentflow.steps.recorded_settings): every component reads the same, and a process that
would change one without meaning to is refused in one line before it writes anything."""

from __future__ import annotations

import json

import pytest

from tests.helpers import produce, runtime, sentences
from tridentflow import Count, LogSource, Pipeline, SourceMode, StateKind, StateSpec
from tridentflow.engines.local import LocalEngine
from tridentflow.ops.cli import main
from tridentflow.ops.status import format_status, status
from tridentflow.sinks.redisstream import RedisStreamSink
from tridentflow.steps.driver import run_batches
from tridentflow.steps.recorded_settings import SettingsDisagreeError
from tridentflow.steps.runtime import Runtime

ENGINE = LocalEngine()


def drain(rt: Runtime) -> None:
    run_batches(rt, ENGINE, batch_size=4)


def committed_by_a_process_with(monkeypatch, redis_url, home, retain: str) -> Runtime:
    """Commits of a process whose environment says TRIDENTFLOW_RETAIN_TXIDS=``retain`` (an
    Airflow worker's, say); the variable is unset again afterwards."""
    monkeypatch.setenv("TRIDENTFLOW_RETAIN_TXIDS", retain)
    rt = runtime("wordcount", redis_url, home)
    produce(rt, sentences(8))
    drain(rt)
    monkeypatch.delenv("TRIDENTFLOW_RETAIN_TXIDS")
    return rt


def test_retention_set_in_one_components_environment_is_what_every_component_reads(
    redis_url, redis_client, home, monkeypatch
):
    """The reported case: TRIDENTFLOW_RETAIN_TXIDS in Airflow's environment, not the CLI's;
    `status` said `retain_txids is 0`. The first commit records it; a process without it
    reads the record (status, its own commits' undo logs)."""
    committed_by_a_process_with(monkeypatch, redis_url, home, "3")
    cli = runtime("wordcount", redis_url, home)
    assert cli.retain_txids == 3
    info = status(cli)
    assert info["retain_txids"] == 3 and info["settings"]["disagreements"] == []
    assert info["rewindable"]["retain_txids"] == 3
    produce(cli, sentences(8, seed=2))
    drain(cli)  # its commits keep undo logs too: the range moves on
    assert status(cli)["rewindable"]["newest"] == cli.ledger.committed_txid()


@pytest.mark.parametrize("value", ["0", "7"])
def test_an_environment_that_disagrees_is_refused_in_one_line_before_anything_is_written(
    redis_url, redis_client, home, monkeypatch, value
):
    rt = committed_by_a_process_with(monkeypatch, redis_url, home, "3")
    committed = rt.ledger.committed_txid()
    monkeypatch.setenv("TRIDENTFLOW_RETAIN_TXIDS", value)
    other = runtime("wordcount", redis_url, home)
    produce(other, sentences(4, seed=3))
    with pytest.raises(SettingsDisagreeError) as refused:
        drain(other)
    line = str(refused.value)
    assert "\n" not in line
    assert line.startswith(f"TRIDENTFLOW_RETAIN_TXIDS={value} in this process, but wordcount's")
    assert "keep 3 txid(s)" in line and "tridentflow settings wordcount --record" in line
    assert other.ledger.committed_txid() == committed  # nothing written
    assert other.retain_txids == 3  # what a reader uses meanwhile
    assert f"SETTINGS       {line}" in format_status(status(other))
    # the way out the line names: record it for every component; then the commit goes
    out = []

    class Out:
        def write(self, text: str) -> None:
            out.append(text)

    args = ["settings", "wordcount", "--record", "--json", "--redis-url", redis_url]
    assert main([*args, "--home", str(home)], Out()) == 0
    shown = json.loads("".join(out))
    assert shown["recorded"]["retain_txids"] == value and shown["disagreements"] == []
    drain(other)
    assert other.ledger.committed_txid() > committed


def test_the_command_line_and_the_pipelines_code_change_the_record(
    redis_url, redis_client, home, monkeypatch
):
    committed_by_a_process_with(monkeypatch, redis_url, home, "3")
    changed = runtime("wordcount", redis_url, home)
    changed = changed.with_(retain=5)  # `run --retain-txids 5`: meant
    produce(changed, sentences(4, seed=4))
    drain(changed)
    assert changed.ledger.settings()["retain_txids"] == "5"
    assert runtime("wordcount", redis_url, home).retain_txids == 5


def test_an_unset_value_is_no_decision(redis_url, redis_client, home, monkeypatch):
    """A commit with no retention set records none; a later environment's value is taken."""
    monkeypatch.delenv("TRIDENTFLOW_RETAIN_TXIDS", raising=False)
    rt = runtime("wordcount", redis_url, home)
    produce(rt, sentences(8))
    drain(rt)
    assert "retain_txids" not in rt.ledger.settings()
    monkeypatch.setenv("TRIDENTFLOW_RETAIN_TXIDS", "2")
    later = runtime("wordcount", redis_url, home)
    produce(later, sentences(4, seed=5))
    drain(later)
    assert later.ledger.settings()["retain_txids"] == "2"


def _summed(with_sink: bool) -> Pipeline:
    pipeline = Pipeline(
        "settings-sinked", LogSource(fields=("line",), mode=SourceMode.TRANSACTIONAL, partitions=1)
    )
    counts = (
        pipeline.stream.each("line", lambda line: ((w,) for w in line.split()), "word")
        .group_by("word")
        .persistent_aggregate(StateSpec("counts", StateKind.OPAQUE), Count(), out_field="count")
    )
    if with_sink:
        counts.new_values_stream().sink(RedisStreamSink("settings-sinked-changes"))
    return pipeline


def test_a_process_whose_pipeline_lost_a_sink_cannot_commit_without_its_change_logs(
    redis_url, redis_client, home
):
    sinked = Runtime.open(_summed(True), redis_url, home)
    produce(sinked, sentences(6))
    drain(sinked)
    committed = sinked.ledger.committed_txid()
    older = Runtime.open(_summed(False), redis_url, home)  # another version of the pipeline
    produce(older, sentences(4, seed=6))
    with pytest.raises(SettingsDisagreeError) as refused:
        drain(older)
    line = str(refused.value)
    assert line.startswith("this process's pipeline settings-sinked writes no change log of")
    assert "['counts']" in line and "load the same pipeline definition" in line
    assert older.ledger.committed_txid() == committed
    drain(sinked)  # the component holding the whole pipeline goes on
    assert sinked.ledger.committed_txid() > committed
