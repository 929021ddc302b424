"""Run Airflow for real on this machine: api-server, dag-processor, triggerer and scheduler on
127.0.0.1, LocalExecutor, SimpleAuthManager with a seeded admin login; the Spark and Redis
connections are stored in the metadata DB (Admin -> Connections) as well.

The metadata DB is PostgreSQL whenever one is there: ``--metadata-db URL`` (or
AIRFLOW__DATABASE__SQL_ALCHEMY_CONN), else a database of this home's own on the PostgreSQL at
127.0.0.1:5432 when it answers (created if missing), else SQLite - whose single writer makes
Airflow answer 500 to a trigger while a component writes. ``up`` says which, and why.

    tridentflow-airflow up [--port 8080] [--spark-connect [PORT]] [--metadata-db URL]
                                             start (idempotent); returns once every component
                                             reports healthy and the DAGs are listed, then
                                             prints the URL and login; with --spark-connect,
                                             emits run on a warm local Spark Connect server
                                             instead of spark-submit
    tridentflow-airflow down                 stop every component (process groups)
    tridentflow-airflow restart COMPONENT    stop one component (scheduler, triggerer, ...) and
                                             start it again with the environment `up` gave it
    tridentflow-airflow status               each component's process and health, the DAGs
                                             listed, the Spark Connect server (exit 1 unless
                                             all is ready)
    tridentflow-airflow env                  print the environment as shell exports
    tridentflow-airflow dags-test DAG_ID     `airflow dags test` with the same environment

State lives in TRIDENTFLOW_HOME/airflow. Redis: TRIDENTFLOW_REDIS_URL, else a local
redis-server on port 6390 (started if needed).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from tridentflow.devtools import devredis
from tridentflow.errors import TridentflowError
from tridentflow.redisconn import CA_PARAM
from tridentflow.steps.runtime import REDIS_URL_ENV, resolve_home

PROJECT_ROOT = Path(__file__).resolve().parents[2]
COMPONENTS = ("api-server", "dag-processor", "triggerer", "scheduler")
"""Started in this order, the rest only once the api-server answers (a task the scheduler
starts earlier dies on a ReadTimeout from the execution API); stopped in reverse, the
scheduler and its running tasks first."""
ADMIN_USER = "admin"
DEV_REDIS_PORT = 6390


def airflow_home(home: Path) -> Path:
    return home / "airflow"


def _secret(path: Path) -> str:
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_urlsafe(32))
        path.chmod(0o600)
    return path.read_text().strip()


def admin_password(home: Path) -> str:
    """The seeded admin password (stable per home)."""
    ahome = airflow_home(home)
    passwords = ahome / "simple_auth_manager_passwords.json"
    if not passwords.exists():
        ahome.mkdir(parents=True, exist_ok=True)
        passwords.write_text(json.dumps({ADMIN_USER: secrets.token_urlsafe(12)}))
        passwords.chmod(0o600)
    return json.loads(passwords.read_text())[ADMIN_USER]


DEFAULT_IDLE_SLEEP_S = 0.1
"""The scheduler's sleep when a loop found nothing to do (Airflow's default: 1 s). Lower
starts runs and tasks sooner and costs idle CPU; measured in docs/benchmarks.md."""


def airflow_env(
    home: Path,
    redis_url: str,
    port: int = 8080,
    base: dict[str, str] | None = None,
    idle_sleep: float = DEFAULT_IDLE_SLEEP_S,
    metadata: str | None = None,
) -> dict[str, str]:
    """The environment every Airflow component (and `airflow dags test`) runs with."""
    ahome = airflow_home(home)
    ahome.mkdir(parents=True, exist_ok=True)
    admin_password(home)
    db, _why = metadata_db(home, metadata)
    # the api-server's async engine: psycopg 3 is async too (Airflow would ask for asyncpg)
    db_async = (
        db
        if db.startswith("postgresql+psycopg")
        else db.replace("sqlite:///", "sqlite+aiosqlite:///", 1)
    )
    venv_bin = str(Path(sys.executable).parent)
    env = dict(os.environ if base is None else base)
    env.update(
        {
            "PATH": f"{venv_bin}{os.pathsep}{env.get('PATH', '')}",
            "AIRFLOW_HOME": str(ahome),
            "TRIDENTFLOW_HOME": str(home),
            REDIS_URL_ENV: redis_url,
            "SPARK_LOCAL_IP": env.get("SPARK_LOCAL_IP", "127.0.0.1"),
            "PYSPARK_PYTHON": env.get("PYSPARK_PYTHON", sys.executable),
            "PYSPARK_DRIVER_PYTHON": env.get("PYSPARK_DRIVER_PYTHON", sys.executable),
            # a base environment may name its own dags folder and executor (a test's Celery)
            "AIRFLOW__CORE__DAGS_FOLDER": env.get(
                "AIRFLOW__CORE__DAGS_FOLDER", str(PROJECT_ROOT / "dags")
            ),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(PROJECT_ROOT / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": env.get("AIRFLOW__CORE__EXECUTOR", "LocalExecutor"),
            "AIRFLOW__CORE__PARALLELISM": "4",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": db,
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC": db_async,
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{ADMIN_USER}:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(
                ahome / "simple_auth_manager_passwords.json"
            ),
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(port),
            "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API__SECRET_KEY": _secret(ahome / "api_secret_key"),
            "AIRFLOW__API_AUTH__JWT_SECRET": _secret(ahome / "jwt_secret"),
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "10",
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "30",  # Airflow's default
            "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": str(idle_sleep),
            # task processes fork from a server that imported what tasks need (preload.py)
            "AIRFLOW__SCHEDULER__MP_START_METHOD": "forkserver",
            "AIRFLOW__SCHEDULER__MP_FORKSERVER_PRELOAD": "tridentflow_airflow.preload",
            "AIRFLOW_CONN_SPARK_DEFAULT": env.get(
                "AIRFLOW_CONN_SPARK_DEFAULT", '{"conn_type":"spark","host":"local[*]"}'
            ),
            "AIRFLOW_CONN_REDIS_DEFAULT": json.dumps(redis_connection(redis_url)),
        }
    )
    return env


def resolve_redis(home: Path) -> str:
    return os.environ.get(REDIS_URL_ENV) or devredis.ensure_daemon(DEV_REDIS_PORT, home / "redis")


LOCAL_POSTGRES = "postgresql+psycopg://postgres@127.0.0.1:5432"
"""Where ``up`` looks for a PostgreSQL of this machine's (trust auth, user postgres)."""


