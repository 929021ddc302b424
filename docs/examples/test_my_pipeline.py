"""Tests of my pipeline: no Redis, no Spark, no Airflow - just pytest."""

from tridentflow import Count, LogSource, Pipeline, SourceMode, StateKind, StateSpec
from tridentflow.testing import ABORT, CollectSink, run_batches


def my_pipeline(sink=None) -> Pipeline:
    pipeline = Pipeline("my-counts", LogSource(fields=("line",), mode=SourceMode.OPAQUE))
    counts = (
        pipeline.stream.each("line", lambda line: [(w,) for w in line.split()], "word")
        .group_by("word")
        .persistent_aggregate(StateSpec("counts", StateKind.OPAQUE), Count(), out_field="n")
    )
    if sink is not None:
        counts.new_values_stream().sink(sink)
    return pipeline


BATCHES = [["how are you", "nice to meet you"], ["what a good day", ABORT, "you"]]
EXACT = {"how": 1, "are": 1, "you": 3, "nice": 1, "to": 1, "meet": 1,
         "what": 1, "a": 1, "good": 1, "day": 1}  # fmt: skip


def test_counts():
    assert run_batches(my_pipeline(), BATCHES)["counts"] == EXACT


def test_counts_stay_exact_when_txids_are_retried():
    # txid 1's commit runs twice, txid 2's first commit dies half-way, txid 2's emit aborts
    states = run_batches(my_pipeline(), BATCHES, replay=[1, 2], crash_mid_commit=[2])
    assert states["counts"] == EXACT


def test_the_sink_gets_each_txids_new_values():
    sink = CollectSink()
    run_batches(my_pipeline(sink), BATCHES, replay=[2])
    assert sink.batches[2] == [("a", 1), ("day", 1), ("good", 1), ("what", 1), ("you", 3)]
