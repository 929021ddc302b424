"""The Spark engine: the record stage and the batch-operation graph, on classic Spark (a
master, spark-submit) and over Spark Connect (which has no RDDs).

Every source range is split into read tasks (``tasks.split_ranges``); each task reads its
range through the source's log and runs ``read_task``: per-record plan, quarantine of bad
records, the Combiner's partial aggregation within the task, and the tuples that batch
operations consume. Only those task outputs are cached; the driver collects the record counts
(Trident's completeness check) and the bad records.

A plan whose states are all fed straight by the source (no batch operations: the word count,
most counters) takes the direct path: one job whose read tasks return their partials, which
the driver combines per key in task order - what the exchange would stage, without its
shuffle and its further jobs. Over Connect its tasks run in a ``mapInArrow``; on classic Spark
they are a plain ``parallelize(tasks).map`` (a fresh spark-submit JVM would otherwise pay
Spark SQL's first-query warm-up, several seconds, for nothing).

Otherwise the graph (``graph``) runs: on classic Spark on RDDs (``rdds``: no Spark SQL
planning, no Arrow runner to warm up in a fresh JVM; ``TRIDENTFLOW_SPARK_GRAPH=frames`` picks
the DataFrames instead), over Connect on DataFrames (``frames.FrameBackend``: every
operation's Python function over Arrow batches of pickled tuple chunks). Either way every
exchange is a Spark shuffle with Trident's count reports and a deterministic order.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import pickle
import re
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tridentflow.engines import rdds
from tridentflow.engines.base import (
    COLLECT_KEYS,
    ComputeResult,
    ExecContext,
    PartitionCount,
    Ranges,
)
from tridentflow.engines.batchops import StageByKey
from tridentflow.engines.blocks import write_state_blocks
from tridentflow.engines.columnar import columnar_input, read_columns
from tridentflow.engines.dataframes import DataFrameBackend
from tridentflow.engines.frames import (
    Frame,
    FrameBackend,
    chunk_rows,
    items_of,
    materialized,
    to_batch,
)
from tridentflow.engines.graph import GraphBuilder
from tridentflow.engines.local import LocalEngine
from tridentflow.engines.tasks import (
    ReadTask,
    TaskOutput,
    build_states,
    merge_counts,
    read_task,
    split_ranges,
    task_records,
)
from tridentflow.errors import TridentflowError, one_line
from tridentflow.plan import BadRecord, Plan
from tridentflow.settings import env_int, env_seconds, raw_setting
from tridentflow_state.staged import BlockRef, BlockSpace, WrittenBlocks

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class SparkEngine:
    """Runs a plan on a SparkSession: classic (a master, or under spark-submit) or a Spark
    Connect client session (``spark_session(remote=...)``): the same DataFrame jobs."""

    name = "spark"

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        self.remote = is_connect(spark)

    def compute(
        self, plan: Plan, log_root: str, ranges: Ranges, ctx: ExecContext | None = None
    ) -> ComputeResult:
        """The batch's ComputeResult. Over Connect, bounded: a server that stops answering
        fails it once the retry budget is spent, and a job still running after the job
        deadline is interrupted - each one line naming the endpoint."""
        if not self.remote:
            return self._compute(plan, log_root, ranges, ctx)
        _handshake, retry_s, job_s = connect_deadlines()
        endpoint = getattr(self.spark, "_tridentflow_endpoint", "the Spark Connect server")
        expired, done = threading.Event(), threading.Event()

        def watchdog() -> None:  # past the deadline, interrupt until the call returns (an
            if done.wait(job_s):  # interrupt sent before the job reached the server is moot)
                return
            expired.set()
            while not done.is_set():
                with contextlib.suppress(Exception):
                    self.spark.interruptAll()
                done.wait(0.5)

        too_late = TridentflowError(
            f"Spark Connect at {endpoint}: the job did not finish within {job_s:.0f}s "
            f"({JOB_ENV}) and was interrupted"
        )
        threading.Thread(target=watchdog, daemon=True, name="tf-connect-deadline").start()
        try:
            result = self._compute(plan, log_root, ranges, ctx)
            if expired.is_set():  # it finished, but past its deadline: not used
                raise too_late
            return result
        except TridentflowError:
            raise
        except Exception as exc:
            if expired.is_set():
                raise too_late from None
            if lost_server(exc):
                raise TridentflowError(
                    f"Spark Connect at {endpoint} stopped answering during the job (retried "
                    f"for up to {retry_s:.0f}s, {RETRY_ENV}): {grpc_summary(exc)}"
                ) from None
            raise
        finally:
            done.set()

    def _compute(
        self, plan: Plan, log_root: str, ranges: Ranges, ctx: ExecContext | None = None
    ) -> ComputeResult:
        ctx = ctx or ExecContext(0, "")
        tasks = split_ranges(ranges, task_records(plan), ctx.position_base)
        if not tasks:  # nothing to read: no source partitions, nothing for executors
            return LocalEngine().compute(plan, log_root, ranges, ctx)
        records = sum(end - start for start, end in ranges.values())
        # staging in Redis, a big batch's executors stage it: no direct attempt (it would
        # read the batch once more when its partials outgrow what the driver should hold)
        big = ctx.blocks is not None and records > env_int(
            DRIVER_STAGING_ENV, EXECUTOR_STAGING_KEYS
        )
        if not plan.edges and not ctx.lose_tuple and not big:  # lose-tuple: in an exchange
            limit = DIRECT_PAIRS if ctx.blocks is None else EXECUTOR_STAGING_KEYS
            direct = self._compute_direct(plan, log_root, ranges, tasks, limit)
            if direct is not None:
                return direct
        if not self.remote and graph_api() == "rdd" and not plan.frames:
            return rdds.compute_graph(self.spark.sparkContext, plan, log_root, ranges, ctx, tasks)
        backend = DataFrameBackend(self.spark, ctx.lose_tuple)  # DataFrame steps: Spark's own
        with planned_as_written(self.spark, len(tasks)):
            return self._compute_graph(plan, log_root, ranges, ctx, tasks, backend)

    def _compute_graph(
        self,
        plan: Plan,
        log_root: str,
        ranges: Ranges,
        ctx: ExecContext,
        tasks: list[ReadTask],
        backend: FrameBackend,
    ) -> ComputeResult:
        columns = None
        if isinstance(backend, DataFrameBackend) and not ctx.lose_tuple:
            columns = columnar_input(plan)
        try:
            read = None
            if columns is not None:  # files, read in columns by Spark (engines.columnar)
                read = read_columns(self.spark, plan, log_root, ranges, columns)
            if read is not None:
                counts, bad = read.counts, read.bad
                edges = [Frame(None, read.groups, typed=read.typed)]
                task_partials: list[Frame] = []
            else:
                counts, bad, edges, task_partials = self._read_tasks(
                    plan, log_root, ranges, tasks, backend
                )
            builder = GraphBuilder(plan, backend, edges, ctx)
            datasets = build_states(plan, builder, task_partials)
            if ctx.blocks is not None:
                streams = _stage_on_executors(datasets, ctx)
            else:
                streams = self._collect(backend, datasets)
            reports = backend.reports()
        finally:
            backend.release()
        bad.sort(key=lambda b: (b.partition, b.offset))
        return ComputeResult(counts, streams, bad, reports)

    def _read_tasks(
        self,
        plan: Plan,
        log_root: str,
        ranges: Ranges,
        tasks: list[ReadTask],
        backend: FrameBackend,
    ) -> tuple[dict[int, PartitionCount], list[BadRecord], list[Frame], list[Frame]]:
        """The record stage's read tasks, cached: (counts, bad records, every edge's tuples,
        every fast-path state's partials)."""
        # the read tasks need the record stage only: not the steps' code (a DataFrame step's
        # function runs on the driver, and may hold what does not pickle)
        shipped = replace(plan, graph_persists=(), stage_names={}) if plan.frames else plan
        outputs = backend.cache(
            self.spark.range(0, len(tasks), 1, len(tasks)).mapInArrow(
                functools.partial(_read_tasks_frames, log_root, shipped, tasks), TASK_SCHEMA
            )
        )
        summaries = [pickle.loads(r["data"]) for r in outputs.where("kind = 0").collect()]
        counts = merge_counts(ranges, ((p, count) for p, count, _bad in summaries))
        bad = [b for _p, _count, task_bad in summaries for b in task_bad]
        n = len(tasks)
        edges = [_output(outputs, 1, e, n) for e in range(len(plan.edges))]
        task_partials = [_output(outputs, 2, i, n) for i in range(len(plan.persists))]
        return counts, bad, edges, task_partials

    def _collect(self, backend: FrameBackend, datasets: dict[str, Frame]) -> dict[str, Any]:
        """Every state's (key, staged value) pairs: one job materialises them all (tagged by
        state) and counts them; small ones are collected in one more, a big one is read
        partition by partition (toLocalIterator). (Staging in Redis, the executors write
        them instead: ``_stage_on_executors``.)"""
        from pyspark.sql import functions as F

        tagged = backend.cache(
            functools.reduce(
                lambda a, b: a.unionAll(b),
                (
                    materialized(frame).df.select(F.lit(i).alias("state"), "n", "data")
                    for i, frame in enumerate(datasets.values())
                ),
            )
        )
        sizes = {
            r["state"]: r["keys"]
            for r in tagged.groupBy("state").agg(F.sum("n").alias("keys")).collect()
        }
        names = list(datasets)
        if sum(sizes.values()) <= COLLECT_KEYS:
            chunks: dict[int, list] = {i: [] for i in range(len(names))}
            for row in tagged.where("n > 0").collect():
                chunks[row["state"]].append(row)
            return {name: list(items_of(chunks[i])) for i, name in enumerate(names)}
        streams: dict[str, Any] = {}
        for i, name in enumerate(names):
            selected = tagged.where(f"state = {i} and n > 0")
            if sizes.get(i, 0) <= COLLECT_KEYS:
                streams[name] = list(items_of(selected.collect()))
            else:
                streams[name] = list(items_of(selected.toLocalIterator()))
        return streams

    def _compute_direct(
        self, plan: Plan, log_root: str, ranges: Ranges, tasks: list[ReadTask], limit: int
    ) -> ComputeResult | None:
        """A plan whose states are all fed straight by the source, in one Spark job: the read
        tasks' partials go to the driver, which combines them per key in task order - the
        exchange path's sender order, so every value is the one it would stage. None (use
        the exchange path) if the tasks make more than ``limit`` partials in all
        (DIRECT_PAIRS; staging in Redis, EXECUTOR_STAGING_KEYS: the executors stage more)."""
        cap = limit // len(tasks)
        if self.remote:
            results = self._direct_results_arrow(plan, log_root, tasks, cap)
        else:  # no Spark SQL: a one-shot spark-submit would pay its warm-up (~5 s here)
            results = (
                self.spark.sparkContext.parallelize(tasks, len(tasks))
                .map(functools.partial(_direct_task, log_root, plan, cap))
                .collect()
            )
        if any(partials is None for _p, _count, _bad, partials in results):
            return None
        counts = merge_counts(ranges, ((p, count) for p, count, _bad, _partials in results))
        bad = sorted(
            (b for _p, _count, task_bad, _partials in results for b in task_bad),
            key=lambda b: (b.partition, b.offset),
        )
        states = {  # the exchange path's per-key staging, over the tasks in sender order
            pp.state.name: StageByKey(pp.aggregator)(
                0, (pair for *_head, partials in results for pair in partials[index])
            )
            for index, pp in enumerate(plan.persists)
        }
        return ComputeResult(counts, states, bad, [])

    def _direct_results_arrow(
        self, plan: Plan, log_root: str, tasks: list[ReadTask], cap: int
    ) -> list[tuple]:
        """The read tasks' direct outputs through the DataFrame API (what Spark Connect
        has): ``range(n)`` in n partitions is one task index per Spark partition, each run
        by ``mapInArrow`` and returned pickled; in task order."""
        indexes = self.spark.range(0, len(tasks), 1, len(tasks))
        outputs = indexes.mapInArrow(
            functools.partial(_read_tasks_arrow, log_root, plan, cap, tasks),
            "task long, result binary",
        ).collect()
        return [pickle.loads(row["result"]) for row in sorted(outputs, key=lambda r: r["task"])]


