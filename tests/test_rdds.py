"""The RDD graph's pure parts (no Spark): how count reports accumulate, and which graph
classic Spark runs (tests/test_spark.py runs the graph itself on each)."""

from __future__ import annotations

import pytest

from tridentflow.engines.batchops import StageReport
from tridentflow.engines.rdds import ReportsParam
from tridentflow.engines.spark import GRAPH_ENV, graph_api
from tridentflow.errors import TridentflowError


def test_a_target_recomputed_reports_once():
    """A retried task or a dataset read twice adds its target's report again: it counts once,
    and every other target's report is kept."""
    param = ReportsParam()
    first = StageReport("1:x", 0, 2, 2, 5, 5)
    other = StageReport("1:x", 1, 2, 2, 3, 3)
    acc = param.zero({})
    for update in ({("1:x", 0): first}, {("1:x", 1): other}, {("1:x", 0): first}):
        acc = param.addInPlace(acc, update)
    assert acc == {("1:x", 0): first, ("1:x", 1): other}
    assert param.addInPlace(param.zero({}), param.zero({})) == {}


def test_classic_spark_runs_the_graph_on_rdds_unless_told_otherwise(monkeypatch):
    monkeypatch.delenv(GRAPH_ENV, raising=False)
    assert graph_api() == "rdd"
    monkeypatch.setenv(GRAPH_ENV, " Frames ")
    assert graph_api() == "frames"
    monkeypatch.setenv(GRAPH_ENV, "dataframes")
    with pytest.raises(TridentflowError, match=r"^TRIDENTFLOW_SPARK_GRAPH='dataframes': expected"):
        graph_api()
