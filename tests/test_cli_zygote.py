"""The ``tf`` fixture's zygote (``tests/cli_zygote.py``) answers as the console script started
afresh does: the same output, exit code, environment, stdin, kills and timeouts."""

from __future__ import annotations

import json
import socket
import subprocess
import threading

from tests.conftest import CONSOLE_SCRIPT as EXE
from tests.conftest import ROOT


def fresh(argv: list[str], env: dict[str, str], input: str | None = None):
    return subprocess.run(
        [EXE, *argv], input=input, text=True, capture_output=True, env=env, cwd=ROOT, timeout=120
    )


def both(cli_zygote, cli_env, *argv: str, input: str | None = None, **env: str):
    full = {**cli_env, **env}
    assert cli_zygote.can_run(full)
    forked = cli_zygote.run([EXE, *argv], full, ROOT, input=input, timeout=120)
    return forked, fresh(list(argv), full, input=input)


def same(forked, started) -> None:
    assert (forked.returncode, forked.stdout, forked.stderr) == (
        started.returncode,
        started.stdout,
        started.stderr,
    )


def test_help_errors_and_a_bad_redis_url_read_the_same(cli_zygote, cli_env):
    same(*both(cli_zygote, cli_env, "--help"))
    same(*both(cli_zygote, cli_env, "run", "nope"))
    same(*both(cli_zygote, cli_env, "query", "wordcount", '["a", 1]'))
    forked, started = both(
        cli_zygote, cli_env, "status", "wordcount", TRIDENTFLOW_REDIS_URL="redis://127.0.0.1:1/0"
    )
    same(forked, started)  # the request's environment, not the zygote's, is the command's
    assert forked.returncode != 0 and "cannot reach Redis" in forked.stderr


def test_stdin_and_the_state_it_leaves_read_the_same(cli_zygote, cli_env):
    lines = "how are you\nnice to meet you\n"
    forked, started = both(cli_zygote, cli_env, "produce", "wordcount", "-", input=lines)
    assert forked.returncode == started.returncode == 0, forked.stderr + started.stderr
    forked, started = both(cli_zygote, cli_env, "status", "wordcount", "--json")
    same(forked, started)
    assert json.loads(forked.stdout)


def test_a_fault_kill_ends_the_command_not_the_zygote(cli_zygote, cli_env, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("how are you\nnice to meet you\nwhat a good day\n" * 10)
    forked = cli_zygote.run([EXE, "produce", "wordcount", str(src)], cli_env, ROOT, timeout=60)
    assert forked.returncode == 0, forked.stderr
    run = [EXE, "run", "wordcount", "--engine", "local", "--batch-size", "2"]
    killed = cli_zygote.run([*run, "--faults", "mid-commit@2=kill"], cli_env, ROOT, timeout=60)
    assert killed.returncode == -9 and "injected fault" in killed.stderr
    resumed = cli_zygote.run(run, cli_env, ROOT, timeout=60)
    assert resumed.returncode == 0, resumed.stderr
    audit = cli_zygote.run([EXE, "audit", "wordcount"], cli_env, ROOT, timeout=60)
    assert audit.stdout.strip() == "lost=0 doubled=0"


def test_a_timeout_kills_the_command_and_runs_from_threads_go_side_by_side(cli_zygote, cli_env):
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts connections, never answers: a Redis that hangs
    hanging = {**cli_env, "TRIDENTFLOW_REDIS_URL": f"redis://127.0.0.1:{silent.getsockname()[1]}"}
    timed_out: list[BaseException] = []

    def hang() -> None:
        try:
            cli_zygote.run([EXE, "status", "wordcount"], hanging, ROOT, timeout=4)
        except subprocess.TimeoutExpired as exc:
            timed_out.append(exc)

    waiting = threading.Thread(target=hang)
    waiting.start()
    meanwhile = cli_zygote.run([EXE, "--help"], cli_env, ROOT, timeout=60)
    assert waiting.is_alive()  # the other run answered while this one hung
    assert meanwhile.returncode == 0 and "usage: tridentflow" in meanwhile.stdout
    waiting.join()
    silent.close()
    assert len(timed_out) == 1  # the hanging command was killed at its timeout


def test_interpreter_variables_send_a_run_to_a_fresh_process(cli_zygote, cli_env):
    assert cli_zygote.can_run(cli_env)
    assert not cli_zygote.can_run({**cli_env, "PYTHONPATH": "/somewhere/else"})
    assert not cli_zygote.can_run({**cli_env, "LC_ALL": "C"})
    assert not cli_zygote.can_run({**cli_env, "LANG": "x"})