GRAPH_ENV = "TRIDENTFLOW_SPARK_GRAPH"
"""How classic Spark runs a batch's graph: ``rdd`` (the default; ``tridentflow.engines.rdds``)
or ``frames`` (DataFrames, as over Spark Connect, which has no RDDs)."""


def graph_api() -> str:
    """``rdd`` or ``frames`` (GRAPH_ENV); anything else is refused in one line."""
    chosen = (raw_setting(GRAPH_ENV) or "rdd").strip().lower()
    if chosen not in ("rdd", "frames"):
        raise TridentflowError(f"{GRAPH_ENV}={chosen!r}: expected 'rdd' or 'frames'")
    return chosen


DIRECT_PAIRS = 2_000_000
"""At most this many (key, partial) pairs in all go from the read tasks straight to the driver
(about 100 bytes each there); a batch whose tasks make more takes the exchange path, and its
read tasks run again."""


def _direct_output(cap: int, out: TaskOutput) -> tuple[int, Any, list, list | None]:
    """A read task's result for the driver: its partials only if they make at most ``cap``
    pairs."""
    pairs = sum(len(p) for p in out.partials)
    partials = [list(p.items()) for p in out.partials] if pairs <= cap else None
    return out.partition, out.count, out.bad, partials


def _direct_task(
    log_root: str, plan: Plan, cap: int, task: ReadTask
) -> tuple[int, Any, list, list | None]:
    return _direct_output(cap, read_task(log_root, plan, *task))


