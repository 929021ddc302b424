"""The distribution a user installs is what is tested: the sdist and the wheel are built from
this checkout, the wheel is installed into a clean venv (not editable, no PYTHONPATH, run from
a directory outside the checkout), and it must hold every module of the repo, run the seed
word count on the local engine without Airflow. (With the ``airflow`` extra, Airflow finds its
DAGs, plugin and provider from a five-line DAG file: tests/test_versions.py, on the oldest and
the newest supported Airflow, CI's matrix lane.)"""

from __future__ import annotations

import subprocess
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT, SEED_SENTENCES
from tests.distribution import build, clean_env, make_venv, run

pytestmark = [pytest.mark.wheel, pytest.mark.xdist_group("wheel")]

INSTALLED_AS = {
    "tridentflow": "tridentflow",
    "state": "tridentflow_state",
    "spark_jobs": "tridentflow_spark_jobs",
    "plugins/tridentflow_airflow": "tridentflow_airflow",
}
"""Each folder of the repo that ships, and the import name it is installed under."""
DATA = ["tridentflow/log4j2.properties", "tridentflow_airflow/static/tridentflow.html"]
CONSTRAINTS = ROOT / "constraints" / "dev.txt"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """(the sdist, the wheel built from that sdist), as a release would make them."""
    yield build(tmp_path_factory.mktemp("dist"))


def test_the_wheel_holds_every_module_of_the_repo(built):
    _sdist, wheel = built
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = []
    for folder, installed in INSTALLED_AS.items():
        for path in (ROOT / folder).rglob("*.py"):
            relative = path.relative_to(ROOT / folder).as_posix()
            if f"{installed}/{relative}" not in names:
                missing.append(f"{folder}/{relative}")
    assert not missing, f"not in the wheel: {missing}"
    assert not [d for d in DATA if d not in names], names
    top = {n.split("/")[0] for n in names if not n.startswith("tridentflow-")}
    assert top == set(INSTALLED_AS.values()), top  # no generic top-level name (state, ...)
    metadata = (
        zipfile.ZipFile(wheel)
        .read(next(n for n in names if n.endswith(".dist-info/entry_points.txt")))
        .decode()
    )
    assert "tridentflow_airflow.plugin:TridentflowPlugin" in metadata
    assert "tridentflow_airflow.provider:get_provider_info" in metadata


@pytest.fixture(scope="module")
def venv(built, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A clean venv with the wheel installed, without Airflow (the CLI's dependencies only)."""
    _sdist, wheel = built
    return make_venv(tmp_path_factory.mktemp("venv") / "v", wheel, constraints=CONSTRAINTS)


def test_the_wheel_runs_the_seed_word_count_without_airflow(
    venv, tmp_path, redis_url, redis_client
):
    outside = tmp_path / "elsewhere"  # no checkout here: only the installed wheel imports
    outside.mkdir()
    python = venv / "bin" / "python"
    probe = "import importlib.util as u; print(u.find_spec('airflow') is None)"
    assert run(python, "-c", probe, cwd=outside).stdout.strip() == "True"
    where = run(python, "-c", "import tridentflow_state, tridentflow; print(tridentflow.__file__)",
                cwd=outside)  # fmt: skip
    assert str(venv) in where.stdout and str(ROOT) not in where.stdout
    assert "usage: tridentflow" in run(venv / "bin" / "tridentflow", "--help", cwd=outside).stdout
    env = clean_env(venv, TRIDENTFLOW_REDIS_URL=redis_url, TRIDENTFLOW_HOME=str(outside / "h"))
    cli = venv / "bin" / "tridentflow"
    seed = "\n".join(SEED_SENTENCES) + "\n"
    produced = subprocess.run(
        [cli, "produce", "wordcount", "-"],
        input=seed, text=True, capture_output=True, cwd=outside, env=env, timeout=300,
    )  # fmt: skip
    assert produced.returncode == 0, produced.stderr
    run(cli, "run", "wordcount", "--engine", "local", cwd=outside, env=env)
    audit = run(cli, "audit", "wordcount", cwd=outside, env=env).stdout.strip()
    assert audit == "lost=0 doubled=0"
    counts = run(cli, "query", "wordcount", "you", "how", cwd=outside, env=env).stdout
    assert counts.splitlines() == ["you\t2", "how\t1"]
