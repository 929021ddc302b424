"""A real Spark standalone cluster from the pip package (no Docker): a master and workers
started with ``spark-class``, on free ports, each in its own process group, stopped by pid. For
tests and benchmarks (``tests/test_cluster.py``, ``benchmarks.staging_scale --cluster``)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tridentflow.devtools import devredis

SPARK_CLASS = str(Path(sys.executable).with_name("spark-class"))


@dataclass
class StandaloneCluster:
    workdir: Path
    port: int = field(default_factory=devredis.free_port)
    ui_port: int = field(default_factory=devredis.free_port)
    master: subprocess.Popen | None = None
    workers: list[subprocess.Popen] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _spawn(self, name: str, *args: str, hide: Path | None = None) -> subprocess.Popen:
        """spark-class ARGS in its own process group; with ``hide``, in a private mount
        namespace where an empty tmpfs covers that directory (a host without the share)."""
        log = open(self.workdir / f"{name}.log", "wb")  # noqa: SIM115 (the child keeps it)
        env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_NO_DAEMONIZE": "1"}
        argv = [SPARK_CLASS, *args]
        if hide is not None:
            cover = 'mount -t tmpfs tridentflow-blind "$0" && exec "$@"'
            argv = ["unshare", "--mount", "sh", "-c", cover, str(hide), *argv]
        return subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            cwd=self.workdir,
        )  # fmt: skip

    def start(self, workers: int = 2, cores: int = 1) -> StandaloneCluster:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.master = self._spawn(
            "master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
            "--port", str(self.port), "--webui-port", str(self.ui_port),
        )  # fmt: skip
        for _ in range(workers):
            self.add_worker(cores)
        self.wait_for_workers(workers)
        return self

    def add_worker(self, cores: int = 1, hide: Path | None = None) -> None:
        """Start one more worker (not waited for); ``hide`` as in ``_spawn``."""
        i = len(self.workers)
        work = self.workdir / f"worker-{i}"
        work.mkdir(exist_ok=True)
        args = [
            "org.apache.spark.deploy.worker.Worker", self.url, "--host", "127.0.0.1",
            "--cores", str(cores), "--memory", "1g", "--webui-port", str(devredis.free_port()),
            "--work-dir", str(work),
        ]  # fmt: skip
        self.workers.append(self._spawn(f"worker-{i}", *args, hide=hide))

    def state(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as r:
            return json.load(r)

    def alive_workers(self) -> int:
        return sum(w["state"] == "ALIVE" for w in self.state()["workers"])

    def wait_for_workers(self, n: int, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                alive = [w for w in self.state()["workers"] if w["state"] == "ALIVE"]
                if len(alive) >= n:
                    return
            except (OSError, ValueError):  # not up yet, or its UI answered a half page
                pass
            time.sleep(0.5)
        raise TimeoutError(f"{n} Spark workers did not register within {timeout}s")

    def running_python_tasks(self, worker: int) -> bool:
        """Whether worker ``worker``'s executor is running Python tasks now (its process group
        holds a pyspark daemon or worker)."""
        pgid = self.workers[worker].pid
        for proc in Path("/proc").glob("[0-9]*"):
            try:
                if os.getpgid(int(proc.name)) != pgid:
                    continue
                if b"pyspark" in (proc / "cmdline").read_bytes():
                    return True
            except (OSError, ValueError):
                continue
        return False

    def kill_worker(self, worker: int) -> None:
        """SIGKILL the worker and everything it started (its executor, Python workers)."""
        os.killpg(self.workers[worker].pid, signal.SIGKILL)
        self.workers[worker].wait()

    def stop(self) -> None:
        for proc in [*self.workers, self.master]:
            if proc is not None and proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