def _read_tasks_arrow(
    log_root: str, plan: Plan, cap: int, tasks: list[ReadTask], batches: Iterator[Any]
) -> Iterator[Any]:
    """mapInArrow body: the direct output of each task whose index comes in, pickled."""
    import pyarrow as pa

    for batch in batches:
        for index in batch.column(0).to_pylist():
            out = _direct_output(cap, read_task(log_root, plan, *tasks[index]))
            yield pa.RecordBatch.from_pydict({"task": [index], "result": [pickle.dumps(out)]})


def lost_server(exc: BaseException) -> bool:
    """Whether ``exc`` says the Connect server could not be reached (not a failed task)."""
    if type(exc).__module__.startswith("grpc"):
        return True
    text = str(exc)
    if "PythonException" in text or "Traceback" in text:
        return False
    return any(mark in text for mark in ("RETRIES_EXCEEDED", "UNAVAILABLE", "DEADLINE_EXCEEDED"))


def is_connect(spark: Any) -> bool:
    """Whether ``spark`` is a Spark Connect client session."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


EXECUTOR_STAGING_KEYS = 200_000
"""Staging in Redis (``ExecContext.blocks``), a batch of more records than this skips the
direct path: its read tasks run once, in the exchange path, whose executors write every
state's blocks themselves (``_stage_on_executors``). A smaller batch takes the direct path
(at most this many partials to the driver, which stages them)."""

DRIVER_STAGING_ENV = "TRIDENTFLOW_DRIVER_STAGING_RECORDS"
"""Staging in Redis: the most records a batch may have for the driver to stage it (direct path);
bigger ones are staged by the executors (default EXECUTOR_STAGING_KEYS; 0: always them)."""


def _stage_on_executors(datasets: dict[str, Frame], ctx: ExecContext) -> dict[str, Any]:
    """Every state's (key, staged value) chunks written as blocks next to their state shards
    by the executors (``_write_blocks``), in one job whose result is the blocks' refs: the
    driver never holds a key."""
    from pyspark.sql import functions as F

    assert ctx.blocks is not None
    names = list(datasets)
    tagged = functools.reduce(
        lambda a, b: a.unionAll(b),
        (
            materialized(frame).df.where("n > 0").select(F.lit(i).alias("state"), "data")
            for i, frame in enumerate(datasets.values())
        ),
    )
    body = functools.partial(_write_blocks, ctx.redis_url, ctx.blocks, names)
    refs: dict[str, list[BlockRef]] = {name: [] for name in names}
    for row in tagged.mapInArrow(body, "state int, refs binary").collect():
        refs[names[row["state"]]] += [BlockRef.from_json(r) for r in pickle.loads(row["refs"])]
    return {name: WrittenBlocks(found) for name, found in refs.items()}


def _write_blocks(
    redis_url: str, space: BlockSpace, names: list[str], batches: Iterator[Any]
) -> Iterator[Any]:
    """mapInArrow body on an executor: the task's chunks of (key, staged value) pairs of each
    state as blocks (``write_state_blocks``); yields each state's refs, pickled."""
    import pyarrow as pa

    def pairs() -> Iterator[tuple[int, tuple[str, Any]]]:
        for batch in batches:
            states, chunks = batch.column(0).to_pylist(), batch.column(1).to_pylist()
            for index, data in zip(states, chunks, strict=True):
                for pair in pickle.loads(data):
                    yield index, pair

    for index, refs in write_state_blocks(redis_url, space, names, pairs()):
        payload = pickle.dumps([ref.to_json() for ref in refs])
        state = pa.array([index], pa.int32())
        yield pa.RecordBatch.from_pydict({"state": state, "refs": [payload]})


