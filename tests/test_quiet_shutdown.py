"""The test run's last screen is its summary: no logging tracebacks from exit handlers that
log after pytest closed the streams it captured (tests/quiet_shutdown.py)."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT

LATE_LOGGER = """
import atexit, logging, sys

def test_a_handler_on_the_captured_stream_and_a_late_log():
    # what Airflow's logging setup and py4j's exit handler do in one test process
    root = logging.getLogger()
    root.addHandler(logging.StreamHandler(sys.stderr))
    root.setLevel(logging.INFO)
    atexit.register(lambda: logging.getLogger("py4j.clientserver").info("Closing down"))
"""


def _run(tmp_path, *plugins: str) -> str:
    test = tmp_path / "test_late.py"
    test.write_text(LATE_LOGGER)
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test)]
    for plugin in plugins:
        args += ["-p", plugin]
    done = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert "1 passed" in done.stdout, done.stdout + done.stderr
    return done.stdout + done.stderr


def test_a_late_log_after_the_run_prints_no_traceback(tmp_path):
    assert "Logging error" in _run(tmp_path)  # the failure, reproduced without the plugin
    out = _run(tmp_path, "tests.quiet_shutdown")
    assert "Logging error" not in out and "Traceback" not in out, out
    assert (
        out.rstrip().splitlines()[-1].endswith("passed in " + out.rstrip().split("passed in ")[-1])
    )
