"""A local Redis Cluster for tests, benchmarks and the chaos harness: masters (and, with
``replicas``, that many replicas each) started with ``--cluster-enabled yes`` on free ports
below 55535 (each node's bus port is +10000), joined by ``redis-cli --cluster create``.

With ``gated=True`` every node is reached through a ``GatedRelay`` (the node announces the
relay's port, so clients and replicas alike connect through it). A relay can *hold* what its
node sends to its replicas: real replication lag - the replica's offset stays behind, WAIT
counts it out - and ``failover`` kills a master while its replica is behind, promotes the
replica, and brings the old master back as a replica of it: the writes the replica never got
are gone, as in a failover with asynchronous replication.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path
from typing import TypeVar

import redis
from redis.crc import key_slot

from tridentflow.devtools import devredis
from tridentflow.errors import TridentflowError

T = TypeVar("T")

MAX_PORT = 45000
"""Node ports stay below this (a node's cluster bus is its port + 10000, at most 65535)."""


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
        port = rng.randrange(20000, MAX_PORT)
        if port not in ports and _free(port) and _free(port + 10000):
            ports.append(port)
    return ports


class _Link:
    """One relayed connection: client <-> node."""

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client, self.upstream = client, upstream
        self.replication = False
        """The client sent SYNC/PSYNC: it is a replica, and what the node sends it may be held."""
        self.held: list[bytes] = []
        self.closed = False

    def close(self) -> None:
        self.closed = True
        for sock in (self.client, self.upstream):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()


class GatedRelay:
    """A TCP relay on ``port`` in front of the node on ``target``. ``hold()`` keeps what the
    node sends on its replication links (buffered, not delivered), ``release()`` delivers it,
    ``sever()`` closes every link without delivering it and stops accepting."""

    def __init__(self, port: int, target: int) -> None:
        self.port, self.target = port, target
        self.lock = threading.Lock()
        self.links: list[_Link] = []
        self.holding = False
        self.listener: socket.socket | None = None

    def start(self) -> GatedRelay:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(128)
        self.listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        return self

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _addr = listener.accept()
            except OSError:
                return  # severed
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target), timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            link = _Link(client, upstream)
            with self.lock:
                self.links.append(link)
            threading.Thread(target=self._pump_up, args=(link,), daemon=True).start()
            threading.Thread(target=self._pump_down, args=(link,), daemon=True).start()

    def _pump_up(self, link: _Link) -> None:
        """Client -> node, noticing a replica's SYNC/PSYNC."""
        try:
            while data := link.client.recv(65536):
                if not link.replication and b"SYNC" in data.upper():
                    link.replication = True
                link.upstream.sendall(data)
        except OSError:
            pass
        link.close()

    def _pump_down(self, link: _Link) -> None:
        """Node -> client, held while the relay holds and the link is a replica's."""
        try:
            while data := link.upstream.recv(65536):
                with self.lock:
                    if link.replication and self.holding:
                        link.held.append(data)
                        continue
                link.client.sendall(data)
        except OSError:
            pass
        with self.lock:
            if link.held and not link.closed:  # a link that ended while held loses it
                link.held.clear()
        link.close()

    def hold(self) -> None:
        with self.lock:
            self.holding = True

    def release(self) -> None:
        with self.lock:
            self.holding = False
            for link in self.links:
                if link.held and not link.closed:
                    with contextlib.suppress(OSError):
                        link.client.sendall(b"".join(link.held))
                link.held.clear()

    def sever(self) -> None:
        """Stop accepting and close every link; what was held is never delivered."""
        with self.lock:
            if self.listener is not None:
                with contextlib.suppress(OSError):
                    self.listener.close()
                self.listener = None
            for link in self.links:
                link.held.clear()
                link.close()
            self.links.clear()