TASK_SCHEMA = "kind int, idx int, part int, seq int, n int, data binary"
"""The read tasks' cached output: kind 0 a task's (partition, count, bad records); kind 1
edge ``idx``'s tuples, kind 2 fast-path state ``idx``'s partials, as chunks of logical
partition ``part`` (the task's index)."""


ADAPTIVE = "spark.sql.adaptive.enabled"
SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"


@contextlib.contextmanager
def planned_as_written(spark: Any, shuffle_partitions: int) -> Iterator[None]:
    """The session's queries without adaptive query execution until the block ends, and
    ``shuffle_partitions`` for the few aggregations that name no partition count (then both
    settings as they were). The graph's exchanges are explicit - ``repartition(n, route)``,
    one target per Spark partition - which AQE may not change and cannot improve; with it,
    every query stage runs as a job of its own (the 12-exchange test graph: 38 jobs, 155
    stages, 658 tasks a batch; without: 4, 53, 267: benchmarks.batch_operations)."""
    wanted = {ADAPTIVE: "false", SHUFFLE_PARTITIONS: str(shuffle_partitions)}
    before = {key: spark.conf.get(key, None) for key in wanted}
    for key, value in wanted.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


def _read_tasks_frames(
    log_root: str, plan: Plan, tasks: list[ReadTask], batches: Iterator[Any]
) -> Iterator[Any]:
    """mapInArrow body: each task whose index comes in, as TASK_SCHEMA rows."""
    names = ("kind", "idx", "part", "seq", "n", "data")
    for batch in batches:
        for index in batch.column(0).to_pylist():
            out = read_task(log_root, plan, *tasks[index])
            summary = pickle.dumps((out.partition, out.count, out.bad))
            rows = [(0, 0, index, 0, 0, summary)]
            for kind, outputs in ((1, out.edges), (2, [list(p.items()) for p in out.partials])):
                for idx, items in enumerate(outputs):
                    rows.extend((kind, idx, *chunk) for chunk in chunk_rows(index, items))
            yield to_batch(rows, names)


