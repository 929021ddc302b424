"""tridentflow's settings (tridentflow.settings): each from its TRIDENTFLOW_* variable, else
the platform's [tridentflow] section (AIRFLOW__TRIDENTFLOW__<KEY> here: no Airflow in the fast
lane), else its default; the two disagreeing is one line naming both; a bad number names where
it came from."""

from __future__ import annotations

import pytest

from tridentflow import settings
from tridentflow.settings import (
    SETTINGS,
    SettingsConflictError,
    env_int,
    env_seconds,
    explicit_setting,
    raw_setting,
    source_of,
)


@pytest.fixture(autouse=True)
def no_platform(monkeypatch, tmp_path):
    monkeypatch.setattr(settings, "_platform", {})
    monkeypatch.setenv("AIRFLOW_CONFIG", str(tmp_path / "no-airflow.cfg"))
    for s in SETTINGS:
        monkeypatch.delenv(s.env, raising=False)
        monkeypatch.delenv(s.airflow_env, raising=False)


def test_the_variable_then_the_platform_section_then_the_default(monkeypatch):
    assert raw_setting("TRIDENTFLOW_STAGING") == "redis" and source_of("TRIDENTFLOW_STAGING") == (
        "default"
    )
    monkeypatch.setenv("AIRFLOW__TRIDENTFLOW__STAGING", "files")
    assert raw_setting("TRIDENTFLOW_STAGING") == "files"
    assert "[tridentflow] staging" in source_of("TRIDENTFLOW_STAGING")
    monkeypatch.setenv("TRIDENTFLOW_STAGING", "files")  # both, the same: fine
    assert raw_setting("TRIDENTFLOW_STAGING") == "files"
    assert source_of("TRIDENTFLOW_STAGING") == "TRIDENTFLOW_STAGING"


def test_the_two_disagreeing_is_one_line_naming_both(monkeypatch):
    monkeypatch.setenv("TRIDENTFLOW_STAGING", "files")
    monkeypatch.setenv("AIRFLOW__TRIDENTFLOW__STAGING", "redis")
    with pytest.raises(SettingsConflictError) as exc:
        raw_setting("TRIDENTFLOW_STAGING")
    line = str(exc.value)
    assert "TRIDENTFLOW_STAGING" in line and "[tridentflow] staging" in line and "\n" not in line
    assert "'files'" in line and "'redis'" in line and not exc.value.retry_helps
    monkeypatch.setenv("TRIDENTFLOW_METRICS_TOKEN", "a-secret")
    monkeypatch.setenv("AIRFLOW__TRIDENTFLOW__METRICS_TOKEN", "another")
    with pytest.raises(SettingsConflictError) as exc:
        explicit_setting("TRIDENTFLOW_METRICS_TOKEN")
    assert "secret" not in str(exc.value) and "another" not in str(exc.value)


def test_a_registered_platform_source_answers_after_the_variable(monkeypatch):
    settings.use_platform_config({"retain_txids": "7"}.get, "a test's configuration")
    assert env_int("TRIDENTFLOW_RETAIN_TXIDS", 0) == 7
    assert "a test's configuration" in source_of("TRIDENTFLOW_RETAIN_TXIDS")
    assert env_int("TRIDENTFLOW_STATE_SHARDS", 1) == 1  # not set there: the caller's default


def test_a_number_that_is_not_one_names_where_it_came_from(monkeypatch):
    monkeypatch.setenv("AIRFLOW__TRIDENTFLOW__RETRIES", "six")
    with pytest.raises(Exception, match=r"\[tridentflow\] retries .* whole number"):
        env_int("TRIDENTFLOW_RETRIES", 6)
    monkeypatch.setenv("TRIDENTFLOW_READ_DEADLINE_S", "-1")
    with pytest.raises(Exception, match="TRIDENTFLOW_READ_DEADLINE_S must be a number of seconds"):
        env_seconds("TRIDENTFLOW_READ_DEADLINE_S", 4.0)


def test_every_setting_a_module_reads_is_in_the_table():
    """A setting read in the code but missing from the table would never reach Airflow's
    configuration: every ``TRIDENTFLOW_*`` a deployment sets is declared."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    declared = {s.env for s in SETTINGS}
    not_deployment = {  # per process, per test, or a connection's job
        "TRIDENTFLOW_REDIS_URL", "TRIDENTFLOW_FAULTS", "TRIDENTFLOW_ERROR_FILE",
        "TRIDENTFLOW_KAFKA_BOOTSTRAP", "TRIDENTFLOW_KAFKA_CONFIG", "TRIDENTFLOW_POSTGRES_DSN",
        "TRIDENTFLOW_TANSU_BIN", "TRIDENTFLOW_SQLITE_SOURCE", "TRIDENTFLOW_VENV",
        "TRIDENTFLOW_DELTA_TABLE",
        "TRIDENTFLOW_TEST_WORKERS",
    }  # fmt: skip
    used = set()
    for folder in ("tridentflow", "plugins", "spark_jobs", "state"):
        for path in (root / folder).rglob("*.py"):
            if "devtools" in path.parts:
                continue
            used |= set(re.findall(r'"(TRIDENTFLOW_[A-Z_]+)"', path.read_text()))
    assert used - not_deployment <= declared, sorted(used - not_deployment - declared)


def test_without_airflow_loaded_the_airflow_cfg_file_still_answers(monkeypatch, tmp_path):
    """A process that imports no Airflow (the CLI given a Redis URL) reads the [tridentflow]
    section of the airflow.cfg Airflow would read - never a second answer to one question: a
    default-valued line (Airflow writes them all) counts as unset, the environment's
    AIRFLOW__TRIDENTFLOW__<KEY> comes first as in Airflow, and a TRIDENTFLOW_* variable that
    disagrees is the one-line conflict naming the file."""
    home = tmp_path / "airflow-home"
    home.mkdir()
    (home / "airflow.cfg").write_text(
        "[core]\ndags_folder = /dags\n[tridentflow]\nnamespace = team-a\nstaging = redis\n"
    )
    monkeypatch.delenv("AIRFLOW_CONFIG")
    monkeypatch.setenv("AIRFLOW_HOME", str(home))
    assert raw_setting("TRIDENTFLOW_NAMESPACE") == "team-a"
    assert str(home / "airflow.cfg") in source_of("TRIDENTFLOW_NAMESPACE")
    assert source_of("TRIDENTFLOW_STAGING") == "default"  # the default's copy: unset
    monkeypatch.setenv("AIRFLOW__TRIDENTFLOW__NAMESPACE", "team-b")
    assert raw_setting("TRIDENTFLOW_NAMESPACE") == "team-b"
    monkeypatch.delenv("AIRFLOW__TRIDENTFLOW__NAMESPACE")
    monkeypatch.setenv("TRIDENTFLOW_NAMESPACE", "team-c")
    with pytest.raises(SettingsConflictError) as exc:
        raw_setting("TRIDENTFLOW_NAMESPACE")
    assert "airflow.cfg" in str(exc.value) and "\n" not in str(exc.value)
