"""docker-compose.yaml cannot be run here (no Docker engine): check it statically."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
AIRFLOW_SERVICES = {
    "airflow-apiserver",
    "airflow-scheduler",
    "airflow-dag-processor",
    "airflow-triggerer",
    "airflow-init",
}


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yaml").read_text())


def test_the_full_stack_is_there(compose):
    assert AIRFLOW_SERVICES | {"postgres", "redis", "spark-master", "spark-worker"} <= set(
        compose["services"]
    )


def test_every_mounted_path_and_build_file_exists(compose):
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith((".", "/")):
                assert (ROOT / source).exists(), f"{name} mounts missing {source}"
            else:
                assert source in compose["volumes"], f"{name} uses undeclared volume {source}"
        build = service.get("build")
        if build:
            assert (ROOT / build["context"] / build["dockerfile"]).is_file()
        for dep in service.get("depends_on", []):
            assert dep in compose["services"], f"{name} depends on unknown {dep}"


def test_airflow_services_share_the_connections(compose):
    for name in AIRFLOW_SERVICES:
        env = compose["services"][name]["environment"]
        spark = json.loads(env["AIRFLOW_CONN_SPARK_DEFAULT"])
        assert spark["host"] == "spark://spark-master" and spark["port"] == 7077
        assert re.fullmatch(r"redis://redis:6379/[1-9]\d*", env["AIRFLOW_CONN_REDIS_DEFAULT"])
        volumes = compose["services"][name]["volumes"]
        assert "./dags:/opt/airflow/dags" in volumes
        assert "./spark_jobs:/opt/tridentflow/spark_jobs" in volumes


def test_the_worker_sees_the_log_at_the_same_path(compose):
    home = compose["services"]["airflow-scheduler"]["environment"]["TRIDENTFLOW_HOME"]
    assert f"tridentflow-home:{home}" in compose["services"]["spark-worker"]["volumes"]


def test_images_pin_the_project_versions():
    pyproject = (ROOT / "pyproject.toml").read_text()
    airflow = (ROOT / "docker" / "airflow.Dockerfile").read_text()
    for pin in ("apache-airflow==3.3.2", "pyspark==4.3.0"):
        assert pin in pyproject and pin in airflow
    spark = (ROOT / "docker" / "spark.Dockerfile").read_text()
    assert re.search(r"apache/spark:4\.3\.0", spark)
    assert "openjdk-17" in airflow
