"""Thin operators for coordinate -> emit -> commit. Each delegates to tridentflow.steps.runs.

The run's txid lives in Redis (the ledger binds it to the Airflow run_id); XCom only carries a
copy for the UI and templating, because Airflow deletes a task's own XCom when it re-runs.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import AssetAlias, BaseOperator

import tridentflow_spark_jobs
from tridentflow.engines.local import LocalEngine
from tridentflow.engines.spark import quiet_java_options
from tridentflow.errors import TridentflowError, one_line
from tridentflow.ops import metrics
from tridentflow.registry import load_pipeline
from tridentflow.settings import SETTINGS, explicit_setting
from tridentflow.steps.runs import (
    TURN_WAIT_S,
    RunState,
    commit_run,
    coordinate_run,
    emit_plan,
    emit_run,
    emit_run_remote,
    emit_summary,
    local_emit_limit,
    note_task,
    owned_txid,
    release_run,
    wait_emit_turn,
)
from tridentflow.steps.runtime import Runtime, resolve_home
from tridentflow.user_code import shippable
from tridentflow_airflow.assets import emit_commit_events
from tridentflow_airflow.compat import AirflowFailException, AirflowNotFoundException
from tridentflow_airflow.dated_order import bind_in_date_order
from tridentflow_airflow.errors import EmitFailedError
from tridentflow_airflow.hooks import (
    TridentflowRedisHook,
    airflow_connections,
    check_spark_connection,
    kafka_config,
)
from tridentflow_airflow.links import TridentflowRunLink
from tridentflow_state.ledger import DEFAULT_LEASE_MS

EMIT_APPLICATION = Path(tridentflow_spark_jobs.__file__).with_name("emit_batch.py")
FORWARDED_ENV = (
    "TRIDENTFLOW_FAULTS",
    "TRIDENTFLOW_KAFKA_BOOTSTRAP",
    "TRIDENTFLOW_NAMESPACE",
    "PYSPARK_PYTHON",
    "PYSPARK_DRIVER_PYTHON",
    "SPARK_LOCAL_IP",
)
log = logging.getLogger(__name__)


@contextmanager
def fail_fast() -> Iterator[None]:
    """What a retry cannot fix fails the task at once (AirflowFailException, one line), not
    after minutes of retries: a pipeline that does not import or lacks a setting, a sink
    that refuses a value or a table (``TridentflowError.retry_helps`` False), a connection
    that is not defined. The line is logged alone, then raised without the cause's frames
    (the line says it all). Everything else - an outage, a race - is raised as it is, and
    Airflow retries the task."""
    try:
        yield
    except TridentflowError as exc:
        if exc.retry_helps:
            raise
        line = f"{one_line(exc)} (not retried: fix it, then clear the task)"
    except AirflowNotFoundException as exc:
        line = (
            f"{one_line(exc)}: define it (Admin > Connections, or AIRFLOW_CONN_<ID>), then clear "
            "the task (not retried)"
        )
    else:
        return
    log.error("%s", line)  # the line alone, above Airflow's traceback of the failure
    raise AirflowFailException(line) from None  # its traceback: these frames, not the cause's


class TridentflowTask:
    """Mixin: what every tridentflow task knows - the pipeline (bundled name or
    module:attribute), the Redis connection, the home directory, the txid lease.

    Put it first in the bases; each operator class must define __init__ (see CommitOperator)."""

    def __init__(
        self,
        *,
        pipeline: str,
        redis_conn_id: str = "redis_default",
        home: str | None = None,
        lease: timedelta = timedelta(minutes=30),
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.pipeline = pipeline
        self.redis_conn_id = redis_conn_id
        self.home = home
        self.lease = lease

    lineage_step = ""
    """The step of a txid the operator runs (tridentflow.steps.lineage.STEPS): what its
    OpenLineage events report."""
    lineage_result: dict[str, Any] | None = None
    """What the task's execute returned this try (the lineage of its completion)."""

    # -- OpenLineage: called by Airflow's OpenLineage provider only (tridentflow_airflow.lineage)
    def get_openlineage_facets_on_start(self) -> Any:
        from airflow.sdk import get_current_context

        ti = get_current_context()["ti"]
        return self._openlineage(ti.run_id, ti.try_number, None)

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        return self._openlineage(
            task_instance.run_id, task_instance.try_number, self.lineage_result
        )

    def get_openlineage_facets_on_failure(self, task_instance: Any) -> Any:
        return self._openlineage(task_instance.run_id, task_instance.try_number, None)

    def _openlineage(self, run_id: str, try_number: int | None, result: Any) -> Any:
        from tridentflow.steps.lineage import step_lineage
        from tridentflow_airflow.lineage import operator_lineage

        lineage = step_lineage(self.runtime(), self.lineage_step, run_id, result)
        return operator_lineage(lineage, int(try_number or 1))

    @property
    def lease_ms(self) -> int:
        return int(self.lease.total_seconds() * 1000) or DEFAULT_LEASE_MS

    def runtime(self) -> Runtime:
        """The pipeline's runtime: Redis through the connection, Airflow's connections for a
        source or sink that names none of its own."""
        url = TridentflowRedisHook(self.redis_conn_id).get_url()
        return Runtime.open(
            load_pipeline(self.pipeline),
            redis_url=url,
            home=self.home,
            connections=airflow_connections(),
        )


