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
    launcher._pids_file(tmp_path).write_text(json.dumps({n: p.pid for n, p in procs.items()}))
    started = time.monotonic()
    stopped = launcher.down(tmp_path, grace=20)
    took = time.monotonic() - started
    assert set(stopped) == set(procs)
    assert all(p.poll() is not None for p in procs.values())  # reaped: no zombie left
    assert took < 5, f"down took {took:.1f}s"
