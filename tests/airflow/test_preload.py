"""The launcher's task start-up settings: task processes fork from a server that imported what
they need (tridentflow_airflow.preload), and the scheduler's idle sleep is the user's choice."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tridentflow.errors import TridentflowError
from tridentflow_airflow import launcher, preload

pytestmark = [pytest.mark.airflow]


def test_the_scheduler_forks_tasks_from_a_preloaded_server(tmp_path):
    env = launcher.airflow_env(tmp_path, "redis://127.0.0.1:1/0", base={})
    assert env["AIRFLOW__SCHEDULER__MP_START_METHOD"] == "forkserver"
    assert env["AIRFLOW__SCHEDULER__MP_FORKSERVER_PRELOAD"] == preload.__name__
    assert env["AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME"] == str(
        launcher.DEFAULT_IDLE_SLEEP_S
    )
    assert (
        launcher.airflow_env(tmp_path, "redis://127.0.0.1:1/0", base={}, idle_sleep=0.5)[
            "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME"
        ]
        == "0.5"
    )


def test_preloading_imports_every_module_a_task_needs_and_airflows_plugins(tmp_path):
    """In a fresh interpreter with the stack's environment (as the fork server starts): all
    imported, nothing missing, the plugins folder's listeners and macros loaded once."""
    env = launcher.airflow_env(tmp_path, "redis://127.0.0.1:1/0")
    code = (
        "import sys, tridentflow_airflow.preload as p\n"
        "assert p.MISSING == [], p.MISSING\n"
        "assert all(m in sys.modules for m in p.PRELOADED)\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    last = done.stdout.strip().splitlines()[-1:]
    assert done.returncode == 0 and last == ["ok"], (done.stdout + done.stderr)[-2000:]


def test_a_module_that_cannot_be_imported_is_skipped_not_fatal():
    assert preload.preload(("json", "no_such_module_tridentflow")) == ["no_such_module_tridentflow"]


@pytest.mark.parametrize("seconds", [0, -1, 61])
def test_an_idle_sleep_out_of_range_is_one_line(tmp_path, seconds):
    with pytest.raises(TridentflowError, match=r"idle sleep must be > 0 and <= 60 seconds"):
        launcher.up(tmp_path, idle_sleep=seconds)


def test_the_cli_refuses_a_bad_idle_sleep_in_one_line(tmp_path, capsys):
    argv = ["up", "--home", str(tmp_path), "--scheduler-idle-sleep", "0"]
    assert launcher.main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "idle sleep must be > 0" in err, err