def run_state(context: Any) -> RunState:
    """What Airflow says of another run of this DAG (through the Task SDK, as
    TriggerDagRunOperator asks): its state, or None if it cannot tell."""
    ti = context["ti"]
    dag_id = ti.dag_id

    def state(run_id: str) -> str | None:
        try:
            found = ti.get_dagrun_state(dag_id, run_id)
        except Exception:  # unknown run, API unreachable: do not guess
            return None
        return str(getattr(found, "value", found)).lower()  # a DagRunState, or its text

    return state


def _started_ms(context: Any) -> int:
    start = getattr(context["ti"], "start_date", None)
    return int(start.timestamp() * 1000) if start is not None else int(time.time() * 1000)


def record(rt: Runtime, context: Any, txid: int, step: str, done: bool) -> None:
    """The task's try and times in the ledger (best effort; see runs.note_task)."""
    try_number = int(context["ti"].try_number or 1)
    note_task(rt, txid, step, try_number, _started_ms(context), done, str(context["run_id"]))


def report_figures(rt: Runtime) -> None:
    """The pipeline's figures (tridentflow.ops.metrics) through Airflow's Stats, so that a
    StatsD or OpenTelemetry setup gets them from every coordinate and commit. Best effort:
    a figure that cannot be read or sent never fails the task."""
    try:
        from tridentflow_airflow.compat import airflow_stats

        metrics.send_to_airflow_stats(rt.pipeline.name, metrics.figures(rt), airflow_stats())
    except Exception as exc:
        log.warning("tridentflow: figures not sent to Airflow's metrics: %s", one_line(exc))


def release_on_failure(context: Any) -> None:
    """on_failure_callback: the run gave up, so the next run adopts its txid at once."""
    task = context["task"]
    try:
        released = release_run(task.runtime(), context["run_id"])
        log.warning("tridentflow: run %s failed; txid released: %s", context["run_id"], released)
    except Exception:  # a callback must never raise
        log.exception("tridentflow: could not release the txid of run %s", context["run_id"])


