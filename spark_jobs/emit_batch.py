"""spark-submit application: emit one txid of a pipeline.

    spark-submit spark_jobs/emit_batch.py --pipeline wordcount (--txid 7 | --run-id RUN) \
        [--redis-url redis://...] [--home DIR] [--faults SPEC]

With --run-id, the txid is the one the orchestrator run is bound to (see tridentflow.runs).
The Redis URL may also come from TRIDENTFLOW_REDIS_URL (keeps passwords off the command line).
Reads the txid's batch metadata from the ledger, computes the per-key partial aggregates on
Spark, stages them under (txid, attempt) and records the attempt as staged. A committed txid
is a no-op. Prints one JSON line with the result; exits 1 with a one-line error on failure.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from state.errors import StateError
from tridentflow.emitter import emit
from tridentflow.errors import TridentflowError
from tridentflow.faults import FaultPlan, InjectedFault
from tridentflow.registry import load_pipeline
from tridentflow.runs import owned_txid
from tridentflow.runtime import Runtime
from tridentflow.spark_engine import SparkEngine, spark_session


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="emit_batch.py", description=__doc__.splitlines()[0])
    parser.add_argument("--pipeline", required=True, help="bundled name or module:attribute")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--txid", type=int)
    which.add_argument("--run-id")
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
        txid = args.txid if args.run_id is None else owned_txid(rt, args.run_id)
        spark = spark_session(f"tridentflow-emit-{rt.pipeline.name}-{txid}")
        try:
            staged = emit(rt, txid, SparkEngine(spark))
        finally:
            spark.stop()
    except (TridentflowError, StateError, InjectedFault) as exc:
        sys.stderr.write(f"emit_batch: error: {exc}\n")
        return 1
    result = {"pipeline": rt.pipeline.name, "txid": txid, "status": "already-committed"}
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
