"""A local Spark Connect server for development and single-machine deployments.

``tridentflow spark-connect [--port P] [--master M]`` starts one with pyspark's own
``sbin/spark-daemon.sh`` (SPARK_HOME is the installed pyspark package; its jars hold the
Connect server since 4.0, though 4.0's wheel lacks the ``start-connect-server.sh`` wrapper),
with logs and the pid file under ``HOME/spark-connect``; ``--stop`` stops it. A warm server
spares every emit the ~10 s JVM start of a ``spark-submit``: clients (``tridentflow run
--remote sc://HOST:PORT``, or an Airflow emit task whose Spark connection is of type
``spark_connect``) attach in well under a second. Its Python workers run this interpreter, so
pipelines importable here are importable there.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from tridentflow.engines.spark import quiet_java_options
from tridentflow.errors import TridentflowError

DEFAULT_PORT = 15002
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
"""What ``sbin/start-connect-server.sh`` runs through ``spark-daemon.sh`` (instance 1)."""


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def state_dir(home: Path) -> Path:
    return home / "spark-connect"


def url(port: int, host: str = "127.0.0.1") -> str:
    return f"sc://{host}:{port}"


def answering(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _env(home: Path, port: int) -> dict[str, str]:
    directory = state_dir(home)
    return {
        **os.environ,
        "SPARK_HOME": str(spark_home()),
        "SPARK_LOG_DIR": str(directory / "logs"),
        "SPARK_PID_DIR": str(directory),
        "SPARK_IDENT_STRING": f"tridentflow-{port}",
        "SPARK_CONNECT_MODE": "0",  # spark-submit starts the server, not a Connect client
        "SPARK_LOCAL_IP": os.environ.get("SPARK_LOCAL_IP", "127.0.0.1"),
        "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable),
        # its Python workers import pipelines (module:attribute) as the CLI does: from here
        "PYTHONPATH": os.pathsep.join(
            p for p in (os.getcwd(), os.environ.get("PYTHONPATH", "")) if p
        ),
    }


def start(
    home: Path, port: int = DEFAULT_PORT, master: str = "local[*]", timeout: float = 120
) -> str:
    """Start a Connect server on 127.0.0.1:``port`` unless one answers there; its URL.
    Idempotent."""
    if answering(port):
        return url(port)
    env = _env(home, port)
    Path(env["SPARK_LOG_DIR"]).mkdir(parents=True, exist_ok=True)
    daemon = spark_home() / "sbin" / "spark-daemon.sh"
    argv = [
        str(daemon),
        "submit",
        SERVER_CLASS,
        "1",
        "--name",
        "Spark Connect server",
        "--master",
        master,
        "--conf",
        f"spark.connect.grpc.binding.port={port}",
        "--conf",
        "spark.connect.grpc.binding.address=127.0.0.1",
        "--conf",
        "spark.ui.enabled=false",
        "--conf",
        "spark.sql.shuffle.partitions=4",
        "--driver-java-options",
        quiet_java_options(),
    ]
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise TridentflowError(
            f"the Spark Connect server did not start: {(done.stderr or done.stdout).strip()[-300:]}"
        )
    deadline = time.monotonic() + timeout
    while not answering(port):
        if time.monotonic() > deadline:
            raise TridentflowError(
                f"Spark Connect did not answer on port {port} within {timeout:.0f}s;"
                f" see {env['SPARK_LOG_DIR']}"
            )
        time.sleep(0.5)
    return url(port)


def stop(home: Path, port: int = DEFAULT_PORT, timeout: float = 60) -> bool:
    """Stop the server this home started on ``port``; False if none was running."""
    if not answering(port):
        return False
    daemon = spark_home() / "sbin" / "spark-daemon.sh"
    argv = [str(daemon), "stop", SERVER_CLASS, "1"]
    subprocess.run(argv, env=_env(home, port), capture_output=True, text=True)
    deadline = time.monotonic() + timeout
    while answering(port):
        if time.monotonic() > deadline:
            raise TridentflowError(f"Spark Connect on port {port} did not stop")
        time.sleep(0.5)
    return True