def _db_file(home: Path) -> Path:
    return airflow_home(home) / "metadata-db.json"


def metadata_db(home: Path, explicit: str | None = None) -> tuple[str, str]:
    """(the metadata DB's SQLAlchemy URL, which one it is and why - one line). Chosen once per
    home and kept (a later ``up`` reuses it): ``explicit``, else
    a database of this home's on the local PostgreSQL when it answers, else SQLite (the
    command line passes AIRFLOW__DATABASE__SQL_ALCHEMY_CONN as ``explicit``)."""
    if explicit:
        kind = "PostgreSQL" if explicit.startswith("postgresql") else "the given database"
        return explicit, f"{kind} given ({_shown(explicit)})"
    with contextlib.suppress(FileNotFoundError, ValueError, KeyError):
        kept = json.loads(_db_file(home).read_text())
        return kept["url"], kept["why"]
    url, why = _local_postgres(home)
    if url is None:
        url = f"sqlite:///{airflow_home(home) / 'airflow.db'}"
        why = (
            f"SQLite ({why}): one writer at a time - a trigger may be refused (HTTP 500) while "
            "a component writes; give --metadata-db postgresql+psycopg://... to avoid it"
        )
    airflow_home(home).mkdir(parents=True, exist_ok=True)
    _db_file(home).write_text(json.dumps({"url": url, "why": why}))
    return url, why


