"""Build the distribution and install it into clean venvs, as a user's environment would get
it: shared by tests/test_wheel.py (the wheel itself) and tests/test_versions.py (the oldest
and newest supported Airflow and pyspark lines)."""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.conftest import ROOT

CONSTRAINTS = ROOT / "constraints"


def run(*args: str | Path, cwd: Path, env: dict[str, str] | None = None, timeout: int = 900):
    """Run a command; fail the test with the tail of its output unless it exits 0."""
    proc = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, f"{args}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def clean_env(venv: Path, **extra: str) -> dict[str, str]:
    """The machine's environment without the test run's Python, Spark, Airflow or tridentflow
    settings, with ``venv`` first on PATH."""
    mine = ("PYTHON", "VIRTUAL_ENV", "PYSPARK_", "SPARK_HOME", "TRIDENTFLOW_", "AIRFLOW")
    # PYSPARK_PYTHON too: scripts/env.sh points it at the repo's venv, whose Spark workers
    # would then run the checkout's code (and find the test's TRIDENTFLOW_HOME, a directory
    # named tridentflow in their cwd, before an editable install)
    env = {k: v for k, v in os.environ.items() if not k.startswith(mine)}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return {**env, **extra}


def build(outdir: Path) -> tuple[Path, Path]:
    """(the sdist, the wheel built from that sdist) with pypa/build, each in an isolated
    build environment (the build-system of pyproject.toml), as a release makes them. One
    build at a time: setuptools writes its egg-info into the checkout."""
    digest = hashlib.sha256(str(ROOT).encode()).hexdigest()[:12]  # the same in every worker
    lock_path = Path(tempfile.gettempdir()) / f"tridentflow-build-{digest}.lock"
    with lock_path.open("w") as lock:  # not in .git: a worktree's .git is a file
        fcntl.flock(lock, fcntl.LOCK_EX)
        run(sys.executable, "-m", "build", "--outdir", outdir, ROOT, cwd=ROOT)
    (sdist,) = outdir.glob("tridentflow-*.tar.gz")
    (wheel,) = outdir.glob("tridentflow-*.whl")
    return sdist, wheel


def make_venv(where: Path, *requirements: str | Path, constraints: Path) -> Path:
    """A new venv at ``where`` with ``requirements`` installed by pip under ``constraints``
    (nothing from this test run's environment); returns ``where``."""
    run(sys.executable, "-m", "venv", where, cwd=where.parent)
    install(where, *requirements, constraints=constraints)
    return where


def install(venv: Path, *requirements: str | Path, constraints: Path) -> None:
    pip = [venv / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    run(*pip, "-c", constraints, *requirements, cwd=venv.parent, env=clean_env(venv))
