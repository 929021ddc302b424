"""A real Redis Cluster for tests: masters (and, with ``replicas``, that many replicas each)
started with ``--cluster-enabled yes`` on free ports below 55535 (each node's bus port is
+10000), joined by ``redis-cli --cluster create``; helpers to find a slot's master and replica,
kill a node, and wait for the failover that promotes its replica."""

from __future__ import annotations

import os
import random
import signal
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
    replicas: int = 0
    ports: list[int] = field(default_factory=list)
    procs: list[subprocess.Popen] = field(default_factory=list)

    def url(self, node: int = 0) -> str:
        return f"redis://127.0.0.1:{self.ports[node]}/0"

    def start(self) -> LocalCluster:
        self.ports = cluster_ports(self.masters * (1 + self.replicas))
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
            [
                "redis-cli",
                "--cluster",
                "create",
                *nodes,
                "--cluster-yes",
                "--cluster-replicas",
                str(self.replicas),
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        self.wait_ok(self.ports)
        if self.replicas:  # every replica linked and in sync with its master
            deadline = time.monotonic() + 30
            while not all(
                redis.Redis(port=p).info("replication").get("master_link_status") == "up"
                for p in self.ports
                if redis.Redis(port=p).info("replication")["role"] == "slave"
            ):
                if time.monotonic() > deadline:
                    raise TimeoutError("replicas did not link to their masters")
                time.sleep(0.2)
        return self

    def wait_ok(self, ports: list[int], timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while True:
            infos = [redis.Redis(port=p).cluster("info") for p in ports]
            if all(i.get("cluster_state") == "ok" for i in infos):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"the cluster did not reach cluster_state:ok: {infos}")
            time.sleep(0.2)

    def master_of(self, key: str) -> int:
        """The port of the master serving ``key``'s slot now."""
        alive = [p for p, proc in zip(self.ports, self.procs, strict=True) if proc.poll() is None]
        slot = redis.Redis(port=alive[0]).cluster("keyslot", key)
        for start, end, master, *_replicas in redis.Redis(port=alive[0]).cluster("slots"):
            if start <= slot <= end:
                return int(master[1])
        raise LookupError(f"no node serves slot {slot}")

    def replicas_of(self, master_port: int) -> list[int]:
        info = redis.Redis(port=master_port).info("replication")
        return [int(v["port"]) for k, v in info.items() if k.startswith("slave")]

    def process(self, port: int) -> subprocess.Popen:
        return self.procs[self.ports.index(port)]

    def kill(self, port: int) -> None:
        """SIGKILL a node (no shutdown, no last writes)."""
        proc = self.process(port)
        proc.kill()
        proc.wait(timeout=10)

    def wait_promoted(self, key: str, old_master: int, timeout: float = 30) -> int:
        """Wait until ``key``'s slot is served by a master other than ``old_master`` and every
        live node says cluster_state:ok; that master's port."""
        deadline = time.monotonic() + timeout
        alive = [p for p in self.ports if self.process(p).poll() is None]
        while True:
            try:
                port = self.master_of(key)
                if port != old_master:
                    self.wait_ok(alive, max(1.0, deadline - time.monotonic()))
                    return port
            except (redis.RedisError, LookupError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"no replica took over {key}'s slot from {old_master}")
            time.sleep(0.2)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)  # a node a test stopped
                proc.terminate()
        for proc in self.procs:
            proc.wait(timeout=10)