def _local_postgres(home: Path) -> tuple[str | None, str]:
    """(a database of ``home``'s own on the local PostgreSQL, created if missing, and why);
    (None, why not) when none can be had."""
    import hashlib

    try:
        import psycopg
    except ImportError:
        return None, "psycopg is not installed: pip install 'tridentflow[postgres]'"
    name = "tridentflow_airflow_" + hashlib.sha256(str(home).encode()).hexdigest()[:12]
    server = LOCAL_POSTGRES.replace("+psycopg", "")
    try:
        with psycopg.connect(f"{server}/postgres", connect_timeout=3, autocommit=True) as conn:
            found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
            if found is None:
                conn.execute(f'CREATE DATABASE "{name}"')
    except psycopg.Error as exc:
        return None, f"no PostgreSQL at {server}: {str(exc).strip().splitlines()[0]}"
    return f"{LOCAL_POSTGRES}/{name}", f"PostgreSQL at {server}, database {name}"


def drop_metadata_db(home: Path) -> None:
    """Drop the database ``up`` created for ``home`` on the local PostgreSQL (tests, a home
    thrown away); a given or SQLite one is left. Best effort."""
    with contextlib.suppress(FileNotFoundError, ValueError, KeyError):
        url = json.loads(_db_file(home).read_text())["url"]
        if url.startswith(LOCAL_POSTGRES + "/tridentflow_airflow_"):
            import psycopg

            name = url.rsplit("/", 1)[1]
            server = LOCAL_POSTGRES.replace("+psycopg", "")
            with (
                contextlib.suppress(psycopg.Error),
                psycopg.connect(f"{server}/postgres", connect_timeout=3, autocommit=True) as conn,
            ):
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        _db_file(home).unlink(missing_ok=True)


def _shown(url: str) -> str:
    """``url`` without its password."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.password:
        return url.replace(f":{parts.password}@", ":***@", 1)
    return url


def migrate(env: dict[str, str]) -> None:
    """Create or upgrade the metadata DB (quick when up to date)."""
    subprocess.run(
        ["airflow", "db", "migrate"],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _pids_file(home: Path) -> Path:
    return airflow_home(home) / "pids.json"


def _alive(pid: int, group: bool = False) -> bool:
    """Whether process ``pid`` (or, with ``group``, any process of group ``pid``) lives."""
    try:
        (os.killpg if group else os.kill)(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _reaped_or_alive(pid: int) -> bool:
    """Whether any process of group ``pid`` lives, after reaping its leader if it is our own
    exited child (``up`` and ``down`` in one process: tests, benchmarks). An unreaped leader
    is a zombie that keeps its group "alive", and ``down`` would wait out its whole grace."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    return _alive(pid, group=True)


def _started_at(pid: int) -> float | None:
    """When process ``pid`` started (seconds since the epoch), None if there is none. Derived
    from the wall clock: a clock step (NTP, a VM resumed from a snapshot) moves it - for people
    and for hosts without ``/proc`` only; ``_since_boot`` is what identifies a process."""
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


def _boot_id() -> str | None:
    """This boot of this machine (Linux), None where the kernel does not say."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def _since_boot(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (``/proc/PID/stat`` field 22):
    fixed for the process's life whatever the wall clock does. None without ``/proc``."""
    try:  # after the command name, which may hold spaces and ")": field 3 on
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


class Recorded(NamedTuple):
    """A component as ``pids.json`` holds it: its pid and the marks of its start."""

    pid: int
    started: float | None  # seconds since the epoch (older files hold only this, or nothing)
    boot: str | None = None  # the boot it started in
    ticks: int | None = None  # its start, in clock ticks since that boot


def _recorded(home: Path) -> dict[str, Recorded]:
    """What ``pids.json`` says ``up`` started. Files of older versions hold the start time
    only, or pids only."""
    try:
        raw = json.loads(_pids_file(home).read_text())
    except (FileNotFoundError, ValueError):
        return {}
    found: dict[str, Recorded] = {}
    for name, entry in raw.items() if isinstance(raw, dict) else ():
        if isinstance(entry, dict) and isinstance(entry.get("pid"), int):
            ticks = entry.get("ticks")
            found[name] = Recorded(
                entry["pid"],
                entry.get("started"),
                entry.get("boot"),
                ticks if isinstance(ticks, int) else None,
            )
        elif isinstance(entry, int):
            found[name] = Recorded(entry, None)
    return found


