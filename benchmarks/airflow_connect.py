"""Benchmark: the Airflow path, with either emitter (issue 10 goal 5, issue 22 goals 2-3).

    python -m benchmarks.airflow_connect [--emitter connect|submit] [--records 100000]
                                         [--runs 4] [--idle-runs 3]
                                         [--continuous-sentences 2000000]
                                         [--local-emit-max-records N]

Starts a private Redis and the Airflow stack (api-server, scheduler, dag-processor,
triggerer; LocalExecutor). ``--emitter connect`` (the default) also starts a local Spark
Connect server (local[2]) - `tridentflow-airflow up --spark-connect` - so every emit runs as a
Connect client inside its task; ``--emitter submit`` keeps the default `spark_default`
connection, so every emit is a SparkSubmitOperator's spark-submit.

1. **Trigger -> commit.** ``--runs`` times: append ``--records`` records (Zipf sentences of 8
   words, the vs_spark data) to the word count, trigger ``tridentflow_wordcount`` through the
   REST API and wait for its commit. Reported per run: trigger -> commit (the ledger's commit
   mark, Redis's clock, minus the trigger request's time), and where the seconds go:
   scheduling before and between the tasks, each task's own time, and inside them the step
   times the ledger records (coordinate, emit = the Spark job and staging, commit = Redis).
   The first run is a warm-up of the task processes' imports and is shown, not counted.
   Also trigger -> run success (the run's end in Airflow).
3. **No work, no Spark.** ``--idle-runs`` runs with no new record (an empty batch), then the
   last run's ``emit`` cleared (its txid already committed): each emit task's seconds.
``--local-emit-max-records N`` sets TRIDENTFLOW_LOCAL_EMIT_MAX_RECORDS for the stack (a
batch of at most N records is emitted in its task without Spark; default 10,000, 0: always
Spark): ``--records 5 --emitter submit`` with it unset and with 0 is a newcomer's small txid on
the bundled spark-submit DAG, with and without the local emit (issue 66 item 14).
2. **@continuous vs the CLI.** ``--continuous-sentences`` sentences for
   ``tridentflow_wordcount_continuous`` (wordcount-opaque, at most 100,000 records per
   partition and txid, the DAG's batch_size):
   unpaused until the source is drained; records/s from its first coordinate to its last
   commit. The same data, in another home and Redis database, through ``tridentflow run
   wordcount-opaque --remote`` (same batch size): records/s. Goal: the DAG at >= 0.8x the CLI
   (issue 22).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from benchmarks.vs_spark import generate
from tridentflow.devtools import devredis
from tridentflow.registry import load_pipeline
from tridentflow.steps.runs import LOCAL_EMIT_ENV, local_emit_limit
from tridentflow.steps.runtime import Runtime
from tridentflow_airflow import launcher
from tridentflow_airflow.rest import AirflowApi

DAG = "tridentflow_wordcount"
CONTINUOUS = "tridentflow_wordcount_continuous"
CONTINUOUS_BATCH_SIZE = 100_000
"""Records per partition per txid of the continuous DAG (its batch_size param; dags/)."""
OTHER_DAGS = (
    "tridentflow_partitioned_count",
    "tridentflow_user_scores",
    "tridentflow_wordcount_drpc",
)


def _ts(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def one_run(api: AirflowApi, rt: Runtime, home: Path, records: int, seed: int) -> dict:
    generate(home, records, "wordcount", seed=seed)  # a record is one sentence of 8 words
    rt.source_heads()
    triggered = time.time()
    partitions = rt.pipeline.source.partitions  # the whole append in this one txid
    run_id = api.trigger(DAG, {"batch_size": -(-records // partitions)})
    state = api.wait_run(run_id, timeout=600, poll=0.2, dag_id=DAG)
    assert state == "success", f"run {run_id} ended {state}"
    entry = rt.ledger.history(limit=1)[0]
    steps = entry["steps"]
    tasks = {t: api.task(run_id, t, dag_id=DAG) for t in ("coordinate", "emit", "commit")}
    start = {t: _ts(i["start_date"]) for t, i in tasks.items()}
    end = {t: _ts(i["end_date"]) for t, i in tasks.items()}
    committed = steps["commit"]["ended_ms"] / 1000
    run_end = _ts(api.run(run_id, DAG)["end_date"])
    return {
        "run_id": run_id,
        "records": entry.get("records"),
        "trigger_to_commit": committed - triggered,
        "trigger_to_success": run_end - triggered,
        "sched_first": start["coordinate"] - triggered,
        "sched_emit": start["emit"] - end["coordinate"],
        "sched_commit": start["commit"] - end["emit"],
        "task": {t: end[t] - start[t] for t in tasks},
        "step": {
            t: (steps[t]["ended_ms"] - steps[t]["started_ms"]) / 1000
            for t in ("coordinate", "emit", "commit")
        },
    }


def emit_seconds(api: AirflowApi, run_id: str) -> float:
    task = api.task(run_id, "emit", dag_id=DAG)
    return _ts(task["end_date"]) - _ts(task["start_date"])


def idle(api: AirflowApi, last_run: str, runs: int) -> list[tuple[str, float]]:
    """Emit task seconds of ``runs`` runs with nothing new to read, and of a cleared emit of
    ``last_run`` (committed already)."""
    out = []
    for _ in range(runs):
        time.sleep(1)  # two triggers within one API request's time collided (HTTP 500) once
        run_id = api.trigger(DAG)
        assert api.wait_run(run_id, timeout=600, poll=0.2, dag_id=DAG) == "success"
        out.append(("empty batch", emit_seconds(api, run_id)))
    api.call(
        "POST",
        f"/dags/{DAG}/clearTaskInstances",
        {"dag_run_id": last_run, "task_ids": ["emit"], "only_failed": False, "dry_run": False,
         "include_downstream": False},
    )  # fmt: skip
    assert api.wait_run(last_run, timeout=600, poll=0.2, dag_id=DAG) == "success"
    out.append(("committed txid, emit cleared", emit_seconds(api, last_run)))
    return out


def continuous(api: AirflowApi, rt: Runtime, home: Path, sentences: int) -> tuple[float, int]:
    generate(home, sentences, "wordcount-opaque", seed=99)
    rt.source_heads()
    started = time.time()
    api.pause(CONTINUOUS, paused=False)
    heads = rt.log.heads()
    while sum(rt.ledger.committed_offsets().values()) < sum(heads.values()):
        if time.time() - started > 1800:
            raise TimeoutError("the continuous DAG did not drain the source in 30 min")
        time.sleep(0.5)
    api.pause(CONTINUOUS)
    history = sorted(rt.ledger.history(limit=1000), key=lambda e: e["txid"])
    first = history[0]["steps"]["coordinate"]["started_ms"] / 1000
    last = history[-1]["steps"]["commit"]["ended_ms"] / 1000
    print(
        "@continuous, per txid (seconds): records, coordinate start -> commit end, emit step, "
        "gap from the previous commit"
    )
    previous_end = None
    for entry in history:
        steps = entry["steps"]
        start, end = steps["coordinate"]["started_ms"], steps["commit"]["ended_ms"]
        emit_step = (steps["emit"]["ended_ms"] - steps["emit"]["started_ms"]) / 1000
        gap = "" if previous_end is None else f"{(start - previous_end) / 1000:5.2f}"
        run_s = (end - start) / 1000
        print(
            f"  txid {entry['txid']:>3} {entry.get('records', 0):>9,} {run_s:6.2f} "
            f"{emit_step:6.2f} {gap}"
        )
        previous_end = end
    return sentences / (last - first), len(history)


def _cpu_seconds_by_group(groups: set[int]) -> dict[int, int]:
    """CPU seconds (user + system, whole seconds as ps shows them) of every process in each
    of ``groups`` (the components' process groups: their task processes included)."""
    out = dict.fromkeys(groups, 0)
    ps = subprocess.run(["ps", "-eo", "pgid=,times="], capture_output=True, text=True).stdout
    for line in ps.splitlines():
        pgid, seconds = (int(x) for x in line.split())
        if pgid in out:
            out[pgid] += seconds
    return out


def idle_cpu(pids: dict[str, int], seconds: float) -> None:
    """Each component's CPU while no run is active (the scheduler's idle loop, mostly)."""
    time.sleep(10)  # past start-up
    before = _cpu_seconds_by_group(set(pids.values()))
    time.sleep(seconds)
    after = _cpu_seconds_by_group(set(pids.values()))
    used = {name: after[pid] - before[pid] for name, pid in pids.items()}
    total = sum(used.values())
    print(
        f"idle CPU over {seconds:.0f} s: {total} CPU s ({100 * total / seconds:.0f}% of a core); "
        + ", ".join(f"{name} {cpu} s" for name, cpu in used.items())
    )


def _identity(batches):  # pragma: no cover - runs in the Connect server's Python workers
    import tridentflow.engines.tasks  # noqa: F401 - what an emit's read tasks import first

    yield from batches


def warm_session(remote: str, rt: Runtime) -> None:
    """Start the Python workers of the pipeline's shared Connect session (what its first emit
    would otherwise pay), so that the DAG and the CLI are both measured warm."""
    from tridentflow.engines.spark import spark_session
    from tridentflow.steps.runs import session_key

    spark = spark_session("tridentflow-bench-warm", remote=remote, share=session_key(rt))
    frame = spark.range(0, 16, 1, 8)
    frame.mapInArrow(_identity, frame.schema).count()


def cli(home: Path, redis_url: str, remote: str | None, sentences: int, batch_size: int) -> float:
    generate(home, sentences, "wordcount-opaque", seed=99)
    argv = [
        str(Path(sys.executable).with_name("tridentflow")), "run", "wordcount-opaque",
        *(["--remote", remote] if remote else []), "--batch-size", str(batch_size),
        "--no-progress", "--home", str(home), "--redis-url", redis_url,
    ]  # fmt: skip
    started = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True)
    return sentences / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=100_000, help="sentences per txid")
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--continuous-sentences", type=int, default=2_000_000, help="0: skip")
    parser.add_argument("--emitter", choices=("connect", "submit"), default="connect")
    parser.add_argument("--idle-runs", type=int, default=3, help="runs with nothing to read")
    parser.add_argument(
        "--idle-cpu", type=float, default=0, metavar="SECONDS",
        help="first measure the stack's CPU while nothing runs, over SECONDS (0: skip)",
    )  # fmt: skip
    parser.add_argument(
        "--scheduler-idle-sleep", type=float, default=launcher.DEFAULT_IDLE_SLEEP_S,
        help="the scheduler's idle sleep (tridentflow-airflow up --scheduler-idle-sleep)",
    )  # fmt: skip
    parser.add_argument(
        "--local-emit-max-records", type=int, default=None, metavar="N",
        help="TRIDENTFLOW_LOCAL_EMIT_MAX_RECORDS for the stack (unset: its default, 10,000)",
    )  # fmt: skip
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tf-bench-airflow-"))
    home = work / "home"
    connect_port, api_port = devredis.free_port(), devredis.free_port()
    saved = dict(os.environ)
    try:
        with devredis.emptied_databases(work / "redis", 1, 2) as (redis_url, cli_url):
            os.environ.pop("TRIDENTFLOW_FAULTS", None)
            os.environ.pop(LOCAL_EMIT_ENV, None)
            if args.local_emit_max_records is not None:
                os.environ[LOCAL_EMIT_ENV] = str(args.local_emit_max_records)
            connect = connect_port if args.emitter == "connect" else None
            info = launcher.up(home, api_port, redis_url, spark_connect=connect,
                               idle_sleep=args.scheduler_idle_sleep)  # fmt: skip
            print(
                f"emitter: {'Spark Connect' if connect else 'spark-submit'}; scheduler idle "
                f"sleep {args.scheduler_idle_sleep} s; batches emitted without Spark up to "
                f"{local_emit_limit()} records"
            )
            api = AirflowApi(info["url"], launcher.admin_password(home), DAG)
            for dag_id in (DAG, CONTINUOUS):
                api.wait_for_dag(dag_id)
            api.pause(*OTHER_DAGS)
            if args.idle_cpu > 0:
                idle_cpu(info["pids"], args.idle_cpu)
            rt = Runtime.open(load_pipeline("wordcount"), redis_url, home)
            runs = [one_run(api, rt, home, args.records, seed=10 + i) for i in range(args.runs)]
            if runs:
                report(runs)
            if runs and args.idle_runs:
                for what, seconds in idle(api, runs[-1]["run_id"], args.idle_runs):
                    print(f"emit task, {what}: {seconds:.2f} s (goal <= 3 s, no Spark job)")

            if args.continuous_sentences <= 0:
                return
            opaque = Runtime.open(load_pipeline("wordcount-opaque"), redis_url, home)
            if connect:  # the CLI below attaches to the same, then warm, server-side session
                warm_session(f"sc://127.0.0.1:{connect_port}", opaque)
            dag_rate, txids = continuous(api, opaque, home, args.continuous_sentences)
            batch_size = CONTINUOUS_BATCH_SIZE
            remote = f"sc://127.0.0.1:{connect_port}" if connect else None
            cli_rate = cli(work / "cli-home", cli_url, remote, args.continuous_sentences,
                           batch_size)  # fmt: skip
            print(
                f"\n@continuous: {dag_rate:,.0f} records/s over {txids} txids; CLI --remote: "
                f"{cli_rate:,.0f} records/s (batch size {batch_size}/partition); "
                f"ratio {dag_rate / cli_rate:.2f}x (goal >= 0.8x)"
            )
    except Exception:
        log = launcher.airflow_home(home) / "logs" / "api-server.log"
        if log.exists():  # what the api-server said about a failed request
            print("".join(log.read_text(errors="replace").splitlines(True)[-40:]))
        raise
    finally:
        launcher.down(home)
        launcher.drop_metadata_db(home)
        from tridentflow.devtools import connect_server

        if args.emitter == "connect":
            connect_server.stop(home, connect_port)
        os.environ.clear()
        os.environ.update(saved)
        shutil.rmtree(work, ignore_errors=True)


