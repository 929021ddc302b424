"""Provider metadata: what Airflow's ProvidersManager learns of tridentflow from the installed
distribution (its ``apache_airflow_provider`` entry point) - the operators, hooks and
triggers (the on-data asset watcher), the operator extra link, the Redis connection type, the
``tridentflow://`` asset URIs, the ``[tridentflow]`` configuration section, the version. It
imports no Airflow (Airflow reads it while its own configuration is loading)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any


def distribution_version() -> str:
    """The installed tridentflow's version ('0+unknown' when run from a bare checkout)."""
    try:
        return version("tridentflow")
    except PackageNotFoundError:
        return "0+unknown"


def get_provider_info() -> dict[str, Any]:
    """The provider info Airflow validates against its provider_info schema."""
    from tridentflow_airflow.config import config_section

    return {
        "package-name": "tridentflow",
        "name": "tridentflow",
        "description": "Storm Trident's exactly-once batch semantics on Airflow + PySpark + "
        "Redis: a DAG run is one txid, replays land nothing twice.",
        "versions": [distribution_version()],
        "integrations": [
            {
                "integration-name": "tridentflow",
                "external-doc-url": "https://pypi.org/project/tridentflow/",
                "tags": ["software"],
            }
        ],
        "operators": [
            {
                "integration-name": "tridentflow",
                "python-modules": ["tridentflow_airflow.operators"],
            }
        ],
        "hooks": [
            {
                "integration-name": "tridentflow",
                "python-modules": ["tridentflow_airflow.hooks"],
            }
        ],
        "triggers": [
            {
                "integration-name": "tridentflow",
                "python-modules": ["tridentflow_airflow.watchers"],
            }
        ],
        "extra-links": ["tridentflow_airflow.links.TridentflowRunLink"],
        # the UI's Add Connection offers it, `airflow providers hooks` lists it (Airflow keeps
        # the first provider's hook where apache-airflow-providers-redis declares one too)
        "connection-types": [
            {
                "hook-class-name": "tridentflow_airflow.hooks.TridentflowRedisHook",
                "connection-type": "redis",
            }
        ],
        # tridentflow://CONN/PIPELINE/STATE (a state) and tridentflow://CONN/PIPELINE (a
        # pipeline's source data, the on-data watcher's asset)
        "asset-uris": [
            {
                "schemes": ["tridentflow"],
                "handler": "tridentflow_airflow.assets.normalize_uri",
                "to_openlineage_converter": "tridentflow_airflow.assets.to_openlineage",
            }
        ],
        "config": config_section(),
    }
