"""Tests of my DataFrame pipeline: no Redis, no Airflow - a local SparkSession (needs Java)."""

import sys

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from tridentflow import Count, LogSource, Pipeline, StateKind, StateSpec
from tridentflow.testing import ABORT, run_batches


@pytest.fixture(scope="session")
def spark():
    session = (
        SparkSession.builder.master("local[2]")
        .config("spark.pyspark.python", sys.executable)  # the workers run this venv
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    yield session
    session.stop()


def words(df):
    return df.select(F.explode(F.split("line", " ")).alias("word")).where("word <> ''")


def my_pipeline() -> Pipeline:
    source = LogSource(fields=("line",), schema="line string")
    pipeline = Pipeline("my-df-counts", source)
    (
        pipeline.stream.spark(words, schema="word string")
        .group_by("word")
        .persistent_aggregate(StateSpec("counts", StateKind.TRANSACTIONAL), Count(), out_field="n")
    )
    return pipeline


BATCHES = [["how are you", "nice to meet you"], ["what a good day", ABORT, "you"]]
EXACT = {"how": 1, "are": 1, "you": 3, "nice": 1, "to": 1, "meet": 1,
         "what": 1, "a": 1, "good": 1, "day": 1}  # fmt: skip


def test_counts_stay_exact_when_txids_are_retried(spark):
    states = run_batches(my_pipeline(), BATCHES, replay=[1, 2], crash_mid_commit=[2], spark=spark)
    assert states["counts"] == EXACT
