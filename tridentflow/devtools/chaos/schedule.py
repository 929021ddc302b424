"""One schedule's moving parts: its runtime, source appends, outages, stream mutations."""

from __future__ import annotations

import json
import logging
import random
import threading
from pathlib import Path

from tridentflow.devtools.chaos.config import (
    BAD_ENTRIES,
    BAD_KAFKA_VALUES,
    BAD_LINES,
    RETRIES_SPENT_CHANCE,
    WORDS,
    ScheduleResult,
)
from tridentflow.devtools.chaos.draws import lakehouse_schedule
from tridentflow.devtools.devkafka import LocalKafka
from tridentflow.errors import (
    IncompleteBatchError,
    SourceError,
)
from tridentflow.ops.reset import reset_pipeline
from tridentflow.sinks import RedisStreamSink
from tridentflow.sources.filelog import encode_record
from tridentflow.steps.runtime import Runtime
from tridentflow.steps.staging import RedisStagingArea


class Schedule:
    """What one schedule changes as it goes: its runtime (replaced after a reset), the lines
    produced since the last reset, and a real outage in progress."""

    def __init__(self, rng: random.Random, rt: Runtime, result: ScheduleResult, aside: Path):
        self.rng, self.rt, self.result, self.aside = rng, rt, result, aside
        self.rewound_at_event = 0
        """How many events there were at the last rewind (``torn_since_rewind``)."""
        self.produced: list[str] = []
        self.was_reset = False
        self.outage: tuple[str, int, bytes] | None = None
        self.lagging: tuple[int, int] | None = None
        """(master port, steps left) while a master's replication is held (gated clusters)."""
        self.sink_rng = random.Random(0)
        """The sinks' own generator (exports, their faults): the steps' draws stay as they
        were before sinks existed."""
        self.sink_edge_rng = random.Random(0)
        """Foreign errors and deaths between parts inside sinks: the other draws stay."""
        self.lake = False
        """Whether the schedule exports to Delta or Iceberg tables (``lakehouse_schedule``)."""
        self.committed_changes: dict[str, dict[int, dict[str, str]]] = {}
        """Stream sink -> txid -> key -> value text: what each commit wrote to the change
        log (read right after it), which every stream entry of that txid must hold."""
        self.changes_lineage: str | None = None
        """The lineage ``committed_changes`` were noted in (None: none since the last reset);
        a reader in another thread compares streams of that lineage only."""

        self.seed = 0
        self.kafka: LocalKafka | None = None
        self.kafka_rng = random.Random(0)
        """Kafka schedules' own generator (mid-emit freezes, transactions, bad records)."""
        self.rewind_rng = random.Random(0)
        """The operator's rewinds' own generator: the steps' draws stay as they were."""
        self.parallel_rng = random.Random(0)
        """Parallel runs' own generator (when, how many): the steps' draws stay."""
        self.rewinds = 0
        self.reshard_rng = random.Random(0)
        """The operator's reshards' own generator: the steps' draws stay as they were."""
        self.reshards = 0
        self.pause_rng: random.Random | None = None
        """The paused-Redis family's own generator (None: off): the steps' draws stay."""
        self.maintenance_rng: random.Random | None = None
        """The tables family's own generator (None: off)."""
        self.maintenances = 0
        self.deploy_rng: random.Random | None = None
        """The deploys family's own generator (None: off): the steps' draws stay."""
        self.deploys = 0
        self.spent_rng: random.Random | None = None
        """The paused family's: whether a failed step was its task's last (``retries_spent``)."""
        self.zombie_txid: int | None = None
        """A committed txid a stalled emit went on staging for into a paused Redis: its
        failure is its task's last try, and nothing of what it staged may be left after it."""
        self.reshard = False
        """Whether the operator may reshard in this schedule (``run_chaos(reshards=True)``)."""
        self.lost_rng: random.Random | None = None
        """The lost-writes family's own generator (None: off): the steps' draws stay."""
        self.snapshot_in: int | None = None
        """Steps until Redis goes back to the snapshot taken (None: none taken)."""
        self.lost_writes = False
        """Whether Redis already went back to a snapshot in this schedule (once at most)."""
        self.resets_at_snapshot = 0
        self.changes_at_snapshot: dict[str, dict[int, dict[str, str]]] = {}
        """``committed_changes`` when the snapshot was taken: what the streams go back to."""
        self.exports_held_through: tuple[int, str] | None = None
        """After Redis lost writes: (what the sinks held, the generation then) - no export
        until the pipeline recommitted past that txid, and then the first one's reload is cut
        short (a reset or rewind meanwhile reloads them anyway: the hold ends then)."""
        self.batch_after_loss: int | None = None
        """The batch size the runs after the loss use (another deploy's: the lost txids'
        replays then read other batches than the sinks hold)."""
        self.unsent: list[str] = []
        """Lines produced while the broker was frozen: sent when it is back."""
        self.freeze: threading.Timer | None = None

    def seed_families(
        self, seed: int, *, reshards: bool, paused: bool, deploys: bool, tables: bool,
        lost_writes: bool,
    ) -> None:  # fmt: skip
        """Each family's own random stream (drawn from the seed alone, so a family switched
        on leaves every other family's draws as they were); a family that is off gets none."""
        self.seed = seed
        self.sink_rng = random.Random(f"sinks-{seed}")
        self.sink_edge_rng = random.Random(f"sink-edges-{seed}")
        self.rewind_rng = random.Random(f"rewind-{seed}")
        self.lake = lakehouse_schedule(seed)
        self.parallel_rng = random.Random(f"parallel-{seed}")
        self.reshard_rng = random.Random(f"reshard-{seed}")
        self.reshard = reshards
        self.pause_rng = random.Random(f"pause-{seed}") if paused else None
        self.spent_rng = random.Random(f"spent-{seed}") if paused else None
        self.deploy_rng = random.Random(f"deploy-{seed}") if deploys else None
        self.maintenance_rng = random.Random(f"tables-{seed}") if tables else None
        if lost_writes:
            self.lost_rng = random.Random(f"lost-{seed}")

    def retries_spent(self) -> bool:
        """In the paused family, now and then (RETRIES_SPENT_CHANCE): a step that failed was its
        task's last try - the run gives up with no retry of it, so whatever the failed step
        left must go with the failure itself (a zombie's staging of a txid another run
        committed, say: nothing later retries it, and the last txid has no next commit)."""
        if self.zombie_txid is not None:
            return True
        return self.spent_rng is not None and self.spent_rng.random() < RETRIES_SPENT_CHANCE

    def zombie_staging_left(self, rt: Runtime) -> str | None:
        """After the last try of a stalled emit that went on into a paused Redis: the first
        file its attempt left staged for the committed txid (None: none; its staging in Redis
        goes with its TTL). Forgets the zombie."""
        txid, self.zombie_txid = self.zombie_txid, None
        if txid is None:
            return None
        area = rt.staging_root / f"g-{rt.ledger.generation}" / f"tx-{txid}"
        left = sorted(area.glob("attempt-*")) if area.exists() else []
        return str(left[0]) if left else None

    def note_changes(self, txid: int | None) -> None:
        """Note what committed txid ``txid`` wrote for each stream sink (from its change log,
        read now: the export has not dropped it yet)."""
        from tridentflow.plan import compile_chain
        from tridentflow.sinks.redisstream import _text
        from tridentflow.steps.export import changes_of, stream_rows

        rt = self.rt
        if txid is None or txid > rt.ledger.committed_txid():
            return
        self.changes_lineage = rt.ledger.lineage()
        for feed in rt.pipeline.feeds:
            if not isinstance(feed.sink, RedisStreamSink):
                continue
            items = changes_of(rt, feed, txid)
            if items is None:
                continue  # already exported and dropped: noted when it committed
            rows = stream_rows(items, compile_chain(feed.node))
            noted = {str(row[0]): _text(row[1]) for row in rows}
            self.committed_changes.setdefault(feed.name, {})[txid] = noted

    def new_lineage(self) -> None:
        """A reset began a new lineage: its streams start anew, and so do the notes."""
        self.changes_lineage = None
        self.committed_changes.clear()

    def forget_changes_after(self, target: int) -> None:
        """A rewind to ``target`` took the later txids back: their replays commit anew."""
        for by_txid in self.committed_changes.values():
            for txid in [t for t in by_txid if t > target]:
                del by_txid[txid]

    def torn_since_rewind(self) -> list[int]:
        """Txids an exporter left on some of a sink's parts (it died between them) since the
        last rewind: the operator's next rewind aims right below them most of the time."""
        events = self.result.events[self.rewound_at_event :]
        return [int(e.rsplit("@", 1)[1]) for e in events if e.startswith("sink-died-between")]

    def append(self, n: int, during: str | None = None) -> None:
        rng = self.rng
        lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 5))) for _ in range(n)]
        log = self.rt.log
        disturb = log.chaos.disturb
        if disturb == "freeze-broker":  # the producers' log: sent by a producer of its own
            self._produce_kafka(lines)
            if during:
                self.result.events.append(f"append+{n}@{during}")
            return
        self.rt.source_scan()
        if disturb == "remove-entries":
            try:
                log.append_spread(lines)
            except SourceError:  # refused: a stream it read was deleted; the operator resets
                self.operator_resets_reader(f"produce-refused@{during or 'append'}")
                log.append_spread(lines)
        elif disturb == "dark-partition":
            log.append_spread(lines, skip_unavailable=True)
        else:  # a source that declares no disturbance: appended through its own produce
            encoded = [encode_record(line) for line in lines]
            p = self.rt.pipeline
            log.produce(p.name, encoded, None, p.source.partitions)
        self.produced.extend(lines)
        if during:
            self.result.events.append(f"append+{n}@{during}")
        if disturb != "none" and rng.random() < 0.15:  # records that cannot be decoded
            log = self.rt.log
            if disturb == "remove-entries":  # bytes that are not UTF-8, a wrong field
                bad = rng.choice(BAD_ENTRIES)
                self.rt.client.xadd(log.stream_keys[rng.randrange(log.partitions())], bad)
                self.result.events.append(f"bad-entry{BAD_ENTRIES.index(bad)}")
                return
            bad = rng.choice(BAD_LINES)
            readable = sorted(log.scan().heads)
            if readable:
                log.append_lines(rng.choice(readable), [bad])
                self.result.events.append(f"bad-record{BAD_LINES.index(bad)}")

    def _produce_kafka(self, lines: list[str]) -> None:
        """Send lines (held while the broker is frozen: a producer retries until it is back),
        now and then in a transaction (its commit marker takes an offset), now and then with
        an undecodable record beside them."""
        self.produced.extend(lines)
        if self.outage is not None:
            self.unsent.extend(lines)
            return
        source, rng = self.rt.log, self.kafka_rng
        assert source.chaos.disturb == "freeze-broker" and self.kafka is not None
        from confluent_kafka import Producer

        # a producer of its own: the source's short timeout is the reader's, not a producer's
        log = type(source)(source.topic, source.config, source.pipeline, timeout_s=30)
        quiet = logging.getLogger("tridentflow.kafka.client")
        try:
            if rng.random() < 0.3:
                producer = Producer(
                    {"bootstrap.servers": self.kafka.bootstrap, "transactional.id": log.topic},
                    logger=quiet,
                )
                producer.init_transactions(30)
                producer.begin_transaction()
                n = log.partitions()
                for i, line in enumerate(lines):
                    producer.produce(log.topic, json.dumps(line).encode(), partition=i % n)
                producer.commit_transaction(30)
                self.result.events.append("kafka-transaction")
            else:
                log.append_spread(lines)
            if rng.random() < 0.15:
                bad = rng.choice(BAD_KAFKA_VALUES)
                producer = Producer({"bootstrap.servers": self.kafka.bootstrap}, logger=quiet)
                producer.produce(log.topic, bad, partition=rng.randrange(log.partitions()))
                producer.flush(30)
                self.result.events.append(f"bad-kafka-record{BAD_KAFKA_VALUES.index(bad)}")
        finally:
            log.close()

    def toggle_broker(self, when: str) -> None:
        """The broker stops answering (frozen: nothing lost), or answers again."""
        if self.outage is not None:
            self.end_outage(when)
            return
        assert self.kafka is not None
        self.kafka.pause()
        self.outage = ("broker-frozen", -1, b"")
        self.result.events.append(f"outage:broker-frozen@{when}")

    def maybe_late_block_writer(self, run_id: str, step: int) -> None:
        """Schedules staging in Redis: now and then, right after an emit staged, another writer
        overwrites one of its blocks - a speculative duplicate task finishing late with other
        content, or a torn rewrite. Loading the attempt, as the commit does before it writes
        anything, must refuse it (its SHA-1 and line count differ from the manifest's); a
        staged batch that loads anyway is the schedule's first difference. Then the block is
        put back, so the schedule goes on as drawn (its own generator: no other draw moves)."""
        rt = self.rt
        if random.Random(f"late-writer-{self.seed}-{step}").random() >= 0.12:
            return
        txid = rt.ledger.txid_of_run(run_id)
        attempt = rt.ledger.staged_attempt(txid) if txid else None
        if txid is None or attempt is None or txid <= rt.ledger.committed_txid():
            return
        area = rt.staging_of(txid, attempt)
        if not isinstance(area, RedisStagingArea):
            return
        staged = area.load(txid, attempt)
        refs = [r for name in rt.pipeline.states for r in staged.blocks(name)]
        if not refs:
            return
        ref = random.Random(f"late-writer-block-{self.seed}-{step}").choice(refs)
        key = staged.space.key(ref)
        original = rt.client.get(key) or b""
        lines = original.decode().split("\n")
        field_, _tab, partial = lines[0].partition("\t")
        if partial.lstrip("-").isdigit():  # the same key, another partial
            lines[0] = f"{field_}\t{int(partial) + 1}"
        else:  # one line twice (a torn rewrite)
            lines.append(lines[0])
        rt.client.set(key, "\n".join(lines), keepttl=True)
        try:
            area.load(txid, attempt)
            self.result.difference = (
                f"txid {txid} attempt {attempt} loaded with block {ref.name} overwritten by a "
                "late writer: a commit would apply what no emit staged"
            )
        except IncompleteBatchError:
            self.result.events.append(f"late-block-writer-refused@{run_id}:txid{txid}")
        finally:
            rt.client.set(key, original, keepttl=True)

    def maybe_freeze_mid_emit(self, run_id: str) -> None:
        """Kafka schedules: now and then the broker freezes a few milliseconds into an emit
        (while its read tasks read, or just after)."""
        if self.kafka is None or self.outage is not None or self.kafka_rng.random() >= 0.15:
            return
        delay = self.kafka_rng.uniform(0.0, 0.05)
        self.outage = ("broker-frozen", -1, b"")
        self.freeze = threading.Timer(delay, self.kafka.pause)
        self.freeze.start()
        self.result.events.append(f"outage:broker-frozen-mid-emit@{run_id}")

    def mutate_stream(self, when: str) -> None:
        """What another client does to the streams (see the module doc). Those that remove
        entries nobody read are reported by ``status``; the drain (or a failing run) makes
        the operator reset the reader."""
        rng, log, client = self.rng, self.rt.log, self.rt.client
        assert log.chaos.disturb == "remove-entries"
        committed = self.rt.ledger.committed_offsets()
        p = rng.randrange(log.partitions())
        key = log.stream_keys[p]
        read, unread = log.split_at(p, committed.get(p, 0))
        entries = read + unread
        kind = rng.choice(("xdel-read", "xdel-read", "trim-read", "xdel-unread",
                           "maxlen-unread", "delete", "recreate"))  # fmt: skip
        if kind == "xdel-read" and read:
            client.xdel(key, *rng.sample(read, rng.randint(1, len(read))))
        elif kind == "trim-read" and read:
            log.trim(committed)
        elif kind == "xdel-unread" and unread:
            client.xdel(key, rng.choice(unread))
        elif kind == "maxlen-unread" and len(unread) > 1:
            client.xtrim(key, maxlen=rng.randrange(len(unread)), approximate=False)
        elif kind == "delete" and entries:
            client.delete(key)
        elif kind == "recreate" and entries:
            client.delete(key)
            fresh = [" ".join(rng.choice(WORDS) for _ in range(2)) for _ in range(3)]
            for line in fresh:
                client.xadd(key, {"sentence": line})
        else:
            return
        self.result.events.append(f"stream-{kind}:{p}@{when}")

    def operator_resets_reader(self, when: str) -> None:
        """``status`` names a stream that lost entries before they were read: the operator
        resets the reader (not the source); from now on exactly what the streams hold
        counts."""
        rt = self.rt
        reset_pipeline(rt, force=True)
        self.new_lineage()
        log = rt.log
        assert log.chaos.disturb == "remove-entries"
        self.produced = [
            fields[b"sentence"].decode()
            for key in log.stream_keys
            for _entry, fields in rt.client.xrange(key)
            if set(fields) == {b"sentence"} and _decodes(fields[b"sentence"])
        ]
        self.result.events.append(f"reader-reset@{when}")

    def toggle_outage(self, when: str) -> None:
        if self.outage is not None:
            self.end_outage(when)
            return
        log = self.rt.log
        if not log.exists():
            return
        partition = self.rng.randrange(log.partitions())
        pdir = log.root / f"p-{partition:04d}"
        if not (pdir / "HEAD").exists():
            return
        if self.rng.random() < 0.7:  # the mount drops: the directory is gone
            self.aside.mkdir(parents=True, exist_ok=True)
            pdir.rename(self.aside / pdir.name)
            self.outage = ("unmount", partition, b"")
        else:  # a torn HEAD (an I/O error mid-write on the storage)
            head = (pdir / "HEAD").read_bytes()
            (pdir / "HEAD").write_bytes(head[: len(head) // 2])
            self.outage = ("torn-head", partition, head)
        self.result.events.append(f"outage:{self.outage[0]}:{partition}@{when}")

    def end_outage(self, when: str) -> None:
        if self.outage is None:
            return
        kind, partition, head = self.outage
        if kind == "broker-frozen":
            assert self.kafka is not None
            if self.freeze is not None:  # a freeze timed mid-emit: fired, or never will
                self.freeze.cancel()
                self.freeze.join()
                self.freeze = None
            self.kafka.resume()
            self.outage = None
            unsent, self.unsent = self.unsent, []
            self.produced = self.produced[: len(self.produced) - len(unsent)]
            if unsent:
                self._produce_kafka(unsent)
            self.result.events.append(f"outage-over:broker@{when}")
            return
        pdir = self.rt.log.root / f"p-{partition:04d}"
        if kind == "unmount":
            (self.aside / pdir.name).rename(pdir)
        else:
            (pdir / "HEAD").write_bytes(head)
        self.outage = None
        self.result.events.append(f"outage-over:{partition}@{when}")


def _decodes(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
