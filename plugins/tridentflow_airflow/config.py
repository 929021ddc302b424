"""tridentflow's settings where Airflow keeps its providers' settings: the ``[tridentflow]``
section of Airflow's configuration (``airflow.cfg``, ``AIRFLOW__TRIDENTFLOW__<KEY>``, and for
the sensitive ``metrics_token`` its ``_CMD``/``_SECRET`` forms), declared in the provider's
metadata (``config``: ``airflow config list`` shows it, ``airflow config get-value tridentflow
staging`` answers). ``use_airflow_config`` makes it the source tridentflow.settings reads after
the ``TRIDENTFLOW_*`` variables; the two disagreeing is a one-line error. Idempotent."""

from __future__ import annotations

from typing import Any

from tridentflow.settings import BY_KEY, SECTION, SETTINGS, use_platform_config
from tridentflow_airflow.provider import distribution_version


def _get(key: str) -> str | None:
    """``[tridentflow] key`` as the deployment changed it, else None. A value equal to the
    default the provider declares is not a setting of the deployment's: Airflow writes every
    declared default into the airflow.cfg it creates, so such a value cannot tell a choice from
    a copy - and must not be taken to disagree with a ``TRIDENTFLOW_*`` variable."""
    from airflow.configuration import conf

    value = conf.get(SECTION, key, fallback=None)
    if value is None:
        return None
    setting = BY_KEY.get(key)
    if setting is not None and value.strip() == (setting.default or ""):
        return None
    return value


def use_airflow_config() -> None:
    """Read ``[tridentflow]`` through Airflow's configuration from now on (this process)."""
    use_platform_config(_get, "Airflow's configuration")


def config_section() -> dict[str, Any]:
    """The provider metadata's ``config`` entry: every setting of tridentflow.settings."""
    version = distribution_version()
    options = {
        s.key: {
            "description": f"{s.description} Environment variable: {s.env}.",
            "version_added": version if version != "0+unknown" else "0.1.0",
            "type": s.type,
            "example": s.example,
            "default": s.default,
            **({"sensitive": True} if s.sensitive else {}),
        }
        for s in SETTINGS
    }
    return {
        SECTION: {
            "description": "tridentflow: exactly-once batch pipelines on Airflow, Spark and "
            "Redis. Each option may also be given by its TRIDENTFLOW_* environment variable; "
            "the two set to different values is an error.",
            "options": options,
        }
    }
