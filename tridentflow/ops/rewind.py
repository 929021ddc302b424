"""Rewinding a pipeline to txid N (``tridentflow rewind PIPELINE --to N``): every state, the
committed txid and the source offsets back to what they were right after N committed; the
next run recomputes N+1 from there with the code deployed now (state.rewind does the Redis
part).

Before anything changes it checks what a rewind cannot undo:

* the source must hold the records the rewound txids read, readable now (not trimmed, not
  deleted by Kafka's retention, no partition dark): they would otherwise be counted by no
  txid, or later than they were - refused, naming them;
* a sink that cannot take back what it wrote (a Redis stream's readers saw the entries) must
  not be past N - refused, naming it. A PostgreSQL sink converges: the next export, in the
  rewind's new generation, reloads its table from the state in one transaction.

Afterwards: the replicas must acknowledge (``--wait-replicas``), each lakehouse table (Delta,
Iceberg) is carried back to its content as of N as a new table version stamped with the
rewind's generation (``rewind_to``: later exports continue from N+1; a table whose version
of N is gone reloads at the next export instead), and the old generation's staging is
deleted. Run again with the same target, a rewind cut short finishes all of it.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tridentflow.errors import (
    PartitionUnavailableError,
    RewindRefusedError,
    SourceError,
    TridentflowError,
    one_line,
)
from tridentflow.sinks.base import CarriesBack
from tridentflow.steps.runtime import Runtime
from tridentflow.steps.staging import RedisStagingArea
from tridentflow_state.changes import note_sink_position
from tridentflow_state.reshard import plan_under_way
from tridentflow_state.rewind import REWIND_PREFIX, RewindResult, rewind, rewinding_to
from tridentflow_state.undo import offsets_after, retained

TABLES_OWED = "tables_owed"
"""Undo meta field: ``GENERATION|TARGET|LAST`` while a rewind's tables are not all carried
back (the generation they go back from, the target, the last txid before the rewind)."""


@dataclass(frozen=True)
class RewindReport:
    result: RewindResult
    sinks_to_reload: tuple[str, ...]
    tables_rewound: tuple[str, ...] = ()
    """Lakehouse sinks whose table was carried back to the target (a new version)."""

    def to_json(self, pipeline: str) -> dict[str, Any]:
        r = self.result
        return {
            "pipeline": pipeline,
            "to": r.target,
            "committed_before": r.committed,
            "last_before": r.last,
            "restored_keys": r.restored,
            "runs_rewound": list(r.runs),
            "sinks_to_reload": list(self.sinks_to_reload),
            "tables_rewound": list(self.tables_rewound),
            "line": self.line(pipeline),
        }

    def line(self, pipeline: str) -> str:
        r = self.result
        txids = r.last - r.target
        runs = f"; {len(r.runs)} run(s) bound to them are refused at their next step" * bool(r.runs)
        reload = [s for s in self.sinks_to_reload if s not in self.tables_rewound]
        sinks = f"; sink(s) {', '.join(reload)} reload at the next export" if reload else ""
        if self.tables_rewound:
            sinks += f"; table(s) of {', '.join(self.tables_rewound)} back at txid {r.target}"
        return (
            f"rewound {pipeline} to txid {r.target}: {txids} txid(s) taken back "
            f"({r.committed - r.target} committed), {r.restored} key(s) restored{runs}{sinks}"
        )


def check_rewindable(rt: Runtime, target: int) -> tuple[str, ...]:
    """RewindRefusedError (one line) if rewinding to ``target`` would lose source records or
    take back what a sink cannot; returns the sinks that will reload (every one that can:
    the rewind starts a new generation)."""
    committed = rt.ledger.committed_txid()
    resuming = rewinding_to(rt.client, rt.keyspace) is not None
    if resuming:
        return ()
    kept = retained(rt.client, rt.keyspace)
    if target < committed and kept is not None and kept.covers(target):
        after = offsets_after(rt.client, rt.keyspace, target) or {}
        now = rt.ledger.committed_offsets()
        for partition, end in sorted(now.items()):
            start = after.get(partition, rt.ledger.base_offsets().get(partition, 0))
            if end <= start:
                continue
            try:
                rt.log.probe(partition, start, end)
            except SourceError as exc:  # gone (trimmed, retention), or unreadable now
                reason = exc.reason if isinstance(exc, PartitionUnavailableError) else str(exc)
                raise RewindRefusedError(
                    f"cannot rewind {rt.pipeline.name} to txid {target}: partition {partition}'s"
                    f" records {start}..{end - 1}, read by txids {target + 1}..{committed}, "
                    f"cannot be read again ({reason}); rewind to a later txid, or once the "
                    "partition is readable"
                ) from None
    reload = [feed.name for feed in rt.pipeline.feeds if feed.sink.resyncable]
    if target < committed:
        from tridentflow.steps.export import context

        for feed in rt.pipeline.feeds:
            if feed.sink.resyncable:
                continue  # it reloads in the new generation: its position does not matter
            try:  # every part: an export cut short may have left a txid on some of them
                written = feed.sink.written_through(context(rt, feed))
            finally:
                feed.sink.close()
            if written > target:
                raise RewindRefusedError(
                    f"cannot rewind {rt.pipeline.name} to txid {target}: sink {feed.name} "
                    f"({feed.sink.describe()}) already wrote txids up to {written} (in whole or "
                    f"in part), which its readers may have read; rewind to txid {written} or "
                    "later"
                )
    return tuple(reload)


def rewind_pipeline(rt: Runtime, target: int, force: bool = False) -> RewindReport:
    """Rewind ``rt``'s pipeline to ``target`` (see the module doc). RewindRefusedError /
    RewindError / PipelineBusyError (unless ``force``) with nothing changed; run it again
    with the same target to finish a rewind that was cut short."""
    _check_target(rt, target)
    reload = check_rewindable(rt, target)
    resumed = _resumed(rt, target, reload)
    if resumed is not None:
        return resumed
    old_generation = _generation_before(rt)
    owed_here = _owe_tables(rt, old_generation, target)
    result = _rewind_states(rt, target, force, owed_here)
    first = max(1, min(target + 1, result.committed))
    tables = _after_states(rt, old_generation, target, first, result.last)
    return RewindReport(result, reload, tables)


def _check_target(rt: Runtime, target: int) -> None:
    """One line for a target that is no txid, or while a reshard is under way."""
    if isinstance(target, bool) or not isinstance(target, int) or target < 0:
        raise TridentflowError(f"rewind --to takes a txid (a whole number >= 0), got {target!r}")
    plan = plan_under_way(rt.client, rt.keyspace)
    if plan is not None:  # it would restore values into the layout being copied away
        raise RewindRefusedError(
            f"pipeline {rt.pipeline.name} is being resharded to {plan.to_shards} shards: "
            f"finish that first (`tridentflow reshard {rt.pipeline.name} --shards "
            f"{plan.to_shards} --yes`)"
        )


def _resumed(rt: Runtime, target: int, reload: tuple[str, ...]) -> RewindReport | None:
    """A rewind to ``target`` cut short after its states, finished (its tables carried
    back); None when there is none to finish. One line while a rewind to another txid still
    owes tables; a record the pipeline went on past is forgotten."""
    owed = _tables_owed(rt)
    if owed is not None and _states_rewound(rt, owed.generation):
        if rt.ledger.committed_txid() > owed.target:
            # the pipeline went on since: its exports reloaded what was not carried back
            rt.client.hdel(rt.keyspace.undo_meta, TABLES_OWED)
            return None
        if target == owed.target:
            # cut short after the states: the states, the ledger and the offsets are back at
            # ``target`` already (rewinding them again would start one more generation)
            result = RewindResult(target, target, target, 0, (), rt.ledger.generation)
            tables = _after_states(rt, owed.generation, target, max(1, target), owed.last)
            return RewindReport(result, reload, tables)
    if owed is not None and owed.target != target:
        raise TridentflowError(
            f"a rewind of {rt.pipeline.name} to txid {owed.target} has not carried every "
            f"table back yet: run rewind --to {owed.target} again first"
        )
    return None


def _owe_tables(rt: Runtime, old_generation: str | None, target: int) -> bool:
    """Record that the tables are owed until every one is back (a rewind cut short after the
    states finished must still know which generation's versions the tables go back to);
    whether this call recorded it (not an earlier, cut-short run)."""
    if not old_generation or not any(_carries_back(feed.sink) for feed in rt.pipeline.feeds):
        return False
    last = max(rt.ledger.last_txid(), rt.ledger.committed_txid())
    record = f"{old_generation}|{target}|{last}"
    return bool(rt.client.hsetnx(rt.keyspace.undo_meta, TABLES_OWED, record))


def _rewind_states(rt: Runtime, target: int, force: bool, owed_here: bool) -> RewindResult:
    """The states, the ledger and the offsets rewound (tridentflow_state.rewind). A refusal
    before anything changed (its begin step: a txid not committed, a live lease) takes back
    the tables-owed record this run made: nothing is owed."""
    began = False

    def hook(point: str, txid: int) -> None:
        nonlocal began
        began = began or point == "after-begin-rewind"
        rt.faults.fire(point, txid, 1)

    kept, kept_expiring = _kept_states(rt)
    try:
        return rewind(
            rt.client,
            rt.keyspace,
            [*rt.pipeline.states, *kept],
            target,
            force=force,
            hook=hook,
            expiring=[*rt.pipeline.expiring, *kept_expiring],
        )
    except BaseException:
        if owed_here and not began:
            rt.client.hdel(rt.keyspace.undo_meta, TABLES_OWED)
        raise


def _kept_states(rt: Runtime) -> tuple[list[str], list[str]]:
    """The states the deployed code no longer has but Redis keeps (evolve: values, undo logs),
    and those of them with an expiry index: a rewind takes them back too - the previous code,
    deployed again, commits them from the target on (never over values stamped past it)."""
    from tridentflow.steps.recorded_settings import DROPPING, STATES

    recorded = json.loads(rt.ledger.settings().get(STATES, "{}"))
    kept = [
        name
        for name, entry in sorted(recorded.items())
        if name not in rt.pipeline.states and not entry.get(DROPPING)
    ]
    expiring = [
        name
        for name in kept
        if recorded[name].get("expire_after_txids") or recorded[name].get("expire_after_ms")
    ]
    return kept, expiring


def _after_states(
    rt: Runtime, old_generation: str | None, target: int, first: int, last: int
) -> tuple[str, ...]:
    """What follows the states' rewind (idempotent, so a rewind run again after being cut
    short does it again): the sinks' noted positions and the table versions of the rewound
    txids forgotten, the replicas waited for, the old generation's staging of txids
    ``first``..``last`` deleted, ``rt`` moved to the new generation, the tables carried back."""
    rt.client.delete(rt.keyspace.sinks)  # positions of the old generation: each export notes anew
    _forget_table_versions_after(rt, target)
    rt.require_replicated(
        f"the rewind of pipeline {rt.pipeline.name}",
        f"run the rewind again (rewind --to {target}) once the replicas are back",
        shards=True,
    )
    if old_generation and not old_generation.startswith(REWIND_PREFIX):
        # the rewound txids', and the newest committed one's (a commit cut after its mark)
        discard_generation_staging(rt, old_generation, range(first, last + 1))
    rt.follow_generation()
    _ = rt.ledger.generation  # this runtime goes on in the rewound pipeline's generation
    return rewind_tables(rt, old_generation, target) if old_generation else ()


def _forget_table_versions_after(rt: Runtime, target: int) -> None:
    """The txid -> table version mirror forgets the rewound txids: their versions hold what
    the replay recomputes (an export of the new generation notes each anew). Idempotent."""
    from tridentflow.steps.export import table_versions, table_versions_key

    for feed in rt.pipeline.feeds:
        if _carries_back(feed.sink):
            gone = [str(t) for t in table_versions(rt, feed) if t > target]
            if gone:
                rt.client.hdel(table_versions_key(rt, feed), *gone)


def _carries_back(sink: object) -> bool:
    return isinstance(sink, CarriesBack)


@dataclass(frozen=True)
class _Owed:
    """A rewind whose tables are not all carried back yet (``TABLES_OWED``)."""

    generation: str
    """The generation the tables go back from."""
    target: int
    last: int
    """The last txid before the rewind (the old generation's staging to delete)."""


def _tables_owed(rt: Runtime) -> _Owed | None:
    raw = rt.client.hget(rt.keyspace.undo_meta, TABLES_OWED)
    if raw is None:
        return None
    generation, target, last = (raw.decode() if isinstance(raw, bytes) else raw).rsplit("|", 2)
    return _Owed(generation, int(target), int(last))


def _states_rewound(rt: Runtime, old_generation: str) -> bool:
    """Whether the rewind from ``old_generation`` finished its Redis part (the pipeline is
    in a newer generation and no rewind of the states is under way)."""
    current = rt.ledger.current_generation()
    return (
        rewinding_to(rt.client, rt.keyspace) is None
        and current is not None
        and current != old_generation
    )


def rewind_tables(rt: Runtime, old_generation: str, target: int) -> tuple[str, ...]:
    """Each lakehouse sink's table carried back to ``target`` (``rewind_to``, in ``rt``'s new
    generation); the sinks done. One that cannot (its version of ``target`` is gone) reloads
    at the next export; one that fails is one RewindError line - run the rewind again."""
    from tridentflow.steps.export import close_sink, context, table_versions

    done = []
    for feed in rt.pipeline.feeds:
        if not isinstance(feed.sink, CarriesBack):
            continue
        rewind = feed.sink.rewind_to
        rt.faults.fire("mid-rewind", target, 1)
        try:
            known = table_versions(rt, feed).get(target)  # an earlier rewind's version
            ctx = context(rt, feed)
            if rewind(ctx, old_generation, target, known) is not None:
                done.append(feed.name)  # the table stands at target: status says so
                note_sink_position(rt.client, rt.keyspace, feed.name, feed.state, target,
                                   ctx.generation)  # fmt: skip
        except Exception as exc:
            raise TridentflowError(
                f"rewind of {rt.pipeline.name} to txid {target}: the table of sink {feed.name} "
                f"({feed.sink.describe()}) was not carried back: {one_line(exc)}; run the "
                f"rewind again (rewind --to {target})"
            ) from None
        finally:
            close_sink(feed)
    rt.client.hdel(rt.keyspace.undo_meta, TABLES_OWED)
    return tuple(done)


def _generation_before(rt: Runtime) -> str | None:
    """The generation the pipeline had before the rewind: now, or - resuming a rewind that
    was cut short - the one the rewind recorded when it began."""
    current = rt.ledger.current_generation()
    if current and current.startswith(REWIND_PREFIX):
        raw = rt.client.hget(rt.keyspace.undo_meta, "rewinding_generation")
        return raw.decode() if isinstance(raw, bytes) else raw
    return current


def discard_generation_staging(rt: Runtime, generation: str, txids: Iterable[int]) -> None:
    """Delete what a generation staged for ``txids`` (pending attempts, what a commit cut
    short after its mark left), in Redis and under the home. Best effort."""
    shutil.rmtree(rt.staging_root / f"g-{generation}", ignore_errors=True)
    area = RedisStagingArea(rt.client, rt.keyspace, generation)
    for txid in txids:
        area.discard(txid)
