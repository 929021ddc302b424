"""spark-submit application: emit one txid of a pipeline.

    spark-submit spark_jobs/emit_batch.py --pipeline wordcount (--txid 7 | --run-id RUN) \
        [--lease-ms MS] [--redis-url redis://...] [--home DIR] [--faults SPEC]

With --run-id, the txid is the one the orchestrator run is bound to (see tridentflow.steps.runs);
its lease is renewed for --lease-ms (the DAG's ``lease``).
The Redis URL may also come from TRIDENTFLOW_REDIS_URL (keeps passwords off the command line).
Reads the txid's batch metadata from the ledger, computes the per-key partial aggregates on
Spark, stages them under (txid, attempt) and records the attempt as staged. A committed txid
is a no-op. Prints one JSON line with the result; on any failure exits 1 with one line on
stderr naming the cause (a Python exception in a Spark task included), also written to the
file TRIDENTFLOW_ERROR_FILE names, if set (the Airflow operator reports it as its own error).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from tridentflow.engines.spark import SparkEngine, spark_session
from tridentflow.errors import one_line
from tridentflow.faults import FaultPlan
from tridentflow.registry import load_pipeline
from tridentflow.steps.emitter import emit
from tridentflow.steps.runs import emit_summary, owned_txid
from tridentflow.steps.runtime import Runtime
from tridentflow_state.ledger import DEFAULT_LEASE_MS


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="emit_batch.py", description=__doc__.splitlines()[0])
    parser.add_argument("--pipeline", required=True, help="bundled name or module:attribute")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--txid", type=int)
    which.add_argument("--run-id")
    parser.add_argument("--lease-ms", type=int, default=DEFAULT_LEASE_MS)
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
        run_id, lease_ms = args.run_id, args.lease_ms
        txid = args.txid if run_id is None else owned_txid(rt, run_id, lease_ms)
        spark = spark_session(f"tridentflow-emit-{rt.pipeline.name}-{txid}")
        try:
            staged = emit(rt, txid, SparkEngine(spark))
        finally:
            spark.stop()
    except Exception as exc:  # every failure is one line naming its cause
        report_error(one_line(exc), getattr(exc, "retry_helps", True))
        return 1
    print(json.dumps(emit_summary(rt, txid, staged)))
    return 0


def report_error(line: str, retry_helps: bool = True) -> None:
    """The failure on stderr, and as JSON ``{"line", "retry_helps"}`` in the file
    TRIDENTFLOW_ERROR_FILE names (the operator fails without retrying what a retry cannot
    fix: tridentflow.errors.TridentflowError.retry_helps)."""
    sys.stderr.write(f"emit_batch: error: {line}\n")
    sys.stderr.flush()
    path = os.environ.get("TRIDENTFLOW_ERROR_FILE")
    if path:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(json.dumps({"line": line, "retry_helps": retry_helps}) + "\n")


if __name__ == "__main__":
    sys.exit(main())
