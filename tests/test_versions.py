"""The supported range, run end to end on vanilla installs (docs/install.md, "Supported
versions"): the oldest and the newest Airflow line, each a clean venv holding
``apache-airflow==X`` and the built wheel with its ``airflow`` extra, a dags folder holding the
five-line DAG file and nothing else, Airflow configured only as that page says, all of it run
by ``airflow standalone``. Driven as a user drives it, through Airflow's REST API: unpause,
trigger, clear a finished run's emit (the same txid replays, nothing counts twice), a second
run, ``tridentflow audit``; the plugin registered by the entry point answers with the figures
the ledger holds. Then the oldest supported pyspark on the CLI path: spark-submit and a Spark
Connect server of that version.

Marked ``matrix``: each line installs a whole Airflow (about a minute) and runs Spark, so the
suite leaves them to their own lane (``scripts/test.sh --matrix``), which CI runs after it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import SEED_SENTENCES
from tests.distribution import CONSTRAINTS, build, clean_env, make_venv, run
from tridentflow.devtools import devredis
from tridentflow_airflow.rest import AirflowApi

pytestmark = [pytest.mark.matrix]

DAG = "tridentflow_wordcount"
DAG_FILE = """from tridentflow_airflow import pipeline_dag

dag = pipeline_dag("wordcount", schedule=None)
"""
MY_DAG = "my_counts"
MY_DAG_FILE = """from tridentflow_airflow import pipeline_dag

dag = pipeline_dag("my_pipeline:build", dag_id="my_counts", schedule=None)
"""
MY_PIPELINE = """from tridentflow import Count, LogSource, Pipeline, SourceMode
from tridentflow import StateKind, StateSpec


def split(sentence):
    for word in sentence.split():
        yield (word,)


def build():
    p = Pipeline("my-counts", LogSource(fields=("sentence",), mode=SourceMode.OPAQUE))
    p.stream.each("sentence", split, "word").group_by("word").persistent_aggregate(
        StateSpec("counts", StateKind.OPAQUE), Count()
    )
    return p
"""
"""A newcomer's own pipeline: its module next to its DAG file in the dags folder, its DAG
under an id of its own - the emit must ship the module to Spark, the view must learn the DAG
from its declaration."""
MORE = ["you say goodbye", "and i say hello", "hello hello"]
AIRFLOW_LINES = [
    pytest.param(
        "3.1.8", "airflow-3.1.txt", id="airflow-3.1-oldest", marks=pytest.mark.xdist_group("af31")
    ),
    pytest.param(
        "3.3.2", "dev.txt", id="airflow-3.3-newest", marks=pytest.mark.xdist_group("af33")
    ),
]
OLDEST_PYSPARK = "4.0.5"


def word_counts(lines: list[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for line in lines:
        for word in line.split():
            counts[word] = counts.get(word, 0) + 1
    return counts


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("dist"))[1]


class Standalone:
    """``airflow standalone`` (scheduler, dag-processor, api-server, triggerer) of a venv,
    in its own process group, its output in a file."""

    def __init__(self, venv: Path, env: dict[str, str], log: Path) -> None:
        self.log = log
        self.proc = subprocess.Popen(
            [venv / "bin" / "airflow", "standalone"],
            env=env,
            cwd=log.parent,
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def wait_healthy(self, base: str, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"airflow standalone exited:\n{self.tail()}"
            try:
                with urllib.request.urlopen(f"{base}/api/v2/monitor/health", timeout=5):
                    return
            except (urllib.error.URLError, OSError):
                time.sleep(1)
        raise AssertionError(f"no api-server at {base} within {timeout}s:\n{self.tail()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)


def get(base: str, path: str, token: str | None) -> tuple[int, bytes]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    req = urllib.request.Request(f"{base}{path}", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def wait_replayed(
    api: AirflowApi, run_id: str, task_id: str, tries: int, dag_id: str | None = None
) -> None:
    """Until ``task_id`` of ``run_id`` reached try ``tries`` and the run finished again."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        ti = api.task(run_id, task_id, dag_id=dag_id)
        finished = ti["state"] in ("success", "failed") and ti["try_number"] >= tries
        if finished and api.run(run_id, dag_id=dag_id)["state"] in ("success", "failed"):
            return
        time.sleep(2)
    raise AssertionError(
        f"{task_id} of {run_id} did not replay: {api.task(run_id, task_id, dag_id=dag_id)}"
    )


