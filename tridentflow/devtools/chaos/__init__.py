"""The chaos harness: random fault schedules, resume, audit.

Each schedule (fully determined by its seed) picks a bundled pipeline, feeds its source, and
drives orchestrator-style runs (tridentflow.steps.runs: one run id per txid, retried like Airflow
retries a task) through a random mix of:

* a fault at every point - ``raise`` (the step fails) or ``crash`` (nothing after the point
  runs, as with SIGKILL) - on first or second attempts;
* partition outages (``dark``) over txid ranges; for a transactional source, which must wait,
  the outage is repaired after a few failed emits;
* concurrent duplicate commit attempts (a zombie and its retry race; fencing lets one land);
* Redis restarts (SIGKILL of the server, AOF with ``appendfsync always``) between steps;
* source appends between the steps of a batch, with undecodable records among them (not
  JSON, a lone surrogate, the wrong arity: quarantined, never counted);
* real partition outages: a partition's directory moved aside (a dropped mount) or its HEAD
  torn, for a few steps; appends meanwhile go to the readable partitions;
* an operator's ``reset --source`` while a run is in flight: the run's next step must be
  refused (GenerationError), and only what is produced afterwards may be counted;
* runs that give up (their txid is released and adopted by the next run);
* an operator's rewind while a run is in flight (undo logs are kept in every schedule): to a
  retained txid, half the time killed part-way (``mid-rewind``) and run again; the run's
  next step must be refused, in its own process and in a new one, and the replay must count
  every record once;
* for the Redis Streams pipelines (``STREAM_PIPELINES``), the external mutations other
  clients make: XDEL of entries already read (the last one too), trims of what was read, and
  entries removed before they were read (XDEL, XTRIM MAXLEN), a stream deleted or deleted
  and recreated, bytes that are not UTF-8. The first kind must go on counting; for the
  others the operator sees the reason in ``status``, resets the reader, and from then on
  exactly what the streams hold must be counted;
* state shards: a schedule's states are split into 1, 2 or 3 shards (fenced per shard);
* an operator's ``reshard`` to another count (once at most, mostly between a batch's emit and
  its commit), half the time killed at one of its fault points (``mid-reshard``) and run
  again: a commit meanwhile must be refused (ReshardUnderWayError), a commit by the process that
  read the old layout too, and the batch staged before it commits in the new layout;
* staging: a schedule's emits stage in files or in Redis (blocks next to each shard), drawn
  from its seed; every step of the schedule stages the same way;
* against a gated Redis Cluster with replicas (``cluster=``, tridentflow.devtools.devcluster):
  failovers with replication lag - a master's replication is held (the ledger's or a state
  shard's), the run goes on with ``--wait-replicas 1``, and a few steps later that master is
  killed while its replica is behind, the replica takes over and the old master rejoins.

* sinks in every schedule: each state's new-values stream (keys mapped to their canonical
  encoding) goes to Redis streams (1, 2 or 3 of them per sink, ``sink_parts``) and, given a
  PostgreSQL (``postgres_dsn``), to a table; exports run after commits and between steps,
  with faults inside them (``mid-export``: raise, crash), errors of no tridentflow type
  raised inside a sink (``KeyError``, ``OverflowError``, a driver's ...) and exporters dying
  between a sink's streams, two exporters at once, the PostgreSQL session killed
  mid-transaction (``pg_terminate_backend``) - or, on a server of its own (``postgres=``),
  the server crashed and restarted right there - and an operator's ``export --resync``.
  Every failure of an export must come out as the sink's one ``SinkError`` line (anything
  else is the schedule's difference); a rewind below what any stream holds must be refused.
  After the drain every table equals the state row for row, and the streams' last entry per
  key is the state's value, with no change twice.

* for the Kafka pipelines (``KAFKA_PIPELINES``, given a broker: tridentflow.devtools.devkafka), the
  broker frozen (SIGSTOP) between steps or while an emit reads, for a few steps: an opaque
  txid skips its partitions, a transactional one fails its emit until the broker is back;
  records produced meanwhile are sent once it is (a producer's retries); transactions'
  commit markers between records (offsets that hold none), and undecodable records.

The pipelines include ``mutating`` and ``mutating-opaque`` (every aggregator kind mutating its
arguments; typed keys where ``0.0``/``-0.0`` and ``1``/``1.0``/``true`` differ).

Then it drains the source without faults, as ``schedule="on-data"`` would (the family "an
orchestrator merging, doubling and delaying events"): a run starts only when the asset
watcher's question (tridentflow.steps.watch) fires; fires while a run is queued merge into it,
some come twice, queued runs start late, and every run of the faulty phase has finished
(their txids, held under live leases, are released and adopted). Then it checks two things:
the audit (state vs the source up to the committed offsets) and the exact expected counts of
every record produced.
The harness owns its redis-server (a free port) and a scratch directory.
"""

from tridentflow.devtools.chaos.checks import staging_left
from tridentflow.devtools.chaos.config import (
    KAFKA_PIPELINES,
    PIPELINES,
    STREAM_PIPELINES,
    WORDS,
    RedisServer,
    ScheduleResult,
)
from tridentflow.devtools.chaos.draws import schedule_shards, schedule_staging
from tridentflow.devtools.chaos.drive import Chaos, run_chaos

__all__ = [
    "KAFKA_PIPELINES",
    "PIPELINES",
    "STREAM_PIPELINES",
    "WORDS",
    "Chaos",
    "RedisServer",
    "ScheduleResult",
    "run_chaos",
    "schedule_shards",
    "schedule_staging",
    "staging_left",
]
