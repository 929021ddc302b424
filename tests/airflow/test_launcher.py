"""The launcher's process handling, with real processes (no Airflow needed)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tridentflow_airflow import launcher

pytestmark = [pytest.mark.airflow]


def test_down_in_the_process_that_started_the_components_does_not_wait_out_the_grace(tmp_path):
    """Components started by this process (as tests and benchmarks do) are its children: once
    they exit on SIGTERM they must be reaped, or their zombie leaders keep each process group
    "alive" and ``down`` waits the whole grace for every one (it did: 4 x 20 s)."""
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True
        )
        for name in ("api-server", "scheduler")
    }
    launcher.airflow_home(tmp_path).mkdir(parents=True)
    launcher._record(tmp_path, {n: p.pid for n, p in procs.items()})
    started = time.monotonic()
    stopped = launcher.down(tmp_path, grace=20)
    took = time.monotonic() - started
    assert set(stopped) == set(procs)
    assert all(p.poll() is not None for p in procs.values())  # reaped: no zombie left
    assert took < 5, f"down took {took:.1f}s"


ORPHANING_LEADER = """
import signal, subprocess, sys, time
# a child of the same process group that ignores SIGTERM (multiprocessing's resource tracker
# does), and outlives this leader, which exits on SIGTERM as a component does
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(flush=True); "
    "time.sleep(600)"], stdout=subprocess.PIPE)
child.stdout.readline()
print(child.pid, flush=True)
time.sleep(600)
"""


def test_down_kills_what_a_stopped_component_left_in_its_group_without_the_grace(tmp_path):
    """The scheduler exits on SIGTERM but an orphan of its group does not (seen: an idle
    LocalExecutor worker and the resource tracker): ``down`` waits ORPHAN_GRACE_S for them,
    not the whole grace (it waited 20 s), and kills them."""
    leader = subprocess.Popen(
        [sys.executable, "-c", ORPHANING_LEADER], start_new_session=True, stdout=subprocess.PIPE
    )
    orphan = int(leader.stdout.readline())
    launcher.airflow_home(tmp_path).mkdir(parents=True)
    launcher._record(tmp_path, {"scheduler": leader.pid})
    started = time.monotonic()
    assert launcher.down(tmp_path, grace=20) == ["scheduler"]
    took = time.monotonic() - started
    assert took < launcher.ORPHAN_GRACE_S + 3, f"down took {took:.1f}s"
    killed_by = time.monotonic() + 2  # SIGKILL is sent, not waited for
    while launcher._alive(orphan) and not _zombie(orphan):
        assert time.monotonic() < killed_by, "the orphan outlived down"
        time.sleep(0.05)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return False


def test_down_never_signals_a_stranger_that_reused_a_recorded_pid(tmp_path):
    """After a reboot or a pid's reuse, ``pids.json`` names processes ``up`` never started:
    ``down`` (and ``up``, which calls it first) must leave them alone - a recorded start time
    that differs, or (an older ``pids.json``, pids only) a command line that is not
    ``airflow NAME``."""
    strangers = [
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                         start_new_session=True)
        for _ in range(2)
    ]  # fmt: skip
    try:
        launcher.airflow_home(tmp_path).mkdir(parents=True)
        reused, old_format = strangers
        entries = {
            "scheduler": {"pid": reused.pid, "started": launcher._started_at(reused.pid) - 3600},
            "triggerer": old_format.pid,
        }
        launcher._pids_file(tmp_path).write_text(json.dumps(entries))
        assert launcher.running(tmp_path) == {}
        assert launcher.down(tmp_path, grace=1) == []
        time.sleep(0.3)
        assert all(p.poll() is None for p in strangers)  # both still alive
        assert not launcher._pids_file(tmp_path).exists()  # the stale record is gone
    finally:
        for p in strangers:
            p.kill()
            p.wait()


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True
    )


@pytest.mark.parametrize("step_s", [120.0, -3600.0])
def test_a_step_of_the_wall_clock_leaves_the_running_components_known(
    tmp_path, monkeypatch, step_s
):
    """The family "the host's wall clock steps under a running stack" (NTP, a VM resumed from
    a snapshot: /proc/stat's btime moves, and with it every process's wall-clock start time).
    CI saw it: every component of two live stacks judged "not running" while answering
    (``status`` not ready, ``restart`` refused). A process is known by its clock ticks since
    boot, which no clock step moves."""
    import psutil._pslinux as pslinux

    proc = _sleeper()
    try:
        launcher.airflow_home(tmp_path).mkdir(parents=True)
        launcher._record(tmp_path, {"scheduler": proc.pid})
        real_boot_time = pslinux.boot_time
        monkeypatch.setattr(pslinux, "boot_time", lambda: real_boot_time() + step_s)
        assert (
            abs(launcher._started_at(proc.pid) - launcher._recorded(tmp_path)["scheduler"].started)
            >= 100
        )
        assert launcher.running(tmp_path) == {"scheduler": proc.pid}
        assert launcher.down(tmp_path, grace=5) == ["scheduler"]
        assert proc.poll() is not None
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("differs", ["ticks", "boot"])
def test_a_recorded_pid_of_another_start_or_another_boot_is_a_stranger(tmp_path, differs):
    """The ticks since boot identify a process only within its boot, and only its own: a pid
    reused (another start tick) or recorded before a reboot (another boot id) is a stranger,
    left alone by ``down``."""
    stranger = _sleeper()
    try:
        launcher.airflow_home(tmp_path).mkdir(parents=True)
        launcher._record(tmp_path, {"scheduler": stranger.pid})
        entries = json.loads(launcher._pids_file(tmp_path).read_text())
        if differs == "ticks":
            entries["scheduler"]["ticks"] -= 100
        else:
            entries["scheduler"]["boot"] = "another-boot"
        launcher._pids_file(tmp_path).write_text(json.dumps(entries))
        assert launcher.running(tmp_path) == {}
        assert launcher.down(tmp_path, grace=1) == []
        time.sleep(0.3)
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()


def test_the_metadata_db_is_the_local_postgresql_when_it_answers_else_sqlite(tmp_path, monkeypatch):
    """`up` on a machine with a PostgreSQL gets a database of its home's own there (SQLite's
    one writer refused a trigger with HTTP 500 in 4 of 5 tries right after `up`); without one
    it says why it falls back to SQLite; a given URL wins. The choice is kept per home."""
    import psycopg

    home = tmp_path / "pg"
    url, why = launcher.metadata_db(home)
    try:
        assert url.startswith("postgresql+psycopg://postgres@127.0.0.1:5432/tridentflow_airflow_")
        assert why.startswith("PostgreSQL at") and launcher.metadata_db(home) == (url, why)
        name = url.rsplit("/", 1)[1]
        with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres") as conn:
            assert conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        env = launcher.airflow_env(home, "redis://127.0.0.1:1/0", base={})
        assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] == url
        assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC"] == url  # psycopg is async too
    finally:
        launcher.drop_metadata_db(home)
    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres") as conn:
        assert not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()

    monkeypatch.setattr(launcher, "LOCAL_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:1")
    url, why = launcher.metadata_db(tmp_path / "nopg")
    assert url.startswith("sqlite:///") and why.startswith("SQLite (no PostgreSQL at"), why
    given = "postgresql+psycopg://u:secret@db.example:5432/airflow"
    url, why = launcher.metadata_db(tmp_path / "given", given)
    assert url == given and "secret" not in why and "***" in why