def _output(outputs: Any, kind: int, idx: int, tasks: int) -> Frame:
    selected = outputs.where(f"kind = {kind} and idx = {idx}").select("part", "seq", "n", "data")
    return Frame(selected, tasks)


LOG4J2 = Path(__file__).parent.parent / "log4j2.properties"


def quiet_java_options() -> str:
    return f"-Dlog4j2.configurationFile=file:{LOG4J2}"


CONNECT_PORT = 15002
CONNECT_TIMEOUT = 10.0

HANDSHAKE_ENV = "TRIDENTFLOW_CONNECT_TIMEOUT_S"
"""Seconds a Spark Connect server has to answer the first call (default 10)."""
RETRY_ENV = "TRIDENTFLOW_CONNECT_RETRY_S"
"""Seconds a call keeps retrying a server that stopped answering (default 30; the client's
own policy retries for 10 minutes and more)."""
JOB_ENV = "TRIDENTFLOW_SPARK_JOB_TIMEOUT_S"
"""Seconds one emit's Spark job may run over Connect before it is interrupted (default 3600)."""


def connect_deadlines() -> tuple[float, float, float]:
    """(handshake, retry budget, job) in seconds, from the environment (see above)."""
    return (
        env_seconds(HANDSHAKE_ENV, CONNECT_TIMEOUT),
        env_seconds(RETRY_ENV, 30.0),
        env_seconds(JOB_ENV, 3600.0),
    )


