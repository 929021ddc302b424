"""Every setting a deployment gives tridentflow, in one table (``SETTINGS``), and where each is
read from: its ``TRIDENTFLOW_*`` environment variable, else the ``[tridentflow]`` section of
the platform's configuration - Airflow's ``airflow.cfg`` and ``AIRFLOW__TRIDENTFLOW__<KEY>``,
as Airflow's providers keep theirs (``tridentflow_airflow`` registers Airflow's configuration
as the source; without it - the CLI given a Redis URL imports no Airflow -
``AIRFLOW__TRIDENTFLOW__<KEY>`` is read from the environment, then the ``[tridentflow]``
section of the ``airflow.cfg`` Airflow would read: ``AIRFLOW_CONFIG``, else
``$AIRFLOW_HOME/airflow.cfg``, else ``~/airflow/airflow.cfg``) - else the default. A value
equal to its default counts as unset there (Airflow writes every default into the file it
makes). The two set to different values is a one-line error naming both: a deployment
never runs with two answers to one question.

Values are checked where they are read: a number that is not one is a one-line error naming
where it came from, never a traceback and never silently replaced by the default.
"""

from __future__ import annotations

import configparser
import os
from collections.abc import Callable
from dataclasses import dataclass

from tridentflow.errors import SettingsConflictError, TridentflowError

SECTION = "tridentflow"


@dataclass(frozen=True)
class Setting:
    """One setting: its key in the ``[tridentflow]`` section, its environment variable, its
    default (None: unset) and type, and what it does (the provider's config docs)."""

    key: str
    default: str | None
    type: str
    description: str
    example: str | None = None
    sensitive: bool = False

    @property
    def env(self) -> str:
        return f"TRIDENTFLOW_{self.key.upper()}"

    @property
    def airflow_env(self) -> str:
        return f"AIRFLOW__{SECTION.upper()}__{self.key.upper()}"


SETTINGS: tuple[Setting, ...] = (
    Setting("staging", "redis", "string",
            "Where emits stage a txid's partials until its commit: redis (next to each state "
            "shard: emit and commit share nothing but Redis - any executor, any host) or files "
            "(under home, which every task of a run must then share; measured faster on one "
            "host for small txids: docs/benchmarks.md).", "files"),
    Setting("home", None, "string",
            "Directory for the file log sources and, with staging = files, the staged "
            "partials (default ~/.tridentflow).", "/var/lib/tridentflow"),
    Setting("namespace", None, "string",
            "Key namespace that separates deployments sharing one Redis database and the same "
            "pipeline names (keys tf:NAMESPACE:{pipeline}:...).", "prod"),
    Setting("retain_txids", "0", "integer",
            "Committed txids whose undo logs are kept: what `query --as-of` and `rewind` can "
            "reach (0: off). Recorded with the pipeline in Redis: every component reads the "
            "same.", "20"),
    Setting("state_shards", "1", "integer",
            "State shards of a new pipeline's map states (a Redis Cluster spreads them over "
            "its masters); a pipeline's stored count wins.", "3"),
    Setting("wait_replicas", "0", "integer",
            "Replicas that must acknowledge each txid's metadata, writes and mark before the "
            "step succeeds (Redis WAIT; 0: do not wait).", "1"),
    Setting("wait_timeout_ms", "5000", "integer",
            "How long a step waits for wait_replicas acknowledgements.", "5000"),
    Setting("retries", "6", "integer",
            "Retries of every tridentflow task (each replays the same txid).", "6"),
    Setting("retry_delay_seconds", "5", "float",
            "First retry delay of tridentflow tasks, doubled at each retry.", "5"),
    Setting("max_retry_delay_seconds", "120", "float",
            "Cap on one retry delay of tridentflow tasks.", "120"),
    Setting("read_deadline_s", "4", "float",
            "Bound on the view's listing and the metrics scrape: a pipeline not read within "
            "it is shown as unreadable, the others answer.", "4"),
    Setting("metrics_token", None, "string",
            "A scrape token: `Authorization: Bearer <it>` opens /tridentflow/metrics (only "
            "there) to a Prometheus that cannot log in to Airflow. Sensitive: give it as "
            "AIRFLOW__TRIDENTFLOW__METRICS_TOKEN_SECRET (a secrets backend's key) or _CMD.",
            None, sensitive=True),
    Setting("pipelines", None, "string",
            "Comma-separated module:attribute refs of pipelines no DAG runs that the view "
            "shows too (the DAGs' own pipelines it finds by itself).", "my_jobs:counts"),
    Setting("connect_timeout_s", "10", "float",
            "Spark Connect: how long the handshake with the server may take.", "10"),
    Setting("connect_retry_s", "30", "float",
            "Spark Connect: the retry budget of a call whose server stopped answering.", "30"),
    Setting("spark_job_timeout_s", "3600", "float",
            "Spark Connect: a job still running after this long is interrupted.", "3600"),
    Setting("driver_staging_records", "200000", "integer",
            "With staging = redis on Spark: a batch of more records has its partials staged "
            "by the executors (the driver holds no key).", "200000"),
    Setting("local_emit_max_records", "10000", "integer",
            "An emit whose batch reads at most this many records runs the local engine in the "
            "emit task's own process: no spark-submit JVM, no Connect job (0: always Spark; "
            "the crossover: docs/benchmarks.md).", "10000"),
    Setting("spark_graph", "rdd", "string",
            "How classic Spark runs a batch's operations: rdd or frames (Spark Connect always "
            "uses frames).", "rdd"),
    Setting("file_read", "columns", "string",
            "How Spark reads a Parquet or CSV FileSource's files for the DataFrame steps that "
            "read it: columns (in columns wherever that gives the record stage's rows "
            "exactly) or rows (every file through the record stage).", "columns"),
)  # fmt: skip
BY_ENV = {s.env: s for s in SETTINGS}
BY_KEY = {s.key: s for s in SETTINGS}

