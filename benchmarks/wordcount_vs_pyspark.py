"""Benchmark: the compiled word count (tridentflow's Spark engine) vs hand-written PySpark.

    python benchmarks/wordcount_vs_pyspark.py [--records 1000000] [--repeat 3]

Same data for all: --records sentences in a 4-partition file log (one JSON string per line).
* compiled: SparkEngine.compute over every range (read through the log's index, per-record
  plan with quarantine and per-task partial aggregation, an exchange by key with count
  reports, combine in sender order, results to the driver) - what an emit does
  before staging;
* hand-written RDD: textFile(segments) -> json.loads -> split -> (w, 1) -> reduceByKey -> collect;
* hand-written DataFrame: read.text -> from_json -> split/explode -> groupBy.count -> collect
  (no Python UDF: all in the JVM);
* DataFrame with a Python UDF: the same, but the split is a Python function (what a pipeline's
  arbitrary `each` function would need) - the measure behind compiling to RDDs.
Prints the best of --repeat runs of each and the ratios.
"""

from __future__ import annotations

import argparse
import json
import operator
import random
import shutil
import tempfile
import time
from pathlib import Path

from tridentflow.engines.spark import SparkEngine, spark_session
from tridentflow.plan import compile_pipeline
from tridentflow.registry import load_pipeline
from tridentflow.sources.filelog import FileLog

WORDS = [f"w{i}" for i in range(5000)]


def best(fn, repeat: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        started = time.monotonic()
        result = fn()
        times.append(time.monotonic() - started)
    return min(times), result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tf-bench-wc-"))
    try:
        log = FileLog(work / "log")
        log.ensure(4)
        rng = random.Random(1)
        log.append_spread(" ".join(rng.choices(WORDS, k=8)) for _ in range(args.records))
        ranges = {p: (0, h) for p, h in log.heads().items()}
        glob = str(log.root / "p-*" / "seg-*.jsonl")
        spark = spark_session("tridentflow-bench-wc")
        sc = spark.sparkContext
        plan = compile_pipeline(load_pipeline("wordcount"))
        engine = SparkEngine(spark)

        def compiled():
            result = engine.compute(plan, str(log.root), ranges)
            return dict(result.partials["counts"])

        def rdd():
            return dict(
                sc.textFile(glob)
                .map(json.loads)
                .flatMap(str.split)
                .map(lambda w: (w, 1))
                .reduceByKey(operator.add)
                .collect()
            )

        def dataframe():
            from pyspark.sql import functions as F

            # each line is a JSON string literal: wrap it in an array to parse it natively
            parsed = F.from_json(F.concat(F.lit("["), "value", F.lit("]")), "array<string>")
            df = spark.read.text(glob).select(parsed[0].alias("s"))
            words = df.select(F.explode(F.split("s", " ")).alias("w"))
            return {r["w"]: r["count"] for r in words.groupBy("w").count().collect()}

        def dataframe_udf():
            from pyspark.sql import functions as F
            from pyspark.sql.types import ArrayType, StringType

            split = F.udf(lambda s: s.split(), ArrayType(StringType()))
            parsed = F.from_json(F.concat(F.lit("["), "value", F.lit("]")), "array<string>")
            df = spark.read.text(glob).select(parsed[0].alias("s"))
            words = df.select(F.explode(split("s")).alias("w"))
            return {r["w"]: r["count"] for r in words.groupBy("w").count().collect()}

        compiled()  # warm up the JVM and Python workers
        t_compiled, counts = best(compiled, args.repeat)
        t_rdd, by_rdd = best(rdd, args.repeat)
        t_df, by_df = best(dataframe, args.repeat)
        t_udf, by_udf = best(dataframe_udf, args.repeat)
        assert {json.loads(k)[0]: v for k, v in counts.items()} == by_rdd == by_df == by_udf
        print(f"{args.records} sentences, {sum(by_rdd.values())} words, best of {args.repeat}:")
        print(f"compiled (tridentflow): {t_compiled:.2f}s")
        print(
            f"hand-written RDD:       {t_rdd:.2f}s   ratio compiled/RDD = {t_compiled / t_rdd:.2f}"
        )
        print(f"hand-written DataFrame: {t_df:.2f}s   ratio compiled/DF  = {t_compiled / t_df:.2f}")
        print(
            f"DataFrame + Python UDF: {t_udf:.2f}s   ratio compiled/UDF = {t_compiled / t_udf:.2f}"
        )
        spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
