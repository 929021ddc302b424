"""tridentflow: Storm Trident's exactly-once batch semantics on Airflow, PySpark and Redis."""

from __future__ import annotations

from state.maps import StateKind
from tridentflow.aggregators import Combiner, Count, Max, Mean, Min, Reducer, Sum
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
    "Combiner",
    "Count",
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
    "Sum",
    "guarantee_of",
]
