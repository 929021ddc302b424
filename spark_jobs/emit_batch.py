"""spark-submit application: emit one txid of a pipeline.

    spark-submit spark_jobs/emit_batch.py --pipeline wordcount --txid 7 \
        [--redis-url redis://...] [--home DIR] [--faults SPEC]

Reads the txid's batch metadata from the ledger, computes the per-key partial aggregates on
Spark, stages them under (txid, attempt) and records the attempt as staged. A committed txid
is a no-op. Prints one JSON line with the result; exits 1 with a one-line error on failure.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from tridentflow.emitter import emit
from tridentflow.errors import TridentflowError
from tridentflow.faults import FaultPlan
from tridentflow.registry import load_pipeline
from tridentflow.runtime import Runtime
from tridentflow.spark_engine import SparkEngine, spark_session


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="emit_batch.py", description=__doc__.splitlines()[0])
    parser.add_argument("--pipeline", required=True, help="bundled name or module:attribute")
    parser.add_argument("--txid", required=True, type=int)
    parser.add_argument("--redis-url")
    parser.add_argument("--home")
    parser.add_argument("--faults")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        rt = Runtime.open(
            load_pipeline(args.pipeline),
            redis_url=args.redis_url,
            home=args.home,
            faults=FaultPlan.from_env(args.faults),
        )
        spark = spark_session(f"tridentflow-emit-{rt.pipeline.name}-{args.txid}")
        try:
            staged = emit(rt, args.txid, SparkEngine(spark))
        finally:
            spark.stop()
    except TridentflowError as exc:
        sys.stderr.write(f"emit_batch: error: {exc}\n")
        return 1
    result = {"pipeline": rt.pipeline.name, "txid": args.txid, "status": "already-committed"}
    if staged is not None:
        result.update(
            status="staged",
            attempt=staged.attempt,
            records=staged.records,
            ranges=staged.manifest["ranges"],
            skipped=staged.manifest["skipped"],
        )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
