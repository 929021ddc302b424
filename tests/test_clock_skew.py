"""Clock skew between the machines of one txid (issue 55): a run's lease, a commit's hold and
a txid's timestamps are judged by Redis's clock (``TIME`` inside the scripts), never by the
clock of the process that asks - so a coordinator ten minutes ahead and a retry ten minutes
behind still exclude each other, and no wall clock of a worker decides anything."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests.helpers import produce
from tridentflow.engines.local import LocalEngine
from tridentflow.ops.audit import audit
from tridentflow.registry import load_pipeline
from tridentflow.steps.committer import commit
from tridentflow.steps.runs import coordinate_run, emit_run
from tridentflow.steps.runtime import Runtime

ROOT = Path(__file__).resolve().parent.parent
SKEW_S = 600.0
LEASE_MS = 1500

WALL_CLOCK_READS = {
    "plugins/tridentflow_airflow/launcher.py": "a component's start time for people (and hosts "
    "without /proc); a process is known by its clock ticks since boot",
    "plugins/tridentflow_airflow/operators.py": "a try's start when Airflow gives none (durations)",
    "plugins/tridentflow_airflow/rest.py": "a triggered run's run_id (a label Airflow shows)",
    "plugins/tridentflow_airflow/view.py": "a running try's duration so far (the view)",
    "state/changes.py": "a sink position's at_ms (status shows when it moved)",
    "state/rewind.py": "a rewind's at_ms in the list of rewinds (status, the view)",
    "tridentflow/steps/export.py": "a sink failure's at_ms (status shows when it failed)",
    "tridentflow/steps/runs.py": "a task try's end, for the view's durations",
    "tridentflow/engines/spark.py": "the window of a shared Spark Connect session's id (a clock "
    "step only starts a fresh session sooner)",
    "tridentflow/sinks/iceberg.py": "vacuum's age cutoff for unreferenced files, as Delta's and "
    "Iceberg's own (an operator's command, dry run by default, 168 h)",
}
"""Every read of the process's wall clock in the product (Airflow plugin, steps, ops, engines,
sinks, the state layer), and what it is for: none decides a txid (leases, holds and commit
times come from Redis) nor which process is which."""
WALL_CLOCK_CALL = re.compile(r"\btime\.time(_ns)?\(\)|datetime\.now\(|create_time\(")
PRODUCT = ("dags", "plugins", "spark_jobs", "state", "tridentflow")


def skew(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """This process's wall clock ``seconds`` off (the monotonic clock is its own anyway)."""
    real, real_ns = time.time, time.time_ns
    monkeypatch.setattr(time, "time", lambda: real() + seconds)
    monkeypatch.setattr(time, "time_ns", lambda: real_ns() + int(seconds * 1e9))


@pytest.mark.parametrize("ahead", [SKEW_S, -SKEW_S])
def test_leases_exclude_each_other_whatever_the_workers_clocks_say(
    redis_url, redis_client, home, monkeypatch, ahead
):
    rt = Runtime.open(load_pipeline("wordcount"), redis_url, home)
    rt.ledger.reset(force=True)
    produce(rt, ["a bb", "bb ccc"])
    skew(monkeypatch, ahead)  # the coordinator's machine
    first = coordinate_run(rt, "run-a", lease_ms=LEASE_MS)
    skew(monkeypatch, -ahead)  # the next run's machine: twenty minutes apart from it
    started = time.monotonic()
    second = rt.ledger.bind_run("run-b", lease_ms=LEASE_MS)
    assert second.txid != first["txid"] or second.how != "adopted"  # the lease still holds
    time.sleep(max(0.0, LEASE_MS / 1000 + 0.2 - (time.monotonic() - started)))
    third = rt.ledger.bind_run("run-c", lease_ms=LEASE_MS)
    assert (third.txid, third.how) == (first["txid"], "adopted")  # expired by Redis's clock
    emit_run(rt, "run-c", LocalEngine())
    assert commit(rt, third.txid).status == "committed"
    info = rt.ledger.history(limit=1)[0]
    redis_now_ms = int(redis_client.time()[0]) * 1000
    assert abs(int(info["committed_ms"]) - redis_now_ms) < 60_000  # Redis's time, not ours
    assert audit(rt).ok


def test_no_step_decides_by_the_workers_wall_clock():
    """Every wall-clock read of the product (``time.time()``, ``datetime.now()``, a process's
    ``create_time()``) is a timestamp for people or a cutoff named in WALL_CLOCK_READS; a new
    one must say what it is for here - and decide nothing. The test harness (devtools) is
    not the product."""
    found = {}
    for folder in PRODUCT:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "devtools" in path.parts:
                continue
            if WALL_CLOCK_CALL.search(path.read_text()):
                found[str(path.relative_to(ROOT))] = WALL_CLOCK_READS.get(
                    str(path.relative_to(ROOT))
                )
    assert found and set(found) == set(WALL_CLOCK_READS), found