@pytest.fixture
def vanilla_redis(tmp_path: Path) -> Iterator[str]:
    port = devredis.free_port()
    proc = devredis.start(port, tmp_path / "redis", appendonly=False)
    yield f"redis://127.0.0.1:{port}/0"
    proc.terminate()
    proc.wait(timeout=10)


@pytest.mark.parametrize(("version", "constraints"), AIRFLOW_LINES)
def test_a_vanilla_airflow_runs_the_word_count(
    version: str, constraints: str, wheel: Path, tmp_path: Path, vanilla_redis: str
):
    venv = make_venv(
        tmp_path / "venv",
        f"apache-airflow=={version}",
        f"{wheel}[airflow,lineage]",
        constraints=CONSTRAINTS / constraints,
    )
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "my_wordcount.py").write_text(DAG_FILE)
    (dags / "my_counts_dag.py").write_text(MY_DAG_FILE)
    (dags / "my_pipeline.py").write_text(MY_PIPELINE)
    events = tmp_path / "openlineage.jsonl"
    port = devredis.free_port()
    base = f"http://127.0.0.1:{port}"
    home = tmp_path / "tridentflow"
    # what docs/install.md tells a user to set, and where Airflow listens: nothing else
    env = clean_env(
        venv,
        AIRFLOW_HOME=str(tmp_path / "airflow"),
        AIRFLOW__CORE__DAGS_FOLDER=str(dags),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__API__HOST="127.0.0.1",
        AIRFLOW__API__PORT=str(port),
        AIRFLOW__API__BASE_URL=base,
        AIRFLOW__CORE__EXECUTION_API_SERVER_URL=f"{base}/execution/",
        AIRFLOW_CONN_REDIS_DEFAULT=vanilla_redis,
        AIRFLOW_CONN_SPARK_DEFAULT=json.dumps({"conn_type": "spark", "host": "local[2]"}),
        TRIDENTFLOW_HOME=str(home),
        SPARK_LOCAL_IP="127.0.0.1",
        AIRFLOW__OPENLINEAGE__TRANSPORT=json.dumps(
            {"type": "file", "log_file_path": str(events), "append": True}
        ),
    )
    cli_env = {**env, "TRIDENTFLOW_REDIS_URL": vanilla_redis}
    installed = run(venv / "bin" / "pip", "list", cwd=tmp_path, env=env).stdout
    assert f"apache-airflow {version}".replace(" ", "") in installed.replace(" ", "")
    assert "pyspark-client" not in installed  # nothing overwrites pyspark's files

    def tf(*args: str, stdin: str | None = None, cwd: Path = tmp_path) -> str:
        proc = subprocess.run(
            [venv / "bin" / "tridentflow", *args],
            input=stdin, env=cli_env, cwd=cwd, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    def counts(words: list[str]) -> dict[str, int]:
        lines = tf("query", "wordcount", *words).splitlines()
        return {word: int(n) for word, n in (line.split("\t") for line in lines)}

    run(venv / "bin" / "airflow", "db", "migrate", cwd=tmp_path, env=env, timeout=600)
    tf("produce", "wordcount", "-", stdin="\n".join(SEED_SENTENCES) + "\n")
    stack = Standalone(venv, env, tmp_path / "standalone.log")
    try:
        stack.wait_healthy(base)
        passwords = tmp_path / "airflow" / "simple_auth_manager_passwords.json.generated"
        deadline = time.monotonic() + 60
        while not passwords.exists() and time.monotonic() < deadline:
            time.sleep(0.5)
        api = AirflowApi(base, json.loads(passwords.read_text())["admin"], DAG, user="admin")
        api.wait_for_dag(timeout=180)
        api.pause(DAG, paused=False)  # a new DAG is paused, as in the UI

        run1 = api.trigger()
        assert api.wait_run(run1, timeout=420) == "success", stack.tail()
        assert api.xcom(run1, "coordinate")["txid"] == 1
        first = word_counts(SEED_SENTENCES)
        assert counts(list(first)) == first

        # clear the finished run's emit and what follows, as from the UI: txid 1 replays
        api.call(
            "POST",
            f"/dags/{DAG}/clearTaskInstances",
            {
                "dry_run": False,
                "dag_run_id": run1,
                "task_ids": ["emit"],
                "include_downstream": True,
                "only_failed": False,
                "reset_dag_runs": True,
            },
        )
        wait_replayed(api, run1, "commit", tries=2)
        assert api.run(run1)["state"] == "success", stack.tail()
        assert api.xcom(run1, "commit")["status"] == "already-committed"
        assert counts(list(first)) == first

        tf("produce", "wordcount", "-", stdin="\n".join(MORE) + "\n")
        run2 = api.trigger()
        assert api.wait_run(run2, timeout=420) == "success", stack.tail()
        assert api.xcom(run2, "coordinate")["txid"] == 2
        every = word_counts(SEED_SENTENCES + MORE)
        assert counts(list(every)) == every
        assert tf("audit", "wordcount").strip() == "lost=0 doubled=0"

        # the plugin, found through the entry point, in Airflow's UI and answering
        plugins = api.call("GET", "/plugins")["plugins"]
        (ours,) = [p for p in plugins if p["name"] == "tridentflow"]
        assert {v["url_route"] for v in ours["external_views"]} >= {"tridentflow"}
        status, body = get(base, "/tridentflow/api/pipelines/wordcount", api.token)
        assert status == 200, body[:300]
        ledger = json.loads(body)
        assert (ledger["committed_txid"], ledger["guarantee"]) == (2, "exactly-once")
        assert get(base, "/tridentflow/api/pipelines/wordcount", None)[0] in (401, 403)
        status, page = get(base, "/tridentflow/ui", api.token)
        assert status == 200 and b"tridentflow" in page
        # and the provider, through the distribution's apache_airflow_provider entry point
        provider = run(venv / "bin" / "airflow", "providers", "get", "tridentflow", "-o",
                       "plain", cwd=tmp_path, env=env)  # fmt: skip
        assert "tridentflow" in provider.stdout and "0.1.0" in provider.stdout, provider.stdout

        newcomers_own_pipeline(api, base, tmp_path, tf, dags, events)
    finally:
        stack.stop()


def newcomers_own_pipeline(api, base, tmp_path, tf, dags: Path, events: Path) -> None:
    """Their pipeline module in the dags folder, their DAG id: the emit (spark-submit) ships
    the module, the run tab and the txid page read in Chromium name the run, its txid and its
    Airflow state (on 3.1 too, whose tab URL carries the run id unencoded), and the
    OpenLineage events carry the txid's offsets, its records and whether a step replayed."""
    from tests.airflow import browser
    from tests.lineage_schema import read_events, task_events

    tf("produce", "my_pipeline:build", "-", stdin="\n".join(SEED_SENTENCES) + "\n", cwd=dags)
    api.wait_for_dag(MY_DAG, timeout=180)
    api.pause(MY_DAG, paused=False)
    run_id = api.trigger(MY_DAG)
    assert api.wait_run(run_id, timeout=420, dag_id=MY_DAG) == "success", api.task(
        run_id, "emit", dag_id=MY_DAG
    )
    committed = api.xcom(run_id, "commit", dag_id=MY_DAG)
    assert (committed["txid"], committed["status"]) == (1, "committed"), committed

    password = json.loads(
        (tmp_path / "airflow" / "simple_auth_manager_passwords.json.generated").read_text()
    )["admin"]
    with browser.logged_in(base, password) as page:
        tab = browser.run_tab(page, base, MY_DAG, run_id, encoded=None)
        assert (tab["txid"], tab["status"]) == ("1", "committed"), tab
        assert tab["records"] == str(len(SEED_SENTENCES)), tab
        page.goto(f"{base}/plugin/tridentflow/tridentflow/txid?pipeline=my-counts&txid=1")
        browser.frame_locator_text(page, "h1", "txid 1 of my-counts")
        runs = browser.frame_text(page, "table:first-of-type")
        assert run_id in runs and "success" in runs and "(unknown)" not in runs, runs
        href = page.frame_locator("iframe").locator("table:first-of-type a").first
        assert f"/dags/{MY_DAG}/runs/" in (href.get_attribute("href") or "")

    # the emit and what follows, cleared: txid 1 replays, and its events say so from START
    clear = {"dry_run": False, "dag_run_id": run_id, "task_ids": ["emit"],
             "include_downstream": True, "only_failed": False, "reset_dag_runs": True}  # fmt: skip
    api.call("POST", f"/dags/{MY_DAG}/clearTaskInstances", clear)
    wait_replayed(api, run_id, "commit", tries=2, dag_id=MY_DAG)
    every = read_events(events)
    emits = task_events(every, MY_DAG, "emit")
    first_complete = next(e for e in emits if e["eventType"] == "COMPLETE")
    (source,) = first_complete["inputs"]
    offsets = source["inputFacets"]["tridentflowOffsets"]
    assert sum(r["end"] - r["start"] for r in offsets["ranges"]) == len(SEED_SENTENCES)
    assert source["inputFacets"]["inputStatistics"]["rowCount"] == len(SEED_SENTENCES)
    commits = task_events(every, MY_DAG, "commit")
    assert "tridentflowOffsets" in commits[0]["inputs"][0]["inputFacets"]  # its START too
    replays = [e for e in emits + commits if e["run"]["facets"]["tridentflow"]["replayed"]]
    assert {e["eventType"] for e in replays} >= {"START", "COMPLETE"}, replays
    replayed_commit = [e for e in replays if e["job"]["name"].endswith(".commit")][-1]
    stats = replayed_commit["inputs"][0]["inputFacets"]["inputStatistics"]
    assert stats["rowCount"] == len(SEED_SENTENCES)  # what the txid committed, not 0


@pytest.mark.spark
@pytest.mark.xdist_group("pyspark-oldest")
def test_the_oldest_pyspark_runs_the_cli_path(wheel: Path, tmp_path: Path, vanilla_redis: str):
    """pyspark 4.0 (the oldest supported): the word count by spark-submit, then seed 002's
    batch operations through a Spark Connect server of that version."""
    venv = make_venv(tmp_path / "venv", wheel, constraints=CONSTRAINTS / "pyspark-4.0.txt")
    env = clean_env(
        venv,
        TRIDENTFLOW_REDIS_URL=vanilla_redis,
        TRIDENTFLOW_HOME=str(tmp_path / "tridentflow"),
        SPARK_LOCAL_IP="127.0.0.1",
    )
    python = venv / "bin" / "python"
    version = run(python, "-c", "import pyspark; print(pyspark.__version__)", cwd=tmp_path)
    assert version.stdout.strip() == OLDEST_PYSPARK

    def tf(*args: str, stdin: str | None = None) -> str:
        proc = subprocess.run(
            [venv / "bin" / "tridentflow", *args],
            input=stdin, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stdout

    tf("produce", "wordcount", "-", stdin="\n".join(SEED_SENTENCES) + "\n")
    assert "committed txids 1..1" in tf("run", "wordcount", "--engine", "spark", "--no-progress")
    assert tf("audit", "wordcount").strip() == "lost=0 doubled=0"
    assert tf("query", "wordcount", "you").splitlines() == ["you\t2"]

    seed = run(python, "-c", SEED_002, cwd=tmp_path).stdout
    tf("produce", "user-scores", "--json", "-", stdin=seed)
    port = devredis.free_port()
    url = tf("spark-connect", "--port", str(port)).strip().splitlines()[-1]
    try:
        assert url == f"sc://127.0.0.1:{port}"
        assert "committed txids 1..1" in tf("run", "user-scores", "--remote", url, "--no-progress")
        listed = tf("query", "user-scores", "--state", "per_batch", "--all", "--json")
        assert json.loads(listed)["values"] == SEED_002_PER_BATCH, listed
    finally:
        tf("spark-connect", "--port", str(port), "--stop")


SEED_002 = (
    "import json; from tridentflow.examples.user_scores import SEED_BATCH; "
    "print('\\n'.join(json.dumps(r) for r in SEED_BATCH))"
)
SEED_002_PER_BATCH = [{"key": [1], "value": {"nickt1": 1, "nickt2": 1, "nickt3": 1}}]
"""Seed 002's answer (as tests/test_examples.py states it on the reference engine)."""
