"""tridentflow: Storm Trident's exactly-once batch semantics on Airflow, PySpark and Redis."""

from __future__ import annotations

from tridentflow.aggregators import (
    Aggregator,
    BatchInfo,
    Combiner,
    Count,
    First,
    Max,
    Mean,
    Min,
    Reducer,
    StateUpdater,
    StateView,
    Sum,
)
from tridentflow.nodes import StateSpec
from tridentflow.pipeline import GUARANTEES, Guarantee, Pipeline, guarantee_of
from tridentflow.sinks import DeltaSink, IcebergSink, PostgresSink, RedisStreamSink
from tridentflow.sources.specs import (
    CustomSource,
    DeltaSource,
    FileSource,
    IcebergSource,
    KafkaSource,
    LogSource,
    RedisStreamSource,
    SourceMode,
)
from tridentflow.static_state import FileLookup, RedisHashLookup
from tridentflow_state.maps import REMOVE, StateKind

__all__ = [
    "GUARANTEES",
    "REMOVE",
    "Aggregator",
    "BatchInfo",
    "Combiner",
    "Count",
    "CustomSource",
    "DeltaSink",
    "DeltaSource",
    "FileLookup",
    "FileSource",
    "First",
    "Guarantee",
    "IcebergSink",
    "IcebergSource",
    "KafkaSource",
    "LogSource",
    "Max",
    "Mean",
    "Min",
    "Pipeline",
    "PostgresSink",
    "RedisHashLookup",
    "RedisStreamSink",
    "RedisStreamSource",
    "Reducer",
    "SourceMode",
    "StateKind",
    "StateSpec",
    "StateUpdater",
    "StateView",
    "Sum",
    "guarantee_of",
]
