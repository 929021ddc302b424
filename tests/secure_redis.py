"""Secured redis-servers for tests: a password and ACL users, TLS with certificates made by
``openssl`` here (a CA, a server certificate for 127.0.0.1 and localhost, and a second CA that
signed nothing)."""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import redis

from tridentflow.devtools import devredis
from tridentflow.ops import acl

ADMIN_PASSWORD = "adm1n-S3cret-pw"


@dataclass
class SecureRedis:
    port: int
    proc: subprocess.Popen
    tls: Path | None = None
    """Directory of ca.crt (the CA that signed the server), other-ca.crt (one that did not)."""

    @property
    def scheme(self) -> str:
        return "rediss" if self.tls else "redis"

    def url(self, user: str = "default", password: str = ADMIN_PASSWORD, db: int = 0) -> str:
        ca = f"?ssl_ca_certs={self.tls / 'ca.crt'}" if self.tls else ""
        return f"{self.scheme}://{user}:{password}@127.0.0.1:{self.port}/{db}{ca}"

    def admin(self, db: int = 0) -> redis.Redis:
        return redis.Redis.from_url(self.url(db=db))

    def add_user(self, user: str, password: str, pipeline: str, namespace: str = "") -> None:
        """An ACL user holding exactly tridentflow.ops.acl.rules(pipeline)."""
        rules = acl.rules(pipeline, namespace).split()
        self.admin().execute_command("ACL", "SETUSER", user, "reset", "on", f">{password}", *rules)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def make_certs(directory: Path) -> Path:
    """A CA, a server key and certificate it signed (SAN 127.0.0.1, localhost), and an
    unrelated CA."""
    directory.mkdir(parents=True, exist_ok=True)

    def ssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    for ca in ("ca", "other-ca"):
        ssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
            f"/CN=tridentflow test {ca}", "-keyout", f"{ca}.key", "-out", f"{ca}.crt")  # fmt: skip
    (directory / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    ssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
        "-keyout", "server.key", "-out", "server.csr")  # fmt: skip
    ssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "2", "-extfile", "san.ext", "-out", "server.crt")  # fmt: skip
    return directory


def start(directory: Path, tls: bool = False) -> SecureRedis:
    """A redis-server requiring ADMIN_PASSWORD for the default user; with ``tls`` it listens
    on a TLS port only (no plain-text port to fall back to)."""
    directory.mkdir(parents=True, exist_ok=True)
    port = devredis.free_port()
    args = [
        devredis.redis_server_binary(),
        "--bind", "127.0.0.1", "--dir", str(directory), "--save", "", "--appendonly", "no",
        "--requirepass", ADMIN_PASSWORD, "--logfile", str(directory / "redis.log"),
    ]  # fmt: skip
    certs = None
    if tls:
        certs = make_certs(directory / "tls")
        args += [
            "--port", "0", "--tls-port", str(port),
            "--tls-cert-file", str(certs / "server.crt"),
            "--tls-key-file", str(certs / "server.key"),
            "--tls-ca-cert-file", str(certs / "ca.crt"), "--tls-auth-clients", "no",
        ]  # fmt: skip
    else:
        args += ["--port", str(port)]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    server = SecureRedis(port, proc, certs)
    deadline = time.monotonic() + 15
    while True:
        try:
            server.admin().ping()
            return server
        except redis.ConnectionError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise
            time.sleep(0.05)