def report(runs: list[dict]) -> None:
    print(f"trigger -> commit, {runs[0]['records']:,} records per txid (seconds)")
    head = "run  total  sched:first emit commit  tasks: coord emit commit  steps: coord emit commit"
    print(head)
    for i, r in enumerate(runs):
        t, s = r["task"], r["step"]
        print(
            f"{i + 1:>3}{' (warm-up)' if i == 0 else '':10} {r['trigger_to_commit']:6.2f}  "
            f"{r['sched_first']:5.2f} {r['sched_emit']:5.2f} {r['sched_commit']:5.2f}  "
            f"{t['coordinate']:5.2f} {t['emit']:5.2f} {t['commit']:5.2f}  "
            f"{s['coordinate']:5.2f} {s['emit']:5.2f} {s['commit']:5.2f}"
        )
    counted = [r["trigger_to_commit"] for r in runs[1:]] or [runs[0]["trigger_to_commit"]]
    success = [r["trigger_to_success"] for r in runs[1:]] or [runs[0]["trigger_to_success"]]
    print(
        f"trigger -> commit: median {statistics.median(counted):.2f} s, "
        f"best {min(counted):.2f} s; trigger -> run success: median "
        f"{statistics.median(success):.2f} s, all {[round(x, 2) for x in success]}; "
        f"{json.dumps(runs[-1])}"
    )


if __name__ == "__main__":
    main()