def _record(home: Path, pids: dict[str, int]) -> None:
    """``pids.json``: each component's pid and its start - in clock ticks since this boot
    (what proves, later, that a pid is still that component and not a stranger that reused
    it) and in wall-clock time (for people, and hosts without ``/proc``)."""
    boot = _boot_id()
    entries = {
        name: {"pid": pid, "started": _started_at(pid), "boot": boot, "ticks": _since_boot(pid)}
        for name, pid in pids.items()
    }
    _pids_file(home).write_text(json.dumps(entries))


START_SLACK_S = 1.0
"""Hosts without ``/proc`` only: how far a process's start time may differ from the recorded
one and still be the same process (psutil derives it from clock ticks since boot)."""


def _is_component(recorded: Recorded, name: str) -> bool:
    """Whether ``recorded.pid`` is still the component ``up`` started as ``name``: alive and
    started in the same boot at the same clock tick - a reboot or a pid's reuse makes it a
    stranger, a step of the wall clock (NTP, a VM resumed) does not. Without ticks (no
    ``/proc``, an older ``pids.json``), its start time within START_SLACK_S; without either, its
    command line must run ``airflow NAME``."""
    now_ticks = _since_boot(recorded.pid)
    if recorded.ticks is not None and recorded.boot is not None and now_ticks is not None:
        return recorded.ticks == now_ticks and recorded.boot == _boot_id()
    now = _started_at(recorded.pid)
    if now is None:
        return False
    if recorded.started is not None:
        return abs(now - recorded.started) <= START_SLACK_S
    import psutil

    try:
        cmdline = " ".join(psutil.Process(recorded.pid).cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False
    return "airflow" in cmdline and name in cmdline


def _started_after(pid: int, create_time: float | None, leader: Recorded) -> bool:
    """Whether process ``pid`` started no earlier than the component ``leader`` (by clock
    ticks since boot where both have them; by wall-clock start time, with slack, else)."""
    ticks = _since_boot(pid)
    if leader.ticks is not None and leader.boot == _boot_id() and ticks is not None:
        return ticks >= leader.ticks
    if leader.started is None:
        return False
    return (create_time or 0) + START_SLACK_S >= leader.started


def _orphans(leader: Recorded) -> list[int]:
    """The processes left in component group ``leader.pid`` after its leader exited: they
    started after the component did and run Airflow (a reused group id holds none of them)."""
    import psutil

    if leader.started is None and leader.ticks is None:
        return []
    found = []
    for proc in psutil.process_iter(["pid", "create_time", "cmdline"]):
        try:
            if os.getpgid(proc.info["pid"]) != leader.pid:
                continue
        except (ProcessLookupError, PermissionError):
            continue
        line = " ".join(proc.info.get("cmdline") or [])
        if "airflow" in line and _started_after(proc.info["pid"], proc.info["create_time"], leader):
            found.append(proc.info["pid"])
    return found


def running(home: Path) -> dict[str, int]:
    """The components ``up`` started that still run (a recorded pid a stranger reuses now -
    after a reboot, say - is not one of them)."""
    return {
        name: entry.pid for name, entry in _recorded(home).items() if _is_component(entry, name)
    }


def api_healthy(port: int, timeout: float = 5) -> bool:
    return monitor_health(port, timeout) is not None


def monitor_health(port: int, timeout: float = 5) -> dict[str, Any] | None:
    """Airflow's own health report (metadatabase, scheduler, triggerer, dag_processor), or
    None if the api-server does not answer."""
    try:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{port}/api/v2/monitor/health", timeout=timeout
        ) as resp:
            return json.loads(resp.read()) if resp.status == 200 else None
    except (urllib.error.URLError, OSError, ValueError):
        return None


