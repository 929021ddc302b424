"""Benchmark: how long a shell's ``tridentflow`` command takes, by how it finds Redis (issue 66
items 7 and 14: at most 1 s).

    python -m benchmarks.cli_latency [--repeat 5] [--command "status wordcount"]

A throwaway Airflow home (SQLite metadata DB, migrated once) whose ``redis_default``
connection, added with ``airflow connections add``, names a private Redis. The same command,
wall time of the whole process, three ways:

* **TRIDENTFLOW_REDIS_URL** - the URL given: the CLI imports no Airflow;
* **asks Airflow** - no URL, nothing remembered: Airflow starts to answer (the first command
  in a shell, or after the connection changed);
* **remembered** - no URL, the answer remembered and the connection's row unchanged (every
  later command).

Median and best of ``--repeat``. What a user would pick instead is the first line: exporting
the URL in every shell of the deployment.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tridentflow.devtools import devredis
from tridentflow_airflow import launcher
from tridentflow_airflow.deployment import CACHE_FILE

CLI = str(Path(sys.executable).with_name("tridentflow"))


def timed(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    took = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {proc.stderr[-2000:]}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--command", default="status wordcount")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tf-cli-latency-"))
    with devredis.url_or_private(work / "redis") as redis_url:
        env = launcher.airflow_env(
            work, redis_url, port=devredis.free_port(),
            metadata=f"sqlite:///{launcher.airflow_home(work) / 'airflow.db'}",
        )  # fmt: skip
        launcher.migrate(env)
        shell = {
            k: v
            for k, v in env.items()
            if k not in ("TRIDENTFLOW_REDIS_URL", "AIRFLOW_CONN_REDIS_DEFAULT")
        }
        subprocess.run(
            ["airflow", "connections", "add", "redis_default", "--conn-uri", redis_url],
            env=shell, check=True, capture_output=True, timeout=300,
        )  # fmt: skip
        argv = [CLI, *args.command.split()]
        cache = Path(shell["AIRFLOW_HOME"]) / CACHE_FILE
        given = {**shell, "TRIDENTFLOW_REDIS_URL": redis_url}
        rows: dict[str, list[float]] = {"TRIDENTFLOW_REDIS_URL": [], "asks Airflow": []}
        rows["remembered"] = []
        for _ in range(args.repeat):
            rows["TRIDENTFLOW_REDIS_URL"].append(timed(argv, given))
            cache.unlink(missing_ok=True)
            rows["asks Airflow"].append(timed(argv, shell))
            rows["remembered"].append(timed(argv, shell))
        print(f"{os.cpu_count()} cores; `tridentflow {args.command}`, {args.repeat} runs each")
        for name, times in rows.items():
            print(
                f"{name:24s} median {statistics.median(times):5.2f} s, best {min(times):5.2f} s"
                f"  (all {', '.join(f'{t:.2f}' for t in times)})"
            )
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
