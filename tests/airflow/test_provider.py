"""The provider metadata Airflow reads (tridentflow_airflow.provider): it validates against
Airflow's own provider_info.schema.json; its [tridentflow] section answers `airflow config
get-value` and reaches tridentflow's settings through airflow.cfg and AIRFLOW__TRIDENTFLOW__*;
its tridentflow:// asset URIs are normalized and turned into OpenLineage datasets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tridentflow_airflow.assets import normalize_uri, to_openlineage
from tridentflow_airflow.provider import get_provider_info

pytestmark = [pytest.mark.airflow]


def test_the_provider_info_validates_against_airflows_schema():
    import jsonschema
    from airflow import __file__ as airflow_init

    schema = json.loads((Path(airflow_init).parent / "provider_info.schema.json").read_text())
    info = get_provider_info()
    jsonschema.validate(info, schema)
    options = info["config"]["tridentflow"]["options"]
    assert options["staging"]["default"] == "redis" and options["metrics_token"]["sensitive"]
    assert info["asset-uris"][0]["schemes"] == ["tridentflow"]
    assert info["connection-types"][0]["connection-type"] == "redis"


def _airflow(home: Path, *args: str, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "TRIDENTFLOW"))}
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("airflow")), *args],
        env={**clean, "AIRFLOW_HOME": str(home), **env},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip().splitlines()[-1]


def test_airflow_config_answers_the_tridentflow_section(tmp_path):
    assert _airflow(tmp_path, "config", "get-value", "tridentflow", "staging") == "redis"
    files = {"AIRFLOW__TRIDENTFLOW__STAGING": "files"}
    assert _airflow(tmp_path, "config", "get-value", "tridentflow", "staging", **files) == "files"


STAGING_OF_A_TASK = """
import tridentflow_airflow.hooks  # what every task imports: Airflow's [tridentflow] section
from tridentflow.registry import load_pipeline
from tridentflow.steps.runtime import Runtime
import redis
rt = Runtime(load_pipeline("wordcount"), redis.Redis.from_url("redis://127.0.0.1:1/0"), "HOME")
try:
    print(rt.staging_choice())
except Exception as exc:
    print("ERROR", exc)
"""


def test_airflow_cfg_reaches_the_tasks_settings_and_a_conflict_is_one_line(tmp_path):
    (tmp_path / "airflow.cfg").write_text("[tridentflow]\nstaging = files\n")
    code = STAGING_OF_A_TASK.replace("HOME", str(tmp_path))

    def staging(**env: str) -> str:
        clean = {
            k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW_", "TRIDENTFLOW"))
        }
        proc = subprocess.run(
            [sys.executable, "-c", code],
            env={**clean, "AIRFLOW_HOME": str(tmp_path), **env},
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc.stdout.strip().splitlines()[-1]

    assert staging() == "files"  # airflow.cfg's [tridentflow] staging = files
    assert staging(TRIDENTFLOW_STAGING="files") == "files"  # the same: fine
    conflict = staging(TRIDENTFLOW_STAGING="redis")
    assert conflict.startswith("ERROR TRIDENTFLOW_STAGING and [tridentflow] staging"), conflict
    assert "'redis' and 'files'" in conflict
    # the default the provider declares is no setting of the deployment's (Airflow writes the
    # declared defaults into the airflow.cfg it creates): no conflict with a variable
    (tmp_path / "airflow.cfg").write_text("[tridentflow]\nstaging = redis\nretries = 6\n")
    assert staging(TRIDENTFLOW_STAGING="files") == "files"


@pytest.mark.parametrize(
    ("uri", "normal"),
    [
        ("tridentflow://redis_default/wordcount/counts", "tridentflow://redis_default/wordcount/counts"),
        ("tridentflow://redis_default/wordcount/", "tridentflow://redis_default/wordcount"),
    ],
)  # fmt: skip
def test_asset_uris_are_normalized(uri, normal):
    assert normalize_uri(urlsplit(uri)).geturl() == normal


@pytest.mark.parametrize(
    "uri",
    ["tridentflow://redis_default", "tridentflow:///wordcount", "tridentflow://c/a/b/c",
     "tridentflow://c/not a name"],
)  # fmt: skip
def test_a_malformed_asset_uri_is_one_line(uri):
    with pytest.raises(ValueError) as exc:
        normalize_uri(urlsplit(uri))
    assert "\n" not in str(exc.value)


def test_a_state_asset_becomes_the_redis_hash_its_commit_reports(redis_url, monkeypatch):
    from airflow.sdk import Asset

    from tests.airflow.test_view import as_connection
    from tridentflow.datasets import redis_namespace

    monkeypatch.setenv("AIRFLOW_CONN_REDIS_DEFAULT", as_connection(redis_url))
    dataset = to_openlineage(Asset(uri="tridentflow://redis_default/wordcount/counts"))
    assert (dataset.namespace, dataset.name) == (
        redis_namespace(redis_url),
        "tf:{wordcount}:state:counts",
    )
    source = to_openlineage(Asset(uri="tridentflow://redis_default/wordcount"))
    assert (source.namespace, source.name) == ("tridentflow://redis_default", "wordcount")