class CoordinateOperator(TridentflowTask, BaseOperator):
    """Binds the run to its txid and creates (first attempt) or reuses the batch metadata.
    A run with a logical date binds after the run before it by date
    (tridentflow_airflow.dated_order): a backfill or a catch-up keeps its txids in date
    order, and a backfill that runs backwards is refused."""

    template_fields = ("batch_size", "pipeline")
    """``pipeline`` among them so the serialized DAG keeps it: the view learns from it which
    pipeline this DAG runs (tridentflow_airflow.catalog) instead of guessing from the DAG id."""
    ui_color = "#e8f0fe"
    lineage_step = "coordinate"
    operator_extra_links = (TridentflowRunLink(),)

    def __init__(self, *, batch_size: int | str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.batch_size = batch_size

    def execute(self, context: Any) -> dict[str, Any]:
        with fail_fast():
            return self._coordinate(context)

    def _coordinate(self, context: Any) -> dict[str, Any]:
        size = int(self.batch_size) if self.batch_size not in (None, "", "None") else None
        rt = self.runtime()
        bind_in_date_order(context, rt)  # runs with a logical date bind in date order
        result = coordinate_run(rt, context["run_id"], size, self.lease_ms, run_state(context))
        self.lineage_result = result
        for gone in result.get("released", ()):
            self.log.warning(
                "txid %s was held by run %s, which is %s: released, adopted by this run",
                gone["txid"], gone["owner"], gone["state"],
            )  # fmt: skip
        record(rt, context, result["txid"], "coordinate", done=True)
        report_figures(rt)
        self.log.info(
            "run %s -> txid %s (%s)", context["run_id"], result["txid"], result["binding"]
        )
        return result


class EmitOperator(TridentflowTask, SparkSubmitOperator):
    """spark-submit of spark_jobs/emit_batch.py for the run's txid. The run's lease is renewed
    for the DAG's ``lease``; a failure ends the task with the job's one-line cause (a Python
    exception in a Spark task included) instead of spark-submit's exit code."""

    ui_color = "#fff4e5"
    lineage_step = "emit"
    operator_extra_links = (TridentflowRunLink(),)

    def __init__(
        self,
        *,
        pipeline: str,
        conn_id: str = "spark_default",
        conf: dict[str, Any] | None = None,
        lease: timedelta = timedelta(minutes=30),
        **kwargs: Any,
    ) -> None:
        spark_conf = {
            "spark.ui.enabled": "false",
            "spark.driver.extraJavaOptions": quiet_java_options(),
            **(conf or {}),
        }
        lease_ms = int(lease.total_seconds() * 1000) or DEFAULT_LEASE_MS
        super().__init__(
            pipeline=pipeline,
            lease=lease,
            application=str(EMIT_APPLICATION),
            application_args=[
                "--pipeline",
                pipeline,
                "--run-id",
                "{{ run_id }}",
                "--lease-ms",
                str(lease_ms),
            ],
            conn_id=conn_id,
            conf=spark_conf,
            name=f"tridentflow-emit-{pipeline}",
            **kwargs,
        )

    def emit_env(self) -> dict[str, str]:
        """Environment of the spark-submit process (keeps the Redis URL off the argv)."""
        env = {
            "TRIDENTFLOW_REDIS_URL": TridentflowRedisHook(self.redis_conn_id).get_url(),
            "TRIDENTFLOW_HOME": str(resolve_home(self.home)),
        }
        env.update({k: os.environ[k] for k in FORWARDED_ENV if k in os.environ})
        # tridentflow's settings as this worker resolved them (Airflow's [tridentflow] too):
        # the job imports no Airflow, it reads the variables
        for setting in SETTINGS:
            value = explicit_setting(setting.env)
            if value is not None and not setting.sensitive:
                env[setting.env] = value
        kafka = kafka_config()
        if kafka is not None:  # a KafkaSource without brokers of its own reads these
            env["TRIDENTFLOW_KAFKA_CONFIG"] = json.dumps(kafka)
        # executors run the worker's interpreter (its packages: redis, tridentflow) by default
        env.setdefault("PYSPARK_PYTHON", sys.executable)
        return env

    def execute(self, context: Any) -> dict[str, Any] | None:
        with fail_fast():
            return self._emit(context)

    def _emit(self, context: Any) -> dict[str, Any] | None:
        check_spark_connection(self._conn_id)
        rt = self.runtime()
        txid, plan = emit_plan(rt, context["run_id"], self.lease_ms)
        record(rt, context, txid, "emit", done=False)
        if plan == "work" and wait_emit_turn(rt, txid, run_state(context)):
            txid, plan = emit_plan(rt, context["run_id"], self.lease_ms)  # it may be empty now
        try:
            self.lineage_result = self.emit_txid(context, rt, txid, plan)
            return self.lineage_result
        finally:  # a failed try's time counts too, as in Airflow's tries
            record(rt, context, txid, "emit", done=True)

    def emit_txid(self, context: Any, rt: Runtime, txid: int, plan: str) -> dict[str, Any] | None:
        if plan != "work":  # committed, empty or small (local_emit_limit): no Spark job
            staged = None if plan == "committed" else emit_run(rt, context["run_id"], LocalEngine())
            result = emit_summary(rt, txid, staged)
            why = f"small: at most {local_emit_limit()} records" if plan == "small" else plan
            self.log.info("emit of txid %s without Spark (%s): %s", txid, why, result)
            return result
        remote = spark_connect_url(self._conn_id)
        if remote is not None:
            return self.execute_over_connect(context, remote)
        with tempfile.TemporaryDirectory(prefix="tridentflow-emit-") as scratch:
            error_file = Path(scratch) / "error"
            self.conf = lineage_parent_conf(self.conf, context)
            self.env_vars = {
                **self.emit_env(),
                **(self.env_vars or {}),
                "TRIDENTFLOW_ERROR_FILE": str(error_file),
            }
            self.py_files = shipped_py_files(self.py_files, self.pipeline, Path(scratch))
            try:
                super().execute(context)
            except Exception as exc:
                cause, retry_helps = read_emit_error(error_file)
                if not cause:
                    raise
                self.log.error("emit failed: %s", cause)
                failure = EmitFailedError(cause)
                failure.retry_helps = retry_helps
                raise failure from exc
        return staged_summary(rt, txid)

    def execute_over_connect(self, context: Any, remote: str) -> dict[str, Any]:
        """The emit as a client of the Spark Connect server at ``remote``, in this task's
        process: no spark-submit, no JVM here; the server's executors run the read tasks (the
        pipeline's module shipped to them as an artifact when it lives outside the installed
        packages)."""
        try:
            with tempfile.TemporaryDirectory(prefix="tridentflow-emit-") as scratch:
                code = shippable(self.pipeline)
                ship = [code.archive(Path(scratch))] if code is not None else []
                result = emit_run_remote(
                    self.runtime(), context["run_id"], remote, self.lease_ms, ship
                )
        except Exception as exc:
            self.log.error("emit failed: %s", one_line(exc))
            failure = EmitFailedError(one_line(exc))
            failure.retry_helps = getattr(exc, "retry_helps", True)
            raise failure from exc
        self.log.info("emit over Spark Connect: %s", result)
        return result


def shipped_py_files(py_files: str | None, pipeline: str, scratch: Path) -> str | None:
    """``py_files`` (spark-submit's ``--py-files``) with the pipeline's module added when it
    lives outside the installed packages (the dags folder, say: tridentflow.user_code), so
    the emit's driver and executors import it as this worker does."""
    code = shippable(pipeline)
    if code is None:
        return py_files
    return ",".join(f for f in (py_files, str(code.archive(scratch))) if f)


def read_emit_error(path: Path) -> tuple[str, bool]:
    """What the emit job reported (spark_jobs/emit_batch.report_error): its line and whether
    a retry may help; ("", True) if it reported nothing."""
    try:
        raw = path.read_text().strip()
    except FileNotFoundError:
        return "", True
    try:
        reported = json.loads(raw)
        return str(reported["line"]), bool(reported.get("retry_helps", True))
    except (ValueError, KeyError, TypeError):
        return raw, True


def staged_summary(rt: Runtime, txid: int) -> dict[str, Any] | None:
    """What the spark-submit emit staged, read back from the ledger (the job runs in another
    process): what the lineage of its completion reports - its ranges and records."""
    try:
        attempt = rt.ledger.staged_attempt(txid)
        if attempt is None:
            return None
        manifest = rt.staging_of(txid, attempt).manifest(txid, attempt)
    except Exception as exc:  # the emit succeeded: a summary never fails it
        log.warning("tridentflow: no summary of the staged emit: %s", one_line(exc))
        return None
    return {
        "pipeline": rt.pipeline.name,
        "txid": txid,
        "status": "staged",
        "attempt": attempt,
        "records": sum(int(c[0]) for c in manifest.get("counts", {}).values()),
        "ranges": manifest.get("ranges", {}),
        "skipped": manifest.get("skipped", []),
    }


def lineage_parent_conf(conf: dict[str, Any] | None, context: Any) -> dict[str, Any]:
    """``conf`` with the Spark properties that make the emit's Spark application a child of
    this task in OpenLineage (``spark.openlineage.parentRunId``, ``parentJobName``, ...: what
    OpenLineage's Spark listener reads), when Airflow's OpenLineage provider is installed;
    properties already set are kept. Without the provider, or if it cannot tell (lineage
    never fails an emit): ``conf`` unchanged."""
    try:
        from airflow.providers.openlineage.utils.spark import (
            inject_parent_job_information_into_spark_properties,
        )

        return inject_parent_job_information_into_spark_properties(dict(conf or {}), context)
    except ImportError:
        return dict(conf or {})
    except Exception as exc:
        log.warning("tridentflow: no OpenLineage parent for the Spark job: %s", one_line(exc))
        return dict(conf or {})


def spark_connect_url(conn_id: str) -> str | None:
    """The sc:// URL of a connection of type ``spark_connect`` (the provider's
    SparkConnectHook builds it); None for any other type."""
    from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook
    from airflow.sdk import BaseHook

    if BaseHook.get_connection(conn_id).conn_type != SparkConnectHook.conn_type:
        return None
    return SparkConnectHook(conn_id).get_connection_url()


class CommitOperator(TridentflowTask, BaseOperator):
    """Applies the run's staged batch to the states, in txid order (checked in Redis). When it
    really committed (not ``already-committed``), it emits an Asset event for every state of
    the pipeline through its AssetAlias outlet (tridentflow_airflow.assets)."""

    ui_color = "#e6f4ea"
    lineage_step = "commit"
    operator_extra_links = (TridentflowRunLink(),)

    def __init__(self, **kwargs: Any) -> None:
        # Airflow's operator metaclass wraps the __init__ a concrete operator class defines
        # (default_args); the mixin's own __init__ is not wrapped, so every operator keeps one.
        super().__init__(**kwargs)

    def execute(self, context: Any) -> dict[str, Any]:
        with fail_fast():
            return self._commit(context)

    def _commit(self, context: Any) -> dict[str, Any]:
        rt = self.runtime()
        txid = owned_txid(rt, context["run_id"], self.lease_ms)
        record(rt, context, txid, "commit", done=False)
        try:
            result = commit_run(
                rt, context["run_id"], self.lease_ms, run_state(context), turn_wait=TURN_WAIT_S
            )  # parallel runs (a backfill) take turns
        finally:  # a failed try's time counts too, as in Airflow's tries
            record(rt, context, txid, "commit", done=True)
        self.log.info("commit of txid %s: %s", result["txid"], result["status"])
        self.lineage_result = result
        report_figures(rt)
        if any(isinstance(o, AssetAlias) for o in self.outlets or ()):
            emitted = emit_commit_events(
                context["outlet_events"],
                rt.pipeline.name,
                sorted(rt.pipeline.states),
                self.redis_conn_id,
                result,
            )
            self.log.info("asset events: %d", emitted)
        return result


class ExportOperator(TridentflowTask, BaseOperator):
    """Brings every sink of the pipeline up to the run's txid, txid by txid
    (tridentflow.steps.export): after ``commit``, retried on its own, so a sink outage is a red
    square here while the pipeline's commits go on; the next run's export catches up. A
    PostgresSink without a DSN of its own uses its Airflow connection (``postgres_default``)."""

    ui_color = "#fef7e0"
    lineage_step = "export"
    operator_extra_links = (TridentflowRunLink(),)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)

    def execute(self, context: Any) -> dict[str, Any]:
        with fail_fast():
            return self._export(context)

    def _export(self, context: Any) -> dict[str, Any]:
        from tridentflow.steps.export import export

        rt = self.runtime()
        txid = rt.ledger.txid_of_run(context["run_id"])
        results = export(rt, upto=txid)
        for r in results:
            self.log.info(
                "sink %s: at txid %s (applied %s, %s rows%s)",
                r.sink,
                r.position,
                list(r.applied),
                r.rows,
                f", reloaded as of txid {r.reloaded_at}" if r.reloaded_at is not None else "",
            )
        report_figures(rt)
        self.lineage_result = {"txid": txid, "sinks": [r.to_json() for r in results]}
        return self.lineage_result