PlatformSource = Callable[[str], "str | None"]
"""``key`` -> the value the platform's configuration gives ``[tridentflow] key`` (None: not
set there)."""

_platform: dict[str, PlatformSource | str] = {}


def use_platform_config(source: PlatformSource, name: str) -> None:
    """Read ``[tridentflow]`` through ``source`` (Airflow's configuration, registered by
    tridentflow_airflow when it is imported); ``name`` says where, in error messages."""
    _platform["source"], _platform["name"] = source, name


def _from_platform(setting: Setting) -> tuple[str | None, str]:
    source = _platform.get("source")
    if callable(source):
        try:
            value = source(setting.key)
        except Exception:  # a platform that cannot answer here: its environment still does
            value = None
        else:
            return (value if value not in (None, "") else None), str(_platform["name"])
    raw = os.environ.get(setting.airflow_env, "").strip()
    if raw:
        return raw, setting.airflow_env
    return _from_airflow_cfg(setting)


def _airflow_cfg_path() -> str | None:
    """The ``airflow.cfg`` Airflow would read here (None: there is none)."""
    path = os.environ.get("AIRFLOW_CONFIG") or os.path.join(
        os.environ.get("AIRFLOW_HOME") or os.path.expanduser("~/airflow"), "airflow.cfg"
    )
    return path if os.path.isfile(path) else None


_cfg_cache: dict[tuple[str, float], dict[str, str]] = {}


def _from_airflow_cfg(setting: Setting) -> tuple[str | None, str]:
    """``[tridentflow] key`` of the airflow.cfg file, read without Airflow (a value equal to
    the setting's default counts as unset, as with Airflow's own configuration)."""
    path = _airflow_cfg_path()
    if path is None:
        return None, setting.airflow_env
    key = (path, os.path.getmtime(path))
    if key not in _cfg_cache:
        parser = configparser.ConfigParser(interpolation=None, strict=False)
        try:
            parser.read(path, encoding="utf-8")
        except (configparser.Error, UnicodeDecodeError, OSError):
            return None, path  # Airflow itself says what is wrong with its file
        _cfg_cache.clear()
        _cfg_cache[key] = dict(parser[SECTION]) if parser.has_section(SECTION) else {}
    value = (_cfg_cache[key].get(setting.key) or "").strip()
    if not value or value == (setting.default or ""):
        return None, path
    return value, path


def explicit_setting(env: str) -> str | None:
    """What the deployment set for the setting whose environment variable is ``env``: the
    variable, else the platform's ``[tridentflow]`` option; None if neither. SettingsConflictError
    (one line) when both are set and differ. A name outside the table is read from the
    environment only."""
    own = os.environ.get(env, "").strip() or None
    setting = BY_ENV.get(env)
    if setting is None:
        return own
    platform, where = _from_platform(setting)
    platform = platform.strip() if platform is not None else None
    if own is not None and platform is not None and own != platform:
        shown = "(values hidden)" if setting.sensitive else f"{own!r} and {platform!r}"
        raise SettingsConflictError(
            f"{env} and [{SECTION}] {setting.key} ({where}) disagree: {shown}; set one of them"
        )
    return own if own is not None else platform


def raw_setting(env: str) -> str | None:
    """The setting's value: what the deployment set (``explicit_setting``), else the table's
    default."""
    value = explicit_setting(env)
    setting = BY_ENV.get(env)
    return value if value is not None or setting is None else setting.default


def source_of(env: str) -> str:
    """Where the setting's value comes from, for people: the variable, the platform's
    configuration, or "default"."""
    if os.environ.get(env, "").strip():
        return env
    setting = BY_ENV.get(env)
    if setting is not None:
        value, where = _from_platform(setting)
        if value is not None:
            return f"[{SECTION}] {setting.key} ({where})"
    return "default"


def env_int(name: str, default: int) -> int:
    """A whole number >= 0 from setting ``name`` (``default`` when not set)."""
    raw = explicit_setting(name)
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise TridentflowError(f"{source_of(name)} must be a whole number >= 0, got {raw!r}")
    return value


def env_seconds(name: str, default: float, allow_zero: bool = False) -> float:
    """A number of seconds from setting ``name`` (``default`` when not set): > 0, or >= 0
    with ``allow_zero``."""
    raw = explicit_setting(name)
    try:
        value = float(raw) if raw else default
    except ValueError:
        value = -1.0
    if not (value >= 0 if allow_zero else value > 0):
        bound = ">= 0" if allow_zero else "> 0"
        raise TridentflowError(
            f"{source_of(name)} must be a number of seconds {bound}, got {raw!r}"
        )
    return value
