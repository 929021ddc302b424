"""The test lanes work as scripts/test.sh relies on: under ``--dist loadgroup`` an
``xdist_group`` (one live Airflow stack, one wheel build, one Spark cluster at a time) runs on
one worker. pytest 9.2 made the node id pytest-xdist 3.8 appends the group to read-only, and
every grouped test silently ran on any worker; constraints/dev.txt holds pytest below it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

GROUPED = """
import time, pytest
pytestmark = pytest.mark.xdist_group("one")
@pytest.mark.parametrize("i", range(4))
def test_grouped(i):
    time.sleep(0.3)
"""
FREE = """
import time
def test_free_a():
    time.sleep(0.3)
def test_free_b():
    time.sleep(0.3)
"""


def test_an_xdist_group_runs_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    (tmp_path / "test_free.py").write_text(FREE)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2",
         "--dist", "loadgroup", "-v", "-o", "addopts=", str(tmp_path)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    workers = set(re.findall(r"\[(gw\d)\] .*PASSED .*test_grouped", proc.stdout))
    assert len(workers) == 1, f"the group ran on {sorted(workers)}:\n{proc.stdout[-3000:]}"


def test_the_fast_lane_refuses_a_server_topology_to_a_test_not_marked_servers(
    monkeypatch, tmp_path: Path
) -> None:
    """What ``scripts/test.sh --fast`` sets up (TRIDENTFLOW_TEST_LANE=fast): each way a test
    starts a server topology of its own - a Redis Cluster, a Kafka broker, a TLS or ACL Redis -
    fails at once in one line naming the marker, before any server process starts."""
    import pytest

    from tests import secure_redis
    from tests.conftest import SERVERS_REFUSED, refuse_server_topologies
    from tridentflow.devtools.devcluster import LocalCluster
    from tridentflow.devtools.devkafka import LocalKafka

    refuse_server_topologies(monkeypatch.setattr)
    starts = [
        lambda: LocalCluster(tmp_path / "cluster").start(),
        lambda: LocalKafka().start(),
        lambda: secure_redis.start(tmp_path / "secure"),
    ]
    for start in starts:
        with pytest.raises(RuntimeError, match="mark the test servers") as refused:
            start()
        assert str(refused.value) == SERVERS_REFUSED
    assert not any(tmp_path.iterdir())  # nothing was started, nothing written
