"""Sinks under chaos: exports with faults, and the tables and streams compared with the state."""

from __future__ import annotations

import contextlib
import itertools
import json
import random
import shutil
import threading
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

import redis

from tridentflow.devtools.chaos.checks import at_once
from tridentflow.devtools.chaos.config import CHAOS_COLUMNS, ScheduleResult
from tridentflow.devtools.chaos.draws import (
    lakehouse_format,
    lakehouse_schedule,
    schedule_expiry,
    schedule_expiry_time,
    sink_parts,
)
from tridentflow.devtools.chaos.files import (
    DELTA_NAME,
    FILES_DF_NAME,
    FILES_NAME,
    create_sentences_table,
)
from tridentflow.devtools.chaos.schedule import Schedule
from tridentflow.devtools.chaos.typed import (
    TYPED_NAME,
    add_typed_sinks,
    typed_difference,
    typed_rows,
    typed_table,
)
from tridentflow.errors import (
    TridentflowError,
    one_line,
)
from tridentflow.faults import Fault, FaultPlan, SimulatedCrash
from tridentflow.pipeline import Pipeline
from tridentflow.registry import load_pipeline
from tridentflow.sinks import DeltaSink, IcebergSink, PostgresSink, RedisStreamSink, SinkError
from tridentflow.sinks.base import SinkRefusedError
from tridentflow.sinks.redisstream import companion_key
from tridentflow.steps.export import close_sink, context, export, export_each
from tridentflow.steps.query import list_state
from tridentflow.steps.runtime import Runtime
from tridentflow_state.changes import sink_allowed
from tridentflow_state.codec import encode_key
from tridentflow_state.errors import StateError
from tridentflow_state.maps import StateKind


