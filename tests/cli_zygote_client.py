"""The test side of ``tests/cli_zygote.py``: start a worker's zygote, run the console script
through it with ``subprocess.run``'s answer (``CompletedProcess``, text, ``TimeoutExpired``)."""

from __future__ import annotations

import json
import locale
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

ZYGOTE = Path(__file__).with_name("cli_zygote.py")

STARTUP_ENV = ("LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE")
"""Besides ``PYTHON*``: variables an interpreter reads as it starts (the streams' encoding), so
a run under other values than the zygote's must start afresh."""


def _read_at_startup(name: str) -> bool:
    return name.startswith("PYTHON") or name in STARTUP_ENV


@dataclass
class CliZygote:
    """A zygote process listening on ``path``; ``run`` is safe from several threads."""

    process: subprocess.Popen[bytes]
    path: str
    env: dict[str, str]
    """The environment the zygote started under."""

    @classmethod
    def start(cls) -> CliZygote:
        folder = tempfile.mkdtemp(prefix="tf-zygote-")  # short: a socket path has 107 bytes
        path = os.path.join(folder, "cli.sock")
        env = dict(os.environ)
        process = subprocess.Popen(
            [sys.executable, str(ZYGOTE), path],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            env=env,
        )
        assert process.stdout is not None
        if process.stdout.readline() != b"ready\n":
            process.kill()
            raise RuntimeError(f"the console script's zygote did not start (exit {process.wait()})")
        return cls(process, path, env)

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()
        shutil.rmtree(os.path.dirname(self.path), ignore_errors=True)

    def can_run(self, env: Mapping[str, str]) -> bool:
        """Whether a fork of the zygote starts as a fresh interpreter under ``env`` would."""
        names = {*env, *self.env}
        return all(env.get(n) == self.env.get(n) for n in names if _read_at_startup(n))

    def run(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: Path,
        *,
        input: str | None = None,
        timeout: float | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """``subprocess.run(argv, env=env, cwd=cwd, input=input, timeout=timeout, text=True,
        capture_output=True)``, forked from the zygote; on a timeout the command is killed."""
        encoding = locale.getpreferredencoding(False)
        with (
            tempfile.TemporaryFile() as stdin,
            tempfile.TemporaryFile() as stdout,
            tempfile.TemporaryFile() as stderr,
            tempfile.TemporaryFile("w+") as request,
        ):
            if input is not None:
                stdin.write(input.encode(encoding))
                stdin.seek(0)
            json.dump({"argv": list(argv), "env": dict(env), "cwd": str(cwd)}, request)
            request.flush()
            request.seek(0)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
                connection.connect(self.path)
                files = (stdin, stdout, stderr, request)
                socket.send_fds(connection, [b"r"], [f.fileno() for f in files])
                replies = connection.makefile("rb")
                pid = _number(replies.readline(), argv)
                connection.settimeout(timeout)
                try:
                    returncode = _number(replies.readline(), argv)
                except TimeoutError:
                    os.kill(pid, signal.SIGKILL)
                    raise subprocess.TimeoutExpired(
                        list(argv), timeout or 0, _text(stdout, encoding), _text(stderr, encoding)
                    ) from None
            return subprocess.CompletedProcess(
                list(argv), returncode, _text(stdout, encoding), _text(stderr, encoding)
            )


def _number(line: bytes, argv: Sequence[str]) -> int:
    if not line:
        raise RuntimeError(
            f"the console script's zygote ended the run of {' '.join(argv[1:3])!r} without an "
            "answer: its handler died (see the worker's stderr)"
        )
    return int(line)


def _text(written: IO[bytes], encoding: str) -> str:
    """What ``text=True`` gives: decoded, universal newlines."""
    written.seek(0)
    data = written.read().decode(encoding)
    return data.replace("\r\n", "\n").replace("\r", "\n")