HEALTH_PARTS = ("metadatabase", "scheduler", "triggerer", "dag_processor")


def unhealthy(report: dict[str, Any] | None) -> list[str]:
    """The parts of a health report that are not healthy (everything, without a report)."""
    if report is None:
        return ["api-server"]
    return [p for p in HEALTH_PARTS if (report.get(p) or {}).get("status") != "healthy"]


def dag_count(port: int, home: Path, timeout: float = 10) -> int:
    """How many tridentflow DAGs the api-server lists (0 if it cannot tell yet)."""
    try:
        token_req = urllib.request.Request(
            f"http://127.0.0.1:{port}/auth/token",
            data=json.dumps({"username": ADMIN_USER, "password": admin_password(home)}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(token_req, timeout=timeout) as resp:
            token = json.loads(resp.read())["access_token"]
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/api/v2/dags?tags=tridentflow&limit=100",
            headers={"Authorization": f"Bearer {token}"},
        )
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return int(json.loads(resp.read())["total_entries"])
    except (urllib.error.URLError, OSError, ValueError, KeyError):
        return 0


def expected_dags(dags: Path | None = None) -> int:
    """The DAG files in the dags folder (each defines one tridentflow DAG)."""
    folder = dags or PROJECT_ROOT / "dags"
    return len([p for p in folder.glob("*.py") if not p.name.startswith("_")])


def wait_ready(home: Path, port: int, pids: dict[str, int], timeout: float) -> None:
    """Until every component reports healthy and every DAG is listed; TridentflowError naming
    what is not, with the logs, when a component exits or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    folder = None
    with contextlib.suppress(TridentflowError):  # the dags folder `up` gave the components
        folder = component_env(home).get("AIRFLOW__CORE__DAGS_FOLDER")
    want = expected_dags(Path(folder) if folder else None)
    while True:
        sick = unhealthy(monitor_health(port))
        listed = dag_count(port, home) if not sick else 0
        if not sick and listed >= want:
            return
        dead = [n for n, pid in pids.items() if not _alive(pid)]
        if dead or time.monotonic() > deadline:
            down(home)
            why = (
                f"{', '.join(dead)} exited"
                if dead
                else f"within {timeout:.0f}s: not healthy: {', '.join(sick) or 'none'}; "
                f"DAGs listed: {listed} of {want}"
            )
            logs = airflow_home(home) / "logs"
            raise TridentflowError(f"Airflow did not become ready ({why}); see {logs}")
        time.sleep(1)


def up(
    home: Path,
    port: int = 8080,
    redis_url: str | None = None,
    timeout: float = 180,
    spark_connect: int | None = None,
    idle_sleep: float = DEFAULT_IDLE_SLEEP_S,
    metadata: str | None = None,
) -> dict:
    """Start the components (each in its own process group); wait for the API. Idempotent.
    ``spark_connect``: also start a local Spark Connect server on that port and make
    ``spark_default`` a ``spark_connect`` connection to it (emits then run as its clients).
    ``idle_sleep``: the scheduler's idle sleep in seconds (latency against idle CPU)."""
    if not 0 < idle_sleep <= 60:
        raise TridentflowError(
            f"the scheduler's idle sleep must be > 0 and <= 60 seconds, got {idle_sleep}"
        )
    base = dict(os.environ)
    if spark_connect is not None:
        from tridentflow.devtools import connect_server

        connect_server.start(home, spark_connect)
        airflow_home(home).mkdir(parents=True, exist_ok=True)  # a new home has none yet
        (airflow_home(home) / "spark-connect.port").write_text(str(spark_connect))
        base["AIRFLOW_CONN_SPARK_DEFAULT"] = json.dumps(spark_connect_connection(spark_connect))
    env = airflow_env(home, redis_url or resolve_redis(home), port, base, idle_sleep, metadata)
    alive = running(home)
    if len(alive) == len(COMPONENTS):
        wait_ready(home, port, alive, timeout)
        return {"url": f"http://127.0.0.1:{port}", "pids": alive, "started": False}
    down(home)
    migrate(env)
    store_connections(home, env)
    _env_file(home).write_text(json.dumps(env))
    _env_file(home).chmod(0o600)  # the connections' passwords are in it
    pids: dict[str, int] = {}

    def start(name: str) -> None:
        pids[name] = _start_component(home, name, env)
        _record(home, pids)

    start(COMPONENTS[0])
    deadline = time.monotonic() + timeout
    while not api_healthy(port):
        dead = [n for n, pid in pids.items() if not _alive(pid)]
        if dead or time.monotonic() > deadline:
            down(home)
            why = f"{', '.join(dead)} exited" if dead else f"no answer within {timeout:.0f}s"
            logs = airflow_home(home) / "logs"
            raise TridentflowError(f"Airflow did not start ({why}); see {logs}")
        time.sleep(1)
    for name in COMPONENTS[1:]:
        start(name)
    wait_ready(home, port, pids, max(30.0, deadline - time.monotonic() + 120))
    return {"url": f"http://127.0.0.1:{port}", "pids": pids, "started": True}


def _env_file(home: Path) -> Path:
    return airflow_home(home) / "component-env.json"


def component_env(home: Path) -> dict[str, str]:
    """The environment ``up`` gave the stack's components: what an ``airflow`` command needs
    to act on this stack (``airflow backfill create ...``)."""
    try:
        return dict(json.loads(_env_file(home).read_text()))
    except (FileNotFoundError, ValueError):
        raise TridentflowError(
            f"no environment recorded by `up` in {airflow_home(home)}: run `down`, then `up`"
        ) from None


def _start_component(home: Path, name: str, env: dict[str, str]) -> int:
    """Start ``airflow NAME`` in its own process group, logging to logs/NAME.log; its pid."""
    logs = airflow_home(home) / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / f"{name}.log", "ab") as out:
        proc = subprocess.Popen(
            ["airflow", name],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    return proc.pid


def _stop_group(pid: int, grace: float) -> None:
    """SIGTERM to process group ``pid``, SIGKILL after ``grace`` seconds (or ORPHAN_GRACE_S
    after its leader exited); reaped. ``grace`` 0: SIGKILL at once (a crash)."""
    if grace > 0:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while _reaped_or_alive(pid) and time.monotonic() < deadline:
            if not _alive(pid):  # the component is down; what is left of its group are orphans
                deadline = min(deadline, time.monotonic() + ORPHAN_GRACE_S)
            time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while _reaped_or_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)


