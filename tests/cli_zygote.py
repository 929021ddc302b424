"""The console script, forked from a process that has already imported it.

A run of ``tridentflow`` spends about 0.2 s of its 0.27 s importing (redis-py alone 0.12 s: its
asyncio client and OpenTelemetry's SDK); the tests run the console script some hundreds of
times. This zygote imports ``tridentflow.ops.cli`` once, then forks a child per run that becomes
the command exactly as ``.venv/bin/tridentflow`` would: its own process (a fault's SIGKILL ends
it, not the zygote), the request's argv, environment, working directory and stdin, fd 1 and 2
on the caller's files, ``sys.exit(main())`` and a normal interpreter shutdown (atexit, logging).
The pattern is Mercurial's chg and Rails' spring.

What a fork cannot give - an interpreter started under other ``PYTHON*`` variables (a
``PYTHONPATH`` of a test's own pipelines, ``PYTHONHASHSEED``, ``PYTHONIOENCODING``) - the caller
(``tests/conftest.py``'s ``tf``) runs as a fresh process instead; ``tests/test_cli_zygote.py``
holds the two ways to the same output, exit code and environment.

Protocol on a Unix socket, one connection per run: the caller sends one byte with four file
descriptors (stdin, stdout, stderr, and a file holding the request as JSON: ``argv``, ``env``,
``cwd``); a handler process forked for the connection forks the command, writes its pid as a
line, waits for it and writes its exit code (``-N`` for signal N, as ``subprocess`` does).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
from pathlib import Path

import tridentflow.ops.cli  # noqa: F401  the import every run would otherwise pay

REQUEST_FDS = 4
"""stdin, stdout, stderr, the request."""


def serve(path: str) -> None:
    """Accept runs on ``path`` for ever; each connection is served by a process of its own, so
    runs from several threads of the caller go on side by side."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # handlers are reaped by the kernel
    print("ready", flush=True)
    while True:
        connection, _ = listener.accept()
        if os.fork() == 0:
            listener.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            _handle(connection)  # never returns
        connection.close()


def _handle(connection: socket.socket) -> None:
    """Fork the command, report its pid, wait for it, report its exit code, end."""
    _, fds, _, _ = socket.recv_fds(connection, 1, REQUEST_FDS)
    with os.fdopen(fds[3]) as request_file:
        request = json.load(request_file)
    pid = os.fork()
    if pid == 0:
        connection.close()
        _become_command(request, fds[:3])
    for fd in fds[:3]:
        os.close(fd)
    connection.sendall(f"{pid}\n".encode())
    _, status = os.waitpid(pid, 0)
    connection.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
    os._exit(0)


def _become_command(request: dict, fds: list[int]) -> None:
    """Turn this forked process into ``tridentflow <argv>`` as its console script starts it:
    the same standard streams, environment, working directory, ``sys.argv`` and ``sys.path[0]``
    (the script's folder), then ``sys.exit(main())`` - an exception ends it as it ends the
    script (a traceback on stderr, exit code 1), and the interpreter shuts down as usual."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    script = request["argv"][0]
    sys.argv = [script, *request["argv"][1:]]
    sys.path[0] = str(Path(script).parent)
    from tridentflow.ops.cli import main

    sys.exit(main())


if __name__ == "__main__":
    serve(sys.argv[1])