class SinkChecks:
    """The schedule's sinks (mixed into Chaos): built on every state, exported with faults,
    compared with the state."""

    @staticmethod
    def _expire_keys(pipeline: Pipeline, seed: int) -> None:
        """Every state that can expire keys (stamped, and recountable txid by txid by audit)
        gets the schedule's expiry rule."""
        period, by_txids = schedule_expiry_time(seed)
        rule = {
            "expire_after_txids": schedule_expiry(seed) if by_txids else None,
            "expire_after": None if period is None else timedelta(milliseconds=period),
        }
        for index, persist in enumerate(pipeline.persists):
            stamped = persist.state.kind is not StateKind.NON_TRANSACTIONAL
            if persist.recountable and stamped:
                state = replace(persist.state, **rule)
                pipeline.persists[index] = replace(persist, state=state)

    def _pipeline(self, name: str, seed: int):
        """A fresh pipeline ``name`` with this schedule's sinks on every state."""
        pipeline = load_pipeline(name)
        if hasattr(pipeline.source, "topic_name"):  # a topic on the harness's broker
            if self.kafka is None:
                raise TridentflowError(f"chaos: pipeline {name} needs a broker (kafka=)")
            pipeline.source = replace(
                pipeline.source,
                topic=f"chaos-{seed}",
                config={"bootstrap.servers": self.kafka.bootstrap},
                timeout_s=0.5,  # a frozen broker fails each call within half a second
            )
        if pipeline.name in (FILES_NAME, FILES_DF_NAME):  # a landing of the schedule's own
            landing = self.workdir / f"landing-{seed}"
            landing.mkdir(parents=True, exist_ok=True)
            pipeline.source = replace(pipeline.source, uri=str(landing))
        if pipeline.name == DELTA_NAME:  # a table of the schedule's own, made empty
            table = self.workdir / f"table-{seed}"
            create_sentences_table(table)
            pipeline.source = replace(pipeline.source, uri=str(table))
        if self.expiry:  # the expiry family: by txids, by batch time, or both
            self._expire_keys(pipeline, seed)
        if pipeline.name == TYPED_NAME:  # the types family: its state's own columns
            add_typed_sinks(pipeline, self.workdir / f"lake-{seed}", seed, self.postgres_dsn)
        parts = sink_parts(seed)
        for state in sorted(pipeline.states):
            changes = pipeline.state(state).new_values_stream().map(_canonical, ["key", "value"])
            stream = f"chaos-{seed}-{state}" + ("-{partition}" if parts > 1 else "")
            changes.sink(
                RedisStreamSink(stream, partitions=parts, name=f"stream-{state}", key=["key"])
            )
            if self.postgres_dsn:
                table = f"chaos_{seed}_{state}".replace("-", "_")
                changes.sink(
                    PostgresSink(table, dsn=self.postgres_dsn, key=["key"],
                                 name=f"postgres-{state}", columns=CHAOS_COLUMNS)
                )  # fmt: skip
            if lakehouse_schedule(seed):
                self._add_lake_sinks(pipeline, state, seed)
        return pipeline

    def _add_lake_sinks(self, pipeline: Pipeline, state: str, seed: int) -> None:
        """``state``'s upserted Delta or Iceberg table (the schedule's format); in the tables
        family, its first state's appended change log too (``LOG_SINK``): a file per txid,
        so the operator's compactions have files to merge and its vacuums files to remove."""
        lake = self.workdir / f"lake-{seed}"
        lake.mkdir(parents=True, exist_ok=True)  # the SQLite catalog's directory
        as_json = pipeline.state(state).new_values_stream().map(_canonical_json, ["key", "value"])
        logged = self.tables and state == min(pipeline.states)
        modes = ("upsert", "append") if logged else ("upsert",)
        for mode in modes:
            log = "-log" if mode == "append" else ""
            if lakehouse_format(seed) == "delta":
                as_json.sink(DeltaSink(lake / f"delta{log}-{state}", mode=mode,
                                       name=f"delta{log}-{state}", key=["key"]))  # fmt: skip
                continue
            catalog = {"type": "sql", "uri": f"sqlite:///{lake}/catalog.db",
                       "warehouse": f"file://{lake}/warehouse"}  # fmt: skip
            name = state.replace("-", "_") + log.replace("-", "_")
            as_json.sink(IcebergSink(f"chaos.s{seed}_{name}", catalog, mode=mode,
                                     name=f"iceberg{log}-{state}", key=["key"]))  # fmt: skip

    def _drop_sink_targets(self, rt: Runtime, seed: int) -> None:
        shutil.rmtree(self.workdir / f"lake-{seed}", ignore_errors=True)
        if lakehouse_schedule(seed) or rt.pipeline.name == TYPED_NAME:  # the SQLite catalog's
            # directory, for the next tables
            (self.workdir / f"lake-{seed}").mkdir(parents=True)
        for feed in rt.pipeline.feeds:
            if isinstance(feed.sink, RedisStreamSink):
                for stream in feed.sink.streams():
                    rt.client.delete(stream, companion_key(stream))
        if self.postgres_dsn:
            import psycopg

            with psycopg.connect(self.postgres_dsn, autocommit=True) as conn:
                for state in rt.pipeline.states:
                    table = f"chaos_{seed}_{state}".replace("-", "_")
                    conn.execute(f'DROP TABLE IF EXISTS "{table}"')
                conn.execute(f'DROP TABLE IF EXISTS "{typed_table(seed)}"')
                conn.execute(
                    "DELETE FROM tridentflow_progress WHERE pipeline = %s"
                    if _has_progress(conn)
                    else "SELECT %s",
                    (rt.pipeline.name,),
                )

    def _kill_session(self, feed, point: str, txid: int, rng: random.Random, events) -> None:
        """At a sink's mid-export point: now and then, PostgreSQL ends the sink's session in
        the middle of its transaction (as a server restart would)."""
        conn = feed.sink._conn  # a PostgresSink's open session, if any
        if conn is None or rng.random() >= 0.3:
            return
        if self.postgres is not None and rng.random() < 0.5:
            self.postgres.restart()  # the server crashes mid-transaction, and comes back
            events.append(f"pg-restart@{txid}")
            return
        import psycopg

        with psycopg.connect(self.postgres_dsn, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
        events.append(f"pg-session-killed@{txid}")

    def _maybe_export(self, sched: Schedule, when: str) -> None:
        """Now and then, the sinks catch up: one exporter, or two at once (each a process of
        its own), or an operator's ``export --resync``. A failing export leaves its sink
        behind; the commits never wait for it."""
        rng, rt = sched.sink_rng, sched.rt
        if self._held_after_loss(sched, when):
            return
        roll = rng.random()
        if roll >= 0.6:
            return
        racers = 2 if roll < 0.12 else 1
        resync = 0.12 <= roll < 0.16
        events = sched.result.events
        if racers > 1:
            events.append(f"duplicate-export@{when}")
        if resync:
            events.append(f"export-resync@{when}")

        def hook(feed, point, txid):
            if self.postgres_dsn and isinstance(feed.sink, PostgresSink) and point == "mid-export":
                self._kill_session(feed, point, txid, rng, events)
            sink_misbehaves(sched.sink_edge_rng, point, txid, events)

        race = _Race(overtaken=racers > 1 and zlib.crc32(f"{sched.seed}:{when}".encode()) % 2 == 0)
        if race.overtaken:
            events.append(f"export-overtaken@{when}")
        at_once(lambda: self._export_racing(sched, when, resync, hook, race), racers)
        self._refusals_hold(rt, race.refused, resync, sched.result)
        failed = any(e.endswith(f"@{when}") and "failed" in e for e in events)
        if racers == 1 and not failed and rt.ledger.committed_txid() > 0:
            # nothing commits in between here: each table must be the state as of now (a
            # commit cut short half-way must not show through). Before a fresh generation's
            # first txid a table still holds what the old one wrote (replaced at that txid)
            # (once Redis lost commits, the lakehouse tables too: a table kept ahead of the
            # ledger shows as soon as the pipeline has recommitted past it)
            self._compare_sinks(rt, sched.result, only_postgres=True, lakes=sched.lost_writes)

    def _export_racing(
        self, sched: Schedule, when: str, resync: bool, hook: Any, race: _Race
    ) -> None:
        """One exporter of ``race``, a process of its own: every sink (those that can reload,
        for a resync) exported; its first failure noted as an event - a refusal kept for
        ``_refusals_hold`` -, anything but a sink's one line a difference. In an overtaken race
        the first exporter waits after reading its stream sink's position while the others,
        clean, export every sink (``_overtaken_after_position``)."""
        rt, events = sched.rt, sched.result.events
        number = next(race.numbers)
        overtaker = race.overtaken and number > 0  # a clean racer: it passes every sink
        faults = FaultPlan() if overtaker else rt.faults
        try:  # the schedule's pipeline as it was given (a bundled name or module:attribute)
            other = self._runtime(self._pipeline(sched.result.pipeline, sched.seed),
                                  rt.home, faults, rt.shards or 1)  # fmt: skip
        except Exception as exc:  # a thread's exception is lost unless it is noted
            if not sched.result.difference:
                sched.result.difference = f"an exporter did not start: {one_line(exc)}"
            race.others_done.set()
            return
        if race.overtaken and number == 0:
            _overtaken_after_position(other, race.others_done)
        try:
            names = [f.name for f in other.pipeline.feeds if not resync or f.sink.resyncable]
            if not names:  # no sink that can reload: nothing to resync
                return
            _done, failures = export_each(other, names, resync=resync,
                                          hook=None if overtaker else hook)  # fmt: skip
            first = next(iter(failures.items()), None)
            if first is not None and not isinstance(first[1], SinkError):
                raise first[1]  # every failure of a sink must be its SinkError line
            if first is not None:
                if isinstance(first[1], SinkRefusedError):  # final, it says: checked after
                    race.refused[first[0]] = first[1]
                events.append(f"export-failed:{type(first[1]).__name__}@{when}")
        except SimulatedCrash as exc:  # a kill
            events.append(f"export-failed:{type(exc).__name__}@{when}")
        except Exception as exc:
            if not sched.result.difference:
                sched.result.difference = (
                    f"an export let {type(exc).__name__} through instead of a SinkError "
                    f"(the commits would stop): {exc}"
                )
        finally:
            other.client.close()
            if number > 0:
                race.others_done.set()

    @staticmethod
    def _refusals_hold(
        rt: Runtime, refused: dict[str, SinkRefusedError], resync: bool, result: ScheduleResult
    ) -> None:
        """A refusal says retrying will not help (the family 'a refusal a retry contradicts':
        racing exporters once refused a sink a racer had just passed): the sink, exported again
        at once the same way with nothing armed, must be refused again."""
        plain = rt.with_(faults=FaultPlan())
        for name, exc in refused.items():
            try:
                export(plain, [name], resync=resync)
            except (SimulatedCrash, SinkError):  # refused again, or no verdict: it failed
                continue
            if not result.difference:
                result.difference = (
                    f"sink {name} was refused ({exc}) but an export right after went "
                    "through: a refusal must be final"
                )

    def _held_after_loss(self, sched: Schedule, when: str) -> bool:
        """After Redis lost writes (``Schedule.exports_held_through``): True while the tables
        wait for the pipeline to recommit past them, and at the export that ends the wait
        (its reload cut short, ``_reload_cut_short``); a reset or rewind meanwhile ends it."""
        if sched.exports_held_through is None:
            return False
        held, generation = sched.exports_held_through
        rt = sched.rt
        same = rt.ledger.current_generation() == generation
        if same and rt.ledger.committed_txid() <= held:
            return True
        sched.exports_held_through = None
        if same:
            self._reload_cut_short(sched, when)
        return same

    def _reload_cut_short(self, sched: Schedule, when: str) -> None:
        """The first export since Redis lost writes, once the pipeline recommitted past
        what the tables hold: each table sink's reload dies part-way; the next export must
        reload again, never go on from the lost txids' rows (compared at once: later txids
        soon write every key again and would hide them)."""

        def die(feed, point, txid):
            raise SimulatedCrash(f"the exporter died reloading {feed.name} at txid {txid}")

        rt = sched.rt
        tables = [f.name for f in rt.pipeline.feeds
                  if isinstance(f.sink, PostgresSink | DeltaSink | IcebergSink)]  # fmt: skip
        for name in tables:
            with contextlib.suppress(SimulatedCrash, SinkError):
                export(rt, [name], hook=die)
        sched.result.events.append(f"reload-cut-short@{when}")
        try:
            export(rt, tables)
        except SinkError:
            return  # a sink's own failure (its session, say): compared after a later export
        self._compare_sinks(rt, sched.result, only_postgres=True, lakes=True)

    def _check_sinks(
        self,
        rt: Runtime,
        result: ScheduleResult,
        committed_changes: dict[str, dict[int, dict[str, str]]] | None = None,
    ) -> None:
        """After the drain: every sink exported up to the committed txid equals the state,
        and every stream entry is what its txid's commit wrote (``committed_changes``)."""
        for attempt in range(3):
            try:
                export(rt)
                break
            except (TridentflowError, StateError, redis.RedisError) as exc:
                if attempt == 2 and not result.difference:
                    result.difference = f"the final export failed: {exc}"
                    return
        self._compare_sinks(rt, result, committed_changes=committed_changes)

    def _compare_sinks(
        self,
        rt: Runtime,
        result: ScheduleResult,
        only_postgres: bool = False,
        committed_changes: dict[str, dict[int, dict[str, str]]] | None = None,
        lakes: bool = False,
    ) -> None:
        """Each sink against the state now (``only_postgres``: the PostgreSQL tables, and
        with ``lakes`` the Delta and Iceberg ones too - not the streams)."""
        committed_changes = committed_changes or {}
        committed = rt.ledger.committed_txid()
        tables = (PostgresSink, DeltaSink, IcebergSink) if lakes else (PostgresSink,)
        for feed in rt.pipeline.feeds:
            if only_postgres and not isinstance(feed.sink, tables):
                continue
            persist = rt.pipeline.states[feed.state]
            page = list_state(rt, persist, limit=1_000_000)
            if feed.name.startswith("typed-"):  # the state's own columns and types
                problem = typed_difference(typed_rows(feed.sink, self.postgres_dsn),
                                           dict(page.items))  # fmt: skip
                if problem and not result.difference:
                    result.difference = f"sink {feed.name} at txid {committed}: {problem}"
                    return
                continue
            want = {encode_key(k): jsonish(v) for k, v in page.items}
            if isinstance(feed.sink, PostgresSink):
                got = _table(self.postgres_dsn, feed.sink.table)
            elif isinstance(feed.sink, DeltaSink | IcebergSink):
                got = _lake_table(feed.sink)
            else:
                got, problem = _stream_view(
                    rt, feed.sink, rt.ledger.lineage(), committed_changes.get(feed.name, {})
                )
                if problem and not result.difference:
                    result.difference = f"sink {feed.name}: {problem}"
                    return
            if got != want and not result.difference:
                first = sorted(set(got.items()) ^ set(want.items()), key=str)[:1]
                result.difference = (
                    f"sink {feed.name} at txid {committed}: {len(got)} rows vs {len(want)} keys "
                    f"in the state; first difference {first}"
                )
                return


def tables_ahead(rt: Runtime) -> int:
    """The highest txid a table sink (PostgreSQL, Delta, Iceberg) holds past what Redis allowed
    it (Redis lost writes since); 0 if none is ahead."""
    highest = 0
    for feed in rt.pipeline.feeds:
        if isinstance(feed.sink, PostgresSink | DeltaSink | IcebergSink):
            try:
                position = feed.sink.position(context(rt, feed))
            finally:
                close_sink(feed)
            allowed = sink_allowed(rt.client, rt.keyspace, feed.name) or 0
            if position > allowed:
                highest = max(highest, position)
    return highest


def _canonical(*row):
    """A new-values tuple as (the key's canonical encoding, the value): keys that are equal
    in Python but not in tridentflow (1, 1.0, true) stay apart in every sink."""
    return (encode_key(row[:-1]), row[-1])


def _canonical_json(*row):
    """A new-values tuple as (the key's canonical encoding, the value as JSON text; None for
    a removed key): one column type whatever values the state holds (a lakehouse table)."""
    return (encode_key(row[:-1]), None if row[-1] is None else jsonish(row[-1]))


def _lake_table(sink: DeltaSink | IcebergSink) -> dict[str, str]:
    """A lakehouse sink's table as {key: value}; {} if it does not exist yet."""
    if isinstance(sink, DeltaSink):
        table = sink._table()
        rows = [] if table is None else table.to_pyarrow_table().to_pylist()
    else:
        found = sink._table()
        rows = [] if found is None else found.scan().to_arrow().to_pylist()
    return lake_rows(sink, rows)


def lake_rows(sink: DeltaSink | IcebergSink, rows: list[dict]) -> dict[str, str]:
    """A chaos table's rows as {key: value}: an upserted table's row per key, or an appended
    change log folded txid by txid (a key's newest row; a null value removed it) - the
    state as of the table's stamp either way, whatever order the files hold the rows in."""
    if sink.mode != "append":
        return {r["key"]: r["value"] for r in rows}
    folded: dict[str, str] = {}
    for row in sorted(rows, key=lambda r: r["txid"]):
        if row["value"] is None:
            folded.pop(row["key"], None)
        else:
            folded[row["key"]] = row["value"]
    return folded


def jsonish(value) -> str:
    """A value as the chaos tables compare it: JSON text, keys sorted."""
    return json.dumps(value, sort_keys=True)


def _has_progress(conn) -> bool:
    return bool(
        conn.execute("SELECT to_regclass('tridentflow_progress') IS NOT NULL").fetchone()[0]
    )


def _table(dsn: str, table: str) -> dict[str, str]:
    import psycopg

    with psycopg.connect(dsn) as conn:
        exists = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (table,)).fetchone()[0]
        if not exists:
            return {}
        rows = conn.execute(f'SELECT key, value FROM "{table}"').fetchall()
    return {key: jsonish(value) for key, value in rows}


