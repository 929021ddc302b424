"""Benchmark: which reader a FileSource's columnar read uses on Spark (issue 69 goal 4) - the
production typed read (pyarrow on the executors, inside a ``mapInArrow``) against Spark's own
Parquet reader over the same paths, each feeding the same ``groupBy().agg()``.

    python -m benchmarks.file_readers [--files 100] [--rows 1000] [--txids 5]

--txids batches of --files Parquet files of --rows rows (``user``, ``amount``), each summed
per user in one warm local session (2 cores) by both readers (which goes first alternates),
their sums checked equal. Seconds per txid, best and median; a first txid warms both readers
up and is not counted. The pyarrow read is tridentflow's own (``engines.columnar._typed_body``
over surveyed files); Spark's is ``spark.read.schema(...).parquet(*paths)``, which lists the
paths it is given on the driver first (its file index) - a Spark job of its own past
``spark.sql.sources.parallelPartitionDiscovery.threshold`` (32) paths.
"""

from __future__ import annotations

import argparse
import functools
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.files_vs_spark import SCHEMA, generate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=100)
    parser.add_argument("--rows", type=int, default=1_000)
    parser.add_argument("--txids", type=int, default=5)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tf-bench-readers-"))
    try:
        run(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(args: argparse.Namespace, work: Path) -> None:
    import pyarrow.parquet as pq
    from pyspark.sql import functions as F

    from benchmarks.vs_spark import _session
    from tridentflow.engines.columnar import COLUMNS, FileRows, FrozenFile, _typed_body
    from tridentflow.schemas import parse_schema
    from tridentflow.sources.files import FileReader

    landing = work / "landing"
    generate(landing, args.files * (args.txids + 1), args.rows)
    paths = sorted(landing.glob("*.parquet"))
    schema = parse_schema(SCHEMA)
    reader = FileReader(str(landing), "parquet", {}, opaque=False)
    how = FileRows(reader, None, None, schema)
    spark = _session("bench-file-readers")
    spark.conf.set("spark.sql.adaptive.enabled", "false")  # as the engine plans a txid
    groups = spark.sparkContext.defaultParallelism

    def pyarrow_read(batch: list[Path]) -> dict[str, int]:
        files = []
        for offset, path in enumerate(batch):
            stat = path.stat()
            entry = {"path": str(path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
            rows = pq.read_metadata(path).num_rows
            files.append(FrozenFile(0, offset, entry, COLUMNS, rows))
        surveyed = [files[i::groups] for i in range(groups)]
        body = functools.partial(_typed_body, how, surveyed)
        typed = spark.range(0, groups, 1, groups).mapInArrow(body, schema.to_spark())
        return summed(typed)

    def spark_read(batch: list[Path]) -> dict[str, int]:
        return summed(spark.read.schema(SCHEMA).parquet(*[str(p) for p in batch]))

    def summed(df) -> dict[str, int]:
        rows = df.groupBy("user").agg(F.sum("amount").alias("total")).collect()
        return {r["user"]: int(r["total"]) for r in rows}

    readers = {"pyarrow on the executors": pyarrow_read, "Spark's reader": spark_read}
    seconds: dict[str, list[float]] = {name: [] for name in readers}
    for txid in range(args.txids + 1):
        batch = paths[txid * args.files : (txid + 1) * args.files]
        order = list(readers) if txid % 2 == 0 else list(reversed(readers))  # fair to both
        results = []
        for name in order:
            started = time.monotonic()
            results.append(readers[name](batch))
            if txid:
                seconds[name].append(time.monotonic() - started)
        assert results[0] == results[1] and results[0], "the two readers' sums differ"
    spark.stop()
    print(f"{args.files} Parquet files of {args.rows:,} rows a txid, {args.txids} txids each")
    print(f"{'reader':<26} {'best s':>8} {'median s':>9} {'records/s (median)':>19}")
    for name, times in seconds.items():
        median = statistics.median(times)
        rate = args.files * args.rows / median
        print(f"{name:<26} {min(times):>8.3f} {median:>9.3f} {rate:>19,.0f}")


if __name__ == "__main__":
    main()
