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
        sinks = json.loads(env["AIRFLOW_CONN_POSTGRES_DEFAULT"])  # PostgresSinks: their own db
        assert (sinks["conn_type"], sinks["host"], sinks["schema"]) == (
            "postgres",
            "postgres",
            "tridentflow",
        )
        kafka = json.loads(env["AIRFLOW_CONN_KAFKA_DEFAULT"])  # KafkaSources: the kafka service
        assert kafka["extra"]["bootstrap.servers"] == "kafka:9092"
        assert "kafka" in compose["services"]
        volumes = compose["services"][name]["volumes"]
        assert "./dags:/opt/airflow/dags" in volumes
        assert "./spark_jobs:/opt/tridentflow/tridentflow_spark_jobs" in volumes  # import name


def test_the_worker_sees_the_log_at_the_same_path(compose):
    home = compose["services"]["airflow-scheduler"]["environment"]["TRIDENTFLOW_HOME"]
    assert f"tridentflow-home:{home}" in compose["services"]["spark-worker"]["volumes"]


def test_images_pin_the_project_versions():
    constraints = (ROOT / "constraints" / "dev.txt").read_text().splitlines()
    airflow = (ROOT / "docker" / "airflow.Dockerfile").read_text()
    assert "-c /opt/tridentflow/constraints/dev.txt" in airflow
    assert "--force-reinstall" not in airflow
    for pin in ("apache-airflow==3.3.2", "pyspark==4.3.0"):
        assert pin in constraints and pin in airflow
    spark = (ROOT / "docker" / "spark.Dockerfile").read_text()
    assert "pyspark==4.3.0" in spark
    assert "openjdk-17" in airflow and "openjdk-17" in spark


def test_executors_can_reach_the_driver(compose):
    """An empty SPARK_LOCAL_IP makes spark-submit advertise localhost to executors in other
    containers: the driver (the scheduler's container, where LocalExecutor runs the emits)
    advertises its service name instead, and no service pins a loopback or empty address."""
    services = compose["services"]
    for name, service in services.items():
        env = service.get("environment") or {}
        assert "SPARK_LOCAL_IP" not in env, f"{name} sets SPARK_LOCAL_IP={env['SPARK_LOCAL_IP']!r}"
        for var in ("SPARK_LOCAL_HOSTNAME", "SPARK_DRIVER_HOST"):
            value = env.get(var)
            if value is not None:
                assert value == name == service.get("hostname"), (name, var, value)
    assert services["airflow-scheduler"]["environment"]["SPARK_LOCAL_HOSTNAME"] == (
        "airflow-scheduler"
    )


def test_the_shared_home_belongs_to_the_airflow_user(compose):
    """Docker creates a named volume root-owned; Airflow runs as AIRFLOW_UID (50000): the init
    hands the home over, as the official file does for its directories."""
    init = compose["services"]["airflow-init"]
    script = "\n".join(init["command"])
    home = init["environment"]["TRIDENTFLOW_HOME"]
    assert init["user"] == "0:0"
    assert f'chown -R "${{AIRFLOW_UID:-50000}}:0" {home}' in script
    assert f"chmod -R g+rwX {home}" in script
    for name in AIRFLOW_SERVICES - {"airflow-init"}:
        assert compose["services"][name]["user"] == "${AIRFLOW_UID:-50000}:0"
    spark = (ROOT / "docker" / "spark.Dockerfile").read_text()
    assert "USER 50000:0" in spark  # executors: the same uid, group 0


def test_one_python_and_one_pyspark_everywhere(compose):
    """PySpark refuses a driver and executors of different Python minor versions: both images
    build on the same PYTHON_VERSION, PYSPARK_PYTHON is set explicitly everywhere Python runs
    tridentflow code, and pyspark is the project's pin in both."""
    airflow = (ROOT / "docker" / "airflow.Dockerfile").read_text()
    spark = (ROOT / "docker" / "spark.Dockerfile").read_text()
    version = re.search(r"ARG PYTHON_VERSION=(\S+)", airflow).group(1)
    assert re.search(rf"ARG PYTHON_VERSION={re.escape(version)}\n", spark)
    assert "FROM python:${PYTHON_VERSION}" in spark
    constraints = (ROOT / "constraints" / "dev.txt").read_text()
    pin = re.search(r"^pyspark==(\S+)$", constraints, re.M).group(1)
    assert f"pyspark=={pin}" in airflow and f"pyspark=={pin}" in spark
    python = f"/usr/local/bin/python{version}"
    for name, service in compose["services"].items():
        if name.startswith("airflow-") or name in ("spark-worker", "spark-connect"):
            assert service["environment"]["PYSPARK_PYTHON"] == python, name


def test_a_connect_service_fronts_the_cluster(compose):
    connect = compose["services"]["spark-connect"]
    command = connect["command"]
    assert command[:2] == ["start-connect-server.sh", "--wait"]  # foreground
    assert command[command.index("--master") + 1] == "spark://spark-master:7077"
    assert "spark.connect.grpc.binding.port=15002" in command
    home = compose["services"]["airflow-scheduler"]["environment"]["TRIDENTFLOW_HOME"]
    assert f"tridentflow-home:{home}" in connect["volumes"]


def test_the_docs_say_how_to_use_the_stack():
    readme = (ROOT / "docs" / "airflow.md").read_text()
    assert "docker compose exec airflow-scheduler tridentflow produce wordcount" in readme
    assert "docker compose exec airflow-scheduler tridentflow status wordcount" in readme
    assert '"conn_type":"spark_connect","host":"sc://spark-connect","port":15002' in readme