def _stream_view(
    rt: Runtime,
    sink: RedisStreamSink,
    lineage: str,
    committed: dict[int, dict[str, str]] | None = None,
):
    """(key -> value by the last entry per key over the sink's streams, of this lineage, or
    a problem): one entry per key and txid, never twice, each key in one stream only, and
    every entry of a txid in ``committed`` (txid -> key -> value text, what its commit
    wrote) exactly that - an entry left by a rewound txid is caught even when later txids
    wrote the key again."""
    committed = committed or {}
    sink_id = f"{rt.pipeline.name}/{sink.name}"
    latest: dict[str, str] = {}
    home: dict[str, str] = {}
    for stream in sink.streams():
        meta = rt.client.hgetall(companion_key(stream))
        if meta.get(f"{sink_id}:generation".encode(), b"").decode() != lineage:
            continue  # nothing exported to this stream in this lineage
        base = int(meta[f"{sink_id}:base".encode()])
        seen: set[tuple[int, str]] = set()
        for entry_id, fields in rt.client.xrange(stream, f"{base + 1}-0", "+"):
            ms = int(entry_id.decode().split("-")[0])
            key, value = fields[b"key"].decode(), fields[b"value"].decode()
            if (ms, key) in seen:
                return {}, f"key {key} has two entries for txid {ms - base} in {stream}"
            if home.setdefault(key, stream) != stream:
                return {}, f"key {key} is in two streams ({home[key]}, {stream})"
            wrote = committed.get(ms - base)
            if wrote is not None and wrote.get(key) != value:
                return {}, (
                    f"{stream}'s entry of txid {ms - base} for key {key} holds {value}, but "
                    f"that txid's commit wrote {wrote.get(key, 'nothing for it')}"
                )
            seen.add((ms, key))
            latest[key] = value
    view = {}
    for key, text in latest.items():
        if text != "null":
            view[key] = jsonish(json.loads(text)) if _is_json(text) else jsonish(text)
    return view, None


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


