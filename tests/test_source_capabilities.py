"""The optional source capabilities are declared (tridentflow.sources.base's Protocols): each
built-in log has exactly the ones its docs say, and ``produce`` answers in counts."""

from __future__ import annotations

import pytest

from tridentflow.sources import base
from tridentflow.sources.base import Produced
from tridentflow.sources.delta import DeltaLog
from tridentflow.sources.filelog import FileLog
from tridentflow.sources.files import FilesLog
from tridentflow.sources.iceberg import IcebergLog
from tridentflow.sources.kafka import KafkaLog
from tridentflow.sources.redisstream import RedisStreamLog

CAPABILITIES = {
    name: kind
    for name, kind in vars(base).items()
    if isinstance(kind, type) and getattr(kind, "_is_runtime_protocol", False)
}
"""Every capability base.py declares (a new one must be placed in DECLARED below)."""

DECLARED = {
    # the reader creates the file log and deletes it on reset --source; nothing to trim
    FileLog: {"Grows", "Produces", "AppendsSpread", "Deletes"},
    # files are their producers': the reader guards a reset --source, counts records, names
    # what waits, and closes its own Redis client
    FilesLog: {
        "ListsOnScan",
        "ReadsFilesInColumns",
        "Produces",
        "GuardsDelete",
        "CountsRecords",
        "NamesWaiting",
        "Closes",
        "Trims",
        "DescribesTrims",
        "Remembers",
    },
    # a table is its writers': it must exist, the reader refuses reset --source, counts the
    # rows appends added, names the versions waiting; nothing kept, nothing to close
    DeltaLog: {"Produces", "GuardsDelete", "CountsRecords", "NamesWaiting", "Requires"},
    # the same, with no produce: append with pyiceberg (or an IcebergSink)
    IcebergLog: {"GuardsDelete", "CountsRecords", "NamesWaiting", "Requires"},
    # a topic is its producers': never created, deleted or trimmed by its reader
    KafkaLog: {"Produces", "AppendsSpread", "Rebases", "GuardsDelete", "Requires", "Closes"},
    RedisStreamLog: {
        "Grows",
        "Produces",
        "AppendsSpread",
        "Rebases",
        "GuardsDelete",
        "Deletes",
        "Trims",
        "DescribesTrims",
        "Closes",
    },
}


@pytest.mark.parametrize("log", DECLARED, ids=lambda c: c.__name__)
def test_each_log_has_the_capabilities_it_declares(log):
    have = {name for name, proto in CAPABILITIES.items() if issubclass(log, proto)}
    assert have == DECLARED[log]


def test_produce_answers_in_counts_the_cli_prints():
    said = Produced(120, "Kafka topic wordcount", 4, written=3, notes=("topic created",))
    assert (said.records, said.written, said.partitions) == (120, 3, 4)
    assert (
        str(said)
        == "appended 120 records to Kafka topic wordcount (3 of 4 partitions; topic created)"
    )
    plain = Produced(5, "wordcount", 2, notes=("5 in the readable log",))
    assert str(plain) == "appended 5 records to wordcount (2 partitions; 5 in the readable log)"


def test_the_file_log_produces_counts(tmp_path):
    log = FileLog(tmp_path / "log")
    said = log.produce("wordcount", ['{"sentence": "a b"}'] * 5, 3, 2)
    assert isinstance(said, Produced)
    assert (said.records, said.partitions, said.target) == (5, 3, "wordcount")
    assert str(said) == "appended 5 records to wordcount (3 partitions; 5 in the readable log)"
