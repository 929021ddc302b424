"""tridentflow: Storm Trident's exactly-once batch semantics on Airflow, PySpark and Redis."""

from __future__ import annotations

from state.maps import StateKind
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
    Sum,
)
from tridentflow.pipeline import (
    GUARANTEES,
    Guarantee,
    LogSource,
    Pipeline,
    SourceMode,
    StateSpec,
    guarantee_of,
)

__all__ = [
    "GUARANTEES",
    "Aggregator",
    "BatchInfo",
    "Combiner",
    "Count",
    "First",
    "Guarantee",
    "LogSource",
    "Max",
    "Mean",
    "Min",
    "Pipeline",
    "Reducer",
    "SourceMode",
    "StateKind",
    "StateSpec",
    "StateUpdater",
    "Sum",
    "guarantee_of",
]