def restart(home: Path, name: str, grace: float = 20) -> int:
    """Stop one running component (``grace`` 0: SIGKILL, a crash) and start it again with the
    environment ``up`` gave it; its new pid. The others keep running."""
    if name not in COMPONENTS:
        raise TridentflowError(f"no component {name!r}: one of {', '.join(COMPONENTS)}")
    pids = running(home)
    if name not in pids:
        raise TridentflowError(f"{name} is not running in {airflow_home(home)}: run `up` first")
    env = component_env(home)
    _stop_group(pids[name], grace)
    pids[name] = _start_component(home, name, env)
    _record(home, pids)
    return pids[name]


def status(home: Path, port: int) -> dict[str, Any]:
    """Each component's process and health, the DAGs listed, and the Spark Connect server
    ``up --spark-connect`` started (its URL and whether it answers)."""
    alive = running(home)
    report = monitor_health(port)
    parts = {"api-server": "api-server", "scheduler": "scheduler", "triggerer": "triggerer",
             "dag-processor": "dag_processor"}  # fmt: skip
    components = {}
    for name, key in parts.items():
        health = "healthy" if report is not None and name == "api-server" else None
        if report is not None and name != "api-server":
            health = (report.get(key) or {}).get("status") or "unknown"
        components[name] = {"pid": alive.get(name), "running": name in alive, "health": health}
    connect = None
    port_file = airflow_home(home) / "spark-connect.port"
    if port_file.exists():
        from tridentflow.devtools import connect_server

        cport = int(port_file.read_text())
        connect = {"url": connect_server.url(cport), "answering": connect_server.answering(cport)}
    listed = dag_count(port, home) if report is not None else 0
    ready = (
        all(c["running"] for c in components.values())
        and not unhealthy(report)
        and listed >= expected_dags()
        and (connect is None or connect["answering"])
    )
    return {
        "url": f"http://127.0.0.1:{port}",
        "ready": ready,
        "components": components,
        "metadatabase": (report or {}).get("metadatabase", {}).get("status"),
        "dags_listed": listed,
        "dags_expected": expected_dags(),
        "spark_connect": connect,
    }


