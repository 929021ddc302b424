"""A sink's ``bind`` keeps every setting it was made with (the family "a new option dropped on
the way": DeltaSink's change_data_feed was, once). Each sink made with a value other than its
default for every setting, then bound: every public attribute of the sink is the bound one's."""

from __future__ import annotations

import pytest

from tridentflow.sinks import DeltaSink, IcebergSink, PostgresSink, RedisStreamSink

FIELDS, KEYS = ("user", "total"), ("user",)
SET_BY_BIND = {"rows", "fields", "key_fields"}


@pytest.mark.parametrize(
    "sink",
    [
        DeltaSink("/tmp/t", mode="append", partition_by=["user"], storage_options={"a": "b"},
                  name="d", key=["user"], adopt=True, change_data_feed=True),
        IcebergSink("ns.t", catalog={"type": "sql"}, mode="append", name="i", key=["user"],
                    adopt=True),
        PostgresSink("t", dsn="postgresql://x/y", key=["user"], name="p", fillfactor=70),
        RedisStreamSink("s-{partition}", partitions=2, url="redis://x", name="r", key=["user"]),
    ],
    ids=lambda s: type(s).__name__,
)  # fmt: skip
def test_bind_keeps_every_setting(sink):
    bound = sink.bind(FIELDS, KEYS)
    made = {k: v for k, v in vars(sink).items() if not k.startswith("_") and k not in SET_BY_BIND}
    kept = {k: v for k, v in vars(bound).items() if k in made}
    assert kept == made