FOREIGN_ERRORS: tuple[type[Exception], ...] = (
    KeyError,
    OverflowError,
    RuntimeError,
    ZeroDivisionError,
    UnicodeError,
    ConnectionResetError,
)
"""What a sink's driver or a bug of its own may raise that is none of tridentflow's errors."""


@dataclass
class _Race:
    """Exporters racing at one export point: ``overtaken`` (the first one waits after reading
    a position), their numbers in the order they start, the event the others set when they
    end, and the sink a racer's export refused first, by name."""

    overtaken: bool
    numbers: Iterator[int] = field(default_factory=itertools.count)
    others_done: threading.Event = field(default_factory=threading.Event)
    refused: dict[str, SinkRefusedError] = field(default_factory=dict)


def _overtaken_after_position(rt: Runtime, others_done: threading.Event) -> None:
    """The family 'racing exporters meet a dropped change log': this exporter reads its first
    stream sink's position, then waits while the other racer exports every sink - applying
    the txids after that position and dropping their change logs - before it goes on from the
    position it read. (A stream sink: its position is read from Redis, holding no table lock
    the other racer could wait on.)"""
    sink = next((f.sink for f in rt.pipeline.feeds if isinstance(f.sink, RedisStreamSink)), None)
    if sink is None:
        return
    read = sink.position

    def position(ctx):
        seen = read(ctx)
        del sink.position  # once: the next read is the sink's own again
        others_done.wait(30)
        return seen

    sink.position = position


def sink_misbehaves(rng: random.Random, point: str, txid: int, events: list[str]) -> None:
    """At a sink's point inside a txid (``mid-export``, ``between-parts``), now and then: it
    raises an error of no tridentflow type, or - between its parts - the process dies."""
    if rng.random() >= 0.12:
        return
    if point == "between-parts" and rng.random() < 0.5:
        events.append(f"sink-died-between-parts@{txid}")
        raise SimulatedCrash(f"the exporter died between a sink's parts of txid {txid}")
    kind = rng.choice(FOREIGN_ERRORS)
    events.append(f"sink-raised:{kind.__name__}@{txid}")
    raise kind(f"a foreign error at {point} of txid {txid}")


def sink_faults(rng: random.Random, runs: int, events: list[str]) -> tuple[Fault, ...]:
    """Faults inside exports (``mid-export``), drawn by the sinks' own generator."""
    faults = []
    for txid in range(1, runs + 1):
        if rng.random() < 0.4:
            fault = Fault("mid-export", txid, rng.choice((1, 2)), rng.choice(("raise", "crash")))
            faults.append(fault)
            events.append(str(fault))
    return tuple(faults)