def redis_connection(redis_url: str) -> dict[str, Any]:
    """A Redis URL as Airflow connection JSON (login = ACL user; TLS and its CA in extra);
    TridentflowRedisHook.get_url turns it back into the same URL."""
    from urllib.parse import parse_qsl, unquote, urlsplit

    url = urlsplit(redis_url)
    conn: dict[str, Any] = {
        "conn_type": "redis",
        "host": url.hostname or "127.0.0.1",
        "port": url.port or 6379,
        "extra": {"db": int(url.path.strip("/") or 0)},
    }
    if url.password:
        conn.update(login=unquote(url.username or ""), password=unquote(url.password))
    if url.scheme == "rediss":
        conn["extra"]["ssl"] = True
    ca = dict(parse_qsl(url.query)).get(CA_PARAM)
    if ca:
        conn["extra"][CA_PARAM] = ca
    return conn


def connections(env: dict[str, str]) -> dict[str, dict[str, Any]]:
    """The Spark and Redis connections of ``env`` as Airflow connection JSON."""
    spark = json.loads(env["AIRFLOW_CONN_SPARK_DEFAULT"])
    return {"spark_default": spark, "redis_default": json.loads(env["AIRFLOW_CONN_REDIS_DEFAULT"])}


def store_connections(home: Path, env: dict[str, str]) -> None:
    """Put the stack's connections in the metadata DB too, so Admin -> Connections lists them
    (the AIRFLOW_CONN_* variables, which Airflow reads first, hold the same values)."""
    path = airflow_home(home) / "connections.json"
    path.write_text(json.dumps(connections(env)))
    path.chmod(0o600)
    try:
        subprocess.run(
            ["airflow", "connections", "import", "--overwrite", str(path)],
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
    finally:
        path.unlink(missing_ok=True)


def spark_connect_connection(port: int, host: str = "127.0.0.1") -> dict[str, Any]:
    """``spark_default`` as a ``spark_connect`` connection (the provider's SparkConnectHook)
    to a Connect server at host:port: emits run as its clients, no spark-submit."""
    return {"conn_type": "spark_connect", "host": f"sc://{host}", "port": port}


ORPHAN_GRACE_S = 2.0
"""Once a component's own process has exited, how long ``down`` waits for what is left of its
process group before SIGKILL: orphans such as an idle LocalExecutor worker that missed the
SIGTERM, or multiprocessing's resource tracker (which ignores SIGTERM and waits for them)."""


def down(home: Path, grace: float = 20) -> list[str]:
    """Stop every component in reverse start order (the scheduler and the tasks it runs
    first, the api-server they report to last): SIGTERM to its process group, SIGKILL after
    ``grace`` seconds, or ``ORPHAN_GRACE_S`` after the component itself has exited. Only
    what ``up`` started is signalled: a recorded pid whose process is not that component any
    more (a reboot, a pid reused) is left alone, and of a group whose leader exited only the
    Airflow processes started after it (its orphans)."""
    recorded = _recorded(home)
    if not recorded and not _pids_file(home).exists():
        return []
    order = [n for n in reversed(COMPONENTS) if n in recorded]
    order += [n for n in recorded if n not in COMPONENTS]
    stopped = []
    for name in order:
        entry = recorded[name]
        if _is_component(entry, name):
            _stop_group(entry.pid, grace)
            stopped.append(name)
            continue
        for orphan in _orphans(entry):
            with contextlib.suppress(ProcessLookupError):
                os.kill(orphan, signal.SIGKILL)
    order = stopped
    _pids_file(home).unlink(missing_ok=True)
    _env_file(home).unlink(missing_ok=True)
    connect_port = airflow_home(home) / "spark-connect.port"
    if connect_port.exists():  # the Spark Connect server `up --spark-connect` started
        from tridentflow.devtools import connect_server

        if connect_server.stop(home, int(connect_port.read_text())):
            order.append("spark-connect")
        connect_port.unlink()
    return order


def dags_test(home: Path, dag_id: str, extra_env: dict[str, str] | None = None) -> int:
    env = airflow_env(home, resolve_redis(home))
    env.update(extra_env or {})
    migrate(env)
    return subprocess.run(["airflow", "dags", "test", dag_id], env=env).returncode


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="tridentflow-airflow",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "command", choices=("up", "down", "restart", "status", "env", "password", "dags-test")
    )
    parser.add_argument("dag_id", nargs="?", help="dags-test: the DAG; restart: the component")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--home", help="TRIDENTFLOW_HOME (Airflow state goes in HOME/airflow)")
    parser.add_argument(
        "--spark-connect",
        type=int,
        nargs="?",
        const=15002,
        metavar="PORT",
        help="up: start a local Spark Connect server (default port 15002) and emit through it",
    )
    parser.add_argument(
        "--metadata-db",
        metavar="URL",
        help="up: Airflow's metadata DB (a SQLAlchemy URL); default: a database of this home's "
        "on the PostgreSQL at 127.0.0.1:5432 if it answers, else SQLite",
    )
    parser.add_argument(
        "--scheduler-idle-sleep",
        type=float,
        default=DEFAULT_IDLE_SLEEP_S,
        metavar="SECONDS",
        help=f"up: the scheduler's sleep when idle (default {DEFAULT_IDLE_SLEEP_S}; Airflow's is "
        "1): lower starts runs sooner and costs idle CPU (docs/benchmarks.md)",
    )
    args = parser.parse_args(argv)
    home = resolve_home(args.home)
    metadata = args.metadata_db or os.environ.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN")
    try:
        if args.command == "up":
            info = up(
                home, args.port, spark_connect=args.spark_connect,
                idle_sleep=args.scheduler_idle_sleep, metadata=metadata,
            )  # fmt: skip
            print(f"Airflow UI: {info['url']}  (login: {ADMIN_USER} / {admin_password(home)})")
            print(f"metadata DB: {metadata_db(home, metadata)[1]}")
            print(f"components: {info['pids']}  logs: {airflow_home(home) / 'logs'}")
            print("stop with: tridentflow-airflow down")
        elif args.command == "restart":
            if not args.dag_id:
                parser.error(f"restart needs a component: one of {', '.join(COMPONENTS)}")
            print(f"{args.dag_id} restarted: pid {restart(home, args.dag_id)}")
        elif args.command == "down":
            stopped = down(home)
            print(f"stopped: {', '.join(stopped) or 'nothing was running'}")
        elif args.command == "status":
            info = status(home, args.port)
            print(json.dumps(info, indent=1))
            return 0 if info["ready"] else 1
        elif args.command == "password":  # the admin login, e.g. for a REST token
            print(admin_password(home))
        elif args.command == "env":
            found = airflow_env(home, resolve_redis(home), args.port, {}, metadata=metadata)
            for key, value in sorted(found.items()):
                if key.startswith(("AIRFLOW", "TRIDENTFLOW", "SPARK", "PYSPARK")):
                    print(f"export {key}='{value}'")
        else:
            if not args.dag_id:
                parser.error("dags-test needs a DAG_ID")
            return dags_test(home, args.dag_id)
    except (TridentflowError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", None)
        tail = f": {detail.decode(errors='replace').strip().splitlines()[-1]}" if detail else ""
        sys.stderr.write(f"tridentflow-airflow: error: {exc}{tail}\n")
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
