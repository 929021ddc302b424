"""A real Redis Cluster for tests: masters started with ``--cluster-enabled yes`` on free ports
below 55535 (each node's bus port is +10000), joined by ``redis-cli --cluster create``."""

from __future__ import annotations

import random
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from tridentflow import devredis


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def cluster_ports(n: int) -> list[int]:
    """``n`` ports whose cluster bus ports (+10000) are free too."""
    rng = random.Random()
    ports: list[int] = []
    while len(ports) < n:
        port = rng.randrange(20000, 45000)
        if port not in ports and _free(port) and _free(port + 10000):
            ports.append(port)
    return ports


@dataclass
class LocalCluster:
    directory: Path
    masters: int = 3
    ports: list[int] = field(default_factory=list)
    procs: list[subprocess.Popen] = field(default_factory=list)

    def url(self, node: int = 0) -> str:
        return f"redis://127.0.0.1:{self.ports[node]}/0"

    def start(self) -> LocalCluster:
        self.ports = cluster_ports(self.masters)
        for port in self.ports:
            node = self.directory / str(port)
            node.mkdir(parents=True, exist_ok=True)
            args = [
                devredis.redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1",
                "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", "2000", "--save", "", "--appendonly", "no",
                "--dir", str(node), "--logfile", str(node / "redis.log"),
            ]  # fmt: skip
            self.procs.append(subprocess.Popen(args, stdout=subprocess.DEVNULL))
        for port in self.ports:
            devredis.wait_ready(port)
        nodes = [f"127.0.0.1:{p}" for p in self.ports]
        subprocess.run(
            ["redis-cli", "--cluster", "create", *nodes, "--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=60,
        )
        deadline = time.monotonic() + 30
        while True:
            infos = [redis.Redis(port=p).cluster("info") for p in self.ports]
            if all(i.get("cluster_state") == "ok" for i in infos):
                return self
            if time.monotonic() > deadline:
                raise TimeoutError(f"the cluster did not reach cluster_state:ok: {infos}")
            time.sleep(0.2)

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            proc.wait(timeout=10)