def _bound_client(session: SparkSession, call_s: float, retry_s: float) -> bool:
    """Give a Connect client bounded calls: every RPC but a job's execution stream has a
    deadline of ``call_s``, and a server that stops answering is retried for about
    ``retry_s`` seconds in all (backoff 0.2, 0.4, ... 5 s), not the client's 10+ minutes.

    Per-call deadlines need pyspark >= 4.3 (``RpcDeadlines``); an older client gets the retry
    budget only, and False: its caller bounds the handshake itself (``_round_trip``)."""
    from pyspark.sql.connect.client.retries import DefaultPolicy

    waits, total = 0, 0.0
    while True:
        step = min(0.2 * 2**waits, 5.0)
        if total + step > retry_s:
            break
        total, waits = total + step, waits + 1
    settings = {
        "max_retries": waits,
        "initial_backoff": 200,
        "backoff_multiplier": 2.0,
        "max_backoff": 5000,
        "jitter": 100,
        "max_server_retry_delay": int(retry_s * 1000),  # pyspark >= 4.1
    }
    accepted = inspect.signature(DefaultPolicy.__init__).parameters
    session.client.set_retry_policies(
        [DefaultPolicy(**{k: v for k, v in settings.items() if k in accepted})]
    )
    try:
        from pyspark.sql.connect.client.core import RpcDeadlines
    except ImportError:  # pyspark 4.0 - 4.2
        return False
    quick = max(call_s, 1.0)
    session.client._rpc_deadlines = RpcDeadlines(  # tests/test_connect_deadlines.py checks
        reattachable_execute_plan=600.0,
        reattach_execute=600.0,
        analyze_plan=quick,
        add_artifacts=max(quick, 300.0),
        config=quick,
        interrupt=quick,
        release_session=quick,
        artifact_status=quick,
        clone_session=quick,
        get_status=quick,
        fetch_error_details=quick,
    )
    return True


def _round_trip(session: SparkSession, timeout: float, bounded: bool) -> None:
    """Ask the server its version; an unbounded client (pyspark < 4.3) waits in a daemon
    thread, so that a port that accepts and never answers fails within ``timeout``."""
    if bounded:
        session.version  # noqa: B018
        return
    outcome: list[BaseException | None] = []

    def ask() -> None:
        try:
            session.version  # noqa: B018
            outcome.append(None)
        except BaseException as exc:  # handed to the caller's thread
            outcome.append(exc)

    asking = threading.Thread(target=ask, name="tridentflow-connect-handshake", daemon=True)
    asking.start()
    asking.join(timeout)
    if not outcome:
        raise TridentflowError("DEADLINE_EXCEEDED: no answer to the handshake")
    if outcome[0] is not None:
        raise outcome[0]


class _SessionClosed(Exception):
    pass


def _connect(url: str, app_name: str) -> SparkSession:
    """A Connect client session with bounded calls (``_bound_client``), checked with one round
    trip (the server's version) within the handshake deadline. With a ``session_id`` in
    ``url``, a new client of exactly that session (not this process's default session).
    ``app_name`` is the server's to choose (a Connect session has no name of its own)."""
    from pyspark.sql import SparkSession

    handshake, retry_s, _job = connect_deadlines()
    shown = url.split("/;", 1)[0]
    # the client warns before it raises; the error we raise says it in one line
    warnings.filterwarnings("ignore", message=r"\[RETRIES_EXCEEDED\]", category=UserWarning)
    session = None
    try:
        session = SparkSession.builder.remote(url).create()  # create() itself makes no call
        bounded = _bound_client(session, handshake, min(retry_s, handshake))
        _round_trip(session, handshake, bounded)
        _bound_client(session, max(handshake, 60.0), retry_s)
        session._tridentflow_endpoint = shown  # type: ignore[attr-defined]
        return session
    except Exception as exc:  # grpc's errors are many screens long
        if session is not None:  # forget it now: at exit its client would retry the release
            session.release_session_on_close = False
            with contextlib.suppress(Exception):
                session.stop()
        if "SESSION_CLOSED" in str(exc):
            raise _SessionClosed from None
        raise TridentflowError(
            f"cannot reach Spark Connect at {shown} within {handshake:.0f}s "
            f"({HANDSHAKE_ENV}): {grpc_summary(exc)}"
        ) from None


def silence_driver_logs() -> None:
    """Turn this process's Spark driver logging off, if it runs one: after tridentflow's one-line
    error, the JVM's shutdown (executors' late status updates racing the stop, "Could not find
    CoarseGrainedScheduler") would follow it with screens of trace the user has no use for.
    Imports nothing a command that never started Spark did not import."""
    if "pyspark" not in sys.modules:
        return
    from pyspark import SparkContext

    context = SparkContext._active_spark_context
    if context is not None:
        with contextlib.suppress(Exception):
            context.setLogLevel("OFF")