@dataclass
class LocalCluster:
    directory: Path
    masters: int = 3
    replicas: int = 0
    gated: bool = False
    """Every node behind a GatedRelay (see the module doc): replication lag and lossy
    failovers on demand."""
    ports: list[int] = field(default_factory=list)
    """The nodes' own ports (where ``redis-cli`` and the helpers here talk to them)."""
    relay_ports: dict[int, int] = field(default_factory=dict)
    """Node port -> the port it announces (its relay's; the node's own without ``gated``)."""
    relays: dict[int, GatedRelay] = field(default_factory=dict)
    procs: list[subprocess.Popen] = field(default_factory=list)

    def url(self, node: int = 0) -> str:
        return f"redis://127.0.0.1:{self.announced(self.ports[node])}/0"

    def announced(self, port: int) -> int:
        return self.relay_ports.get(port, port)

    def _args(self, port: int) -> list[str]:
        node = self.directory / str(port)
        args = [
            devredis.redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1",
            "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", "2000", "--save", "", "--appendonly", "no",
            "--dir", str(node), "--logfile", str(node / "redis.log"),
            "--repl-diskless-sync-delay", "0",  # a replica's full sync starts at once
        ]  # fmt: skip
        if self.gated:
            args += [
                "--cluster-announce-ip", "127.0.0.1",
                "--cluster-announce-port", str(self.relay_ports[port]),
                "--cluster-announce-bus-port", str(port + 10000),
            ]  # fmt: skip
        return args

    def _spawn(self, port: int) -> subprocess.Popen:
        (self.directory / str(port)).mkdir(parents=True, exist_ok=True)
        return subprocess.Popen(self._args(port), stdout=subprocess.DEVNULL)

    def start(self, attempts: int = 4) -> LocalCluster:
        """Start the nodes and create the cluster. Ports are picked free, but another test
        worker can take one (or its bus port) before the node binds it: the nodes are then
        stopped and started again on fresh ports, up to ``attempts`` times."""
        for attempt in range(attempts):
            try:
                self._start_nodes()
                break
            except (TridentflowError, OSError):
                self.stop()
                self.procs, self.relays, self.relay_ports = [], {}, {}
                if attempt == attempts - 1:
                    raise
        self._create()
        return self

    def _start_nodes(self) -> None:
        """Spawn every node (behind its relay if gated); TridentflowError if one exits or another
        server holds its port, OSError if a relay cannot bind its port."""
        nodes = self.masters * (1 + self.replicas)
        ports = cluster_ports(nodes * (2 if self.gated else 1))
        self.ports = ports[:nodes]
        if self.gated:
            self.relay_ports = dict(zip(self.ports, ports[nodes:], strict=True))
            for port in self.ports:
                self.relays[port] = GatedRelay(self.relay_ports[port], port).start()
        for port in self.ports:
            self.procs.append(self._spawn(port))
        for port, proc in zip(self.ports, self.procs, strict=True):
            devredis.wait_ready(port, proc)
            if devredis.server_pid(port) != proc.pid:
                raise devredis.PortTakenError(f"port {port} is answered by another redis-server")

    def _create(self) -> None:
        subprocess.run(
            [
                "redis-cli",
                "--cluster",
                "create",
                *(f"127.0.0.1:{p}" for p in self.ports),
                "--cluster-yes",
                "--cluster-replicas",
                str(self.replicas),
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        self.wait_ok(self.ports)
        if self.replicas:
            self.wait_linked(self.ports)

    def node(self, port: int) -> redis.Redis:
        """A plain client of one node, on its own port, that never sends a command again
        (``devredis.client``): a node that is down fails the command at once, and the waits
        below poll again, instead of redis-py's default back-off of seconds per call."""
        return devredis.client(port, connect_timeout=2, timeout=10)

    def alive(self) -> list[int]:
        return [p for p, proc in zip(self.ports, self.procs, strict=True) if proc.poll() is None]

    def wait_ok(self, ports: list[int], timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while True:
            infos = self._poll(ports, lambda node: node.cluster("info"))
            if infos is not None and all(i.get("cluster_state") == "ok" for i in infos):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"the cluster did not reach cluster_state:ok: {infos}")
            time.sleep(0.2)

    def wait_linked(self, ports: list[int], timeout: float = 30) -> None:
        """Until every master among ``ports`` has its ``replicas`` online (seen from the
        master: a replica that says its link is up can still be waiting for its full sync)."""
        deadline = time.monotonic() + timeout
        while True:
            infos = self._poll(ports, lambda node: node.info("replication"))
            online = [
                [v for k, v in i.items() if k.startswith("slave") and v["state"] == "online"]
                for i in infos or ()
                if i["role"] == "master"
            ]
            if infos is not None and all(len(replicas) >= self.replicas for replicas in online):
                return
            if time.monotonic() > deadline:
                raise TimeoutError("replicas did not come online with their masters")
            time.sleep(0.05)

    def _poll(self, ports: list[int], ask: Callable[[redis.Redis], T]) -> list[T] | None:
        """Each node's answer, or None while one of them cannot be reached (a wait polls on)."""
        try:
            return [ask(self.node(p)) for p in ports]
        except redis.ConnectionError:
            return None

    def master_of(self, key: str) -> int:
        """The port of the master serving ``key``'s slot now."""
        alive = self.alive()
        slot = self.node(alive[0]).cluster("keyslot", key)
        for start, end, master, *_replicas in self.node(alive[0]).cluster("slots"):
            if start <= slot <= end:
                return self._own_port(int(master[1]))
        raise LookupError(f"no node serves slot {slot}")

    def _own_port(self, announced: int) -> int:
        return next((p for p, r in self.relay_ports.items() if r == announced), announced)

    def replicas_of(self, master_port: int) -> list[int]:
        info = self.node(master_port).info("replication")
        return [self._own_port(int(v["port"])) for k, v in info.items() if k.startswith("slave")]

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
        while True:
            try:
                port = self.master_of(key)
                if port != old_master:
                    self.wait_ok(self.alive(), max(1.0, deadline - time.monotonic()))
                    return port
            except (redis.RedisError, LookupError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"no replica took over {key}'s slot from {old_master}")
            time.sleep(0.2)

    # -- replication lag and lossy failovers (gated clusters) ---------------------------------
    def hold_replication(self, master_port: int) -> None:
        """From now on the master's replicas receive nothing (its writes are not on them)."""
        self.relays[master_port].hold()

    def release_replication(self, master_port: int) -> None:
        self.relays[master_port].release()

    def failover(self, master_port: int, timeout: float = 30) -> int:
        """Kill ``master_port`` without delivering what its relay held, promote its replica
        (CLUSTER FAILOVER TAKEOVER), restart the old master (it rejoins as a replica of the
        new one and resyncs); the new master's port once every replica is in sync again."""
        (replica, *_rest) = self.replicas_of(master_port)
        relay = self.relays.get(master_port)
        if relay is not None:
            relay.sever()
        self.kill(master_port)
        self.node(replica).execute_command("CLUSTER", "FAILOVER", "TAKEOVER")
        deadline = time.monotonic() + timeout
        while self.node(replica).info("replication")["role"] != "master":
            if time.monotonic() > deadline:
                raise TimeoutError(f"replica {replica} did not take over from {master_port}")
            time.sleep(0.05)
        if relay is not None:
            self.relays[master_port] = GatedRelay(relay.port, master_port).start()
        self.procs[self.ports.index(master_port)] = self._spawn(master_port)
        devredis.wait_ready(master_port)
        while self.node(master_port).info("replication")["role"] != "slave":
            if time.monotonic() > deadline:
                raise TimeoutError(f"{master_port} did not rejoin as a replica of {replica}")
            time.sleep(0.1)
        self.wait_ok(self.alive(), max(1.0, deadline - time.monotonic()))
        self.wait_linked(self.alive(), max(1.0, deadline - time.monotonic()))
        self.wait_acknowledging(replica, deadline)
        return replica

    def wait_acknowledging(self, master_port: int, deadline: float) -> None:
        """Until a write on ``master_port`` is acknowledged by a replica (a resynced replica
        can be online for up to a second before it answers the master's GETACK)."""
        start = next(s for s, _e, m, *_r in self.node(master_port).cluster("slots")
                     if self._own_port(int(m[1])) == master_port)  # fmt: skip
        key = next(k for k in (f"tf-probe-{i}" for i in count()) if key_slot(k.encode()) == start)
        node = self.node(master_port)
        while node.incr(key) and node.execute_command("WAIT", 1, 100) < 1:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no replica of {master_port} acknowledges writes")
        node.delete(key)

    def stop(self) -> None:
        for relay in self.relays.values():
            relay.sever()
        for proc in self.procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)  # a node a test stopped
                proc.terminate()
        for proc in self.procs:
            proc.wait(timeout=10)
