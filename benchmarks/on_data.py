"""Benchmark: a txid when data arrives (``schedule="on-data"``) against ``@continuous``, on the
same pipeline and data (issue 38, goal 1).

    python -m benchmarks.on_data [--trickle 10] [--backlog 1000000] [--idle 60]

Starts a private Redis and the Airflow stack over a local Spark Connect server (`tridentflow-
airflow up --spark-connect`). The pipeline is ``wordcount-opaque`` under its two DAGs,
``tridentflow_wordcount_on_data`` and ``tridentflow_wordcount_continuous`` (both at most
100,000 records per partition and txid), one unpaused at a time; the other DAGs paused:

1. **Idle.** The stack's CPU (every component's process group, task processes included) over
   ``--idle`` seconds with nothing arriving: both DAGs paused, then each unpaused alone.
2. **Trickle.** ``--trickle`` times: one sentence appended, then wait until it is committed:
   produce -> commit seconds (Redis's clock: the append, and the commit step's end in the
   ledger), after one warm-up (not counted). p50 and max. Goal: on-data p50 <= 5 s.
3. **Backlog.** ``--backlog`` sentences appended at once while the DAG runs (a burst arriving:
   @continuous is looping on empty txids, on-data waiting): records/s from the start of the
   append to the last commit. Goal: on-data >= 0.9x @continuous.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.airflow_connect import _cpu_seconds_by_group, warm_session
from benchmarks.vs_spark import generate
from tridentflow.devtools import connect_server, devredis
from tridentflow.registry import load_pipeline
from tridentflow.steps.runtime import Runtime
from tridentflow_airflow import launcher
from tridentflow_airflow.rest import AirflowApi

ON_DATA = "tridentflow_wordcount_on_data"
CONTINUOUS = "tridentflow_wordcount_continuous"
DAGS = (ON_DATA, CONTINUOUS)
OTHER_DAGS = (
    "tridentflow_partitioned_count",
    "tridentflow_user_scores",
    "tridentflow_wordcount_drpc",
    "tridentflow_wordcount",
    "tridentflow_wordcount_stream",
    "tridentflow_wordcount_postgres",
    "tridentflow_wordcount_kafka",
)


def wait_committed(rt: Runtime, timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    while rt.ledger.committed_offsets() != rt.log.heads():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not committed in {timeout:.0f}s")
        time.sleep(0.05)


def quiesce(api: AirflowApi, rt: Runtime, dag_id: str) -> None:
    """``dag_id`` paused and its runs over (a run in flight finishes first)."""
    api.pause(dag_id)
    deadline = time.monotonic() + 300
    while True:
        runs = api.call("GET", f"/dags/{dag_id}/dagRuns?state=running&state=queued")
        if not runs["dag_runs"] and not rt.ledger.pending_txids():
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{dag_id} still has runs after 300s")
        time.sleep(0.5)


def idle_cpu(pids: dict[str, int], seconds: float) -> int:
    before = _cpu_seconds_by_group(set(pids.values()))
    time.sleep(seconds)
    after = _cpu_seconds_by_group(set(pids.values()))
    return sum(after[pid] - before[pid] for pid in pids.values())


def commit_after(rt: Runtime, since_ms: int) -> int:
    """The end (Redis ms) of the first commit after ``since_ms`` that read records."""
    for entry in sorted(rt.ledger.history(limit=50), key=lambda e: e["txid"]):
        ended = entry["steps"]["commit"]["ended_ms"]
        if entry.get("records") and ended >= since_ms:
            return ended
    raise AssertionError(f"no commit with records after {since_ms}")


def trickle(rt: Runtime, home: Path, times: int, seed: int) -> list[float]:
    """Produce -> commit seconds of one sentence, ``times`` times after a warm-up."""
    out = []
    for i in range(times + 1):
        generate(home, 1, "wordcount-opaque", seed=seed + i)
        appended = rt.redis_now_ms()
        wait_committed(rt)
        if i:
            out.append((commit_after(rt, appended) - appended) / 1000)
    return out


def backlog(api: AirflowApi, rt: Runtime, home: Path, dag_id: str, sentences: int) -> float:
    """Records/s of ``dag_id`` (running) draining ``sentences`` appended at once."""
    api.pause(dag_id, paused=False)
    time.sleep(5)  # its loop (or its watcher) settled
    started = time.monotonic()
    generate(home, sentences, "wordcount-opaque", seed=900)  # the same sentences for each
    wait_committed(rt, timeout=1800)
    return sentences / (time.monotonic() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trickle", type=int, default=10, help="single records, one by one")
    parser.add_argument("--backlog", type=int, default=1_000_000, help="sentences (0: skip)")
    parser.add_argument("--idle", type=float, default=60, help="seconds of idle CPU (0: skip)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tf-bench-on-data-"))
    home = work / "home"
    connect_port, api_port = devredis.free_port(), devredis.free_port()
    saved = dict(os.environ)
    try:
        with devredis.emptied_databases(work / "redis", 3) as (redis_url,):
            os.environ.pop("TRIDENTFLOW_FAULTS", None)
            info = launcher.up(home, api_port, redis_url, spark_connect=connect_port)
            api = AirflowApi(info["url"], launcher.admin_password(home), ON_DATA)
            for dag_id in DAGS:
                api.wait_for_dag(dag_id)
            api.pause(*OTHER_DAGS, *DAGS)
            rt = Runtime.open(load_pipeline("wordcount-opaque"), redis_url, home)
            warm_session(f"sc://127.0.0.1:{connect_port}", rt)
            rows: dict[str, dict[str, str]] = {dag: {} for dag in DAGS}
            if args.idle > 0:
                time.sleep(10)  # past start-up
                base = idle_cpu(info["pids"], args.idle)
                print(f"idle, both paused: {base} CPU s in {args.idle:.0f} s", flush=True)
            for dag_id in DAGS:
                row = rows[dag_id]
                api.pause(dag_id, paused=False)
                if args.idle > 0:
                    time.sleep(5)
                    cpu = idle_cpu(info["pids"], args.idle)
                    row["idle"] = f"{cpu} CPU s ({100 * cpu / args.idle:.0f}% of a core)"
                    print(f"{dag_id} idle: {row['idle']}", flush=True)
                if args.trickle:
                    took = trickle(rt, home, args.trickle, seed=500 if dag_id == ON_DATA else 700)
                    row["trickle"] = (
                        f"p50 {statistics.median(took):.2f} s, max {max(took):.2f} s "
                        f"({', '.join(f'{t:.2f}' for t in took)})"
                    )
                    print(f"{dag_id} trickle: {row['trickle']}", flush=True)
                quiesce(api, rt, dag_id)
                if args.backlog:
                    rate = backlog(api, rt, home, dag_id, args.backlog)
                    row["backlog"] = f"{rate:,.0f} records/s"
                    row["rate"] = str(rate)
                    print(f"{dag_id} backlog: {row['backlog']}", flush=True)
                    quiesce(api, rt, dag_id)
            print("\nDAG | idle | trickle produce -> commit | backlog")
            for dag_id, row in rows.items():
                print(
                    f"{dag_id} | {row.get('idle', '-')} | {row.get('trickle', '-')} | "
                    f"{row.get('backlog', '-')}"
                )
            if args.backlog:
                ratio = float(rows[ON_DATA]["rate"]) / float(rows[CONTINUOUS]["rate"])
                print(f"backlog: on-data / @continuous = {ratio:.2f} (goal >= 0.9)")
    finally:
        launcher.down(home)
        launcher.drop_metadata_db(home)
        connect_server.stop(home, connect_port)
        os.environ.clear()
        os.environ.update(saved)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