def grpc_summary(exc: BaseException) -> str:
    """A Connect client error in a few words: its gRPC status and details, when it has them."""
    text = str(exc)
    code = re.search(r"status = StatusCode\.(\w+)", text)
    details = re.search(r'details = "([^"]*)"', text)
    if code:
        return f"{code.group(1)}" + (f": {details.group(1)}" if details else "")
    return one_line(exc)


def check_connect_url(remote: str, timeout: float = CONNECT_TIMEOUT) -> None:
    """Fail in one line, within ``timeout`` seconds, unless ``remote`` is an sc:// URL whose
    host and port accept a TCP connection (the Connect client itself retries for minutes)."""
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(remote)
    try:
        host, port = parts.hostname, parts.port or CONNECT_PORT
    except ValueError:
        host = None
    if parts.scheme != "sc" or not host:
        raise TridentflowError(f"not a Spark Connect URL: {remote!r} (expected sc://HOST:PORT)")
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise TridentflowError(
            f"cannot reach Spark Connect at {remote}: {reason} (is it running? `tridentflow"
            " spark-connect` starts a local one)"
        ) from None


SESSION_WINDOW_S = 1200
"""Clients that share a session key use one server-side session per this many seconds."""


def shared_session_url(remote: str, key: str, now: float | None = None) -> str:
    """``remote`` with the ``session_id`` every client sharing ``key`` uses in the current
    SESSION_WINDOW_S window (a deterministic UUID), unless it names a session already.

    A Connect server starts Python workers per session, so each new session pays their start
    and imports (about 2.5 s of a 100k-record emit here); clients that attach to one session,
    one task process after another, find them warm. The window moves on well before the
    server's idle timeout (60 min by default) closes a session, so a closed session's id is
    never asked for again (``spark_session`` falls back to a fresh one if it is)."""
    if "session_id=" in remote:
        return remote
    window = int((time.time() if now is None else now) // SESSION_WINDOW_S)
    sid = uuid.uuid5(uuid.NAMESPACE_URL, f"tridentflow:{key}:{window}")
    if "/;" in remote:
        return f"{remote};session_id={sid}"
    return f"{remote.rstrip('/')}/;session_id={sid}"


def ship_python(spark: SparkSession, files: Iterable[Path]) -> None:
    """Make ``files`` (``.py`` modules, ``.zip`` packages: tridentflow.user_code) importable by
    the session's Python workers - a Spark Connect session's artifacts, or a classic session's
    ``addPyFile``. Idempotent for unchanged files. A module changed since a shared Connect
    session took it is refused in one line (its workers keep what they imported)."""
    for path in files:
        if not is_connect(spark):
            spark.sparkContext.addPyFile(str(path))
            continue
        try:
            spark.addArtifacts(str(path), pyfile=True)
        except Exception as exc:
            if "exist" not in str(exc).lower():
                raise
            raise TridentflowError(
                f"Spark Connect already has another {path.name} in this pipeline's session: "
                "the pipeline's code changed since; restart the Spark Connect server (or give "
                "the pipeline's new code a new module name) and clear the emit"
            ) from None


def spark_session(
    app_name: str = "tridentflow",
    master: str | None = None,
    remote: str | None = None,
    share: str | None = None,
) -> SparkSession:
    """A SparkSession configured for tridentflow (UI off, warnings-only logging). Python
    workers run this interpreter unless PYSPARK_PYTHON says otherwise (a venv's packages,
    redis among them, are then there even when the venv is not on PATH). ``remote``
    (sc://HOST:PORT) makes it a Spark Connect client instead: no JVM here; with ``share``
    (a key, e.g. the pipeline), it attaches to the session every client with that key uses
    (``shared_session_url``): do not ``stop()`` such a session, others attach to it."""
    if remote:
        check_connect_url(remote)
        if share is None:
            return _connect(remote, app_name)
        try:
            return _connect(shared_session_url(remote, share), app_name)
        except _SessionClosed:  # the server closed it (a short idle timeout): a fresh one
            return _connect(shared_session_url(remote, str(uuid.uuid4())), app_name)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if "PYSPARK_SUBMIT_ARGS" not in os.environ:  # in-process JVM: quiet its logging too
        os.environ["PYSPARK_SUBMIT_ARGS"] = (
            f'--driver-java-options "{quiet_java_options()}" pyspark-shell'
        )
    from pyspark import SparkConf
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    elif not SparkConf().contains("spark.master"):  # not under spark-submit
        builder = builder.master("local[*]")
    return (
        builder.config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )
