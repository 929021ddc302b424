"""Operator actions meet a txid in flight (issue 65, goal 3): a rewind, a reshard, ``tables
compact``, ``tables vacuum --retention-hours 0``, a deploy of code that adds a state, and the
evolutions a deploy asks for - ``evolve --drop-state``, ``--rename-state``, ``--migrate`` - each
while the next txid is coordinated, emitted (by the old code) but not committed, or cut short
half-way through its commit; behind the states, every sink kind: Delta and Iceberg tables
(upserted and appended), PostgreSQL tables and a Redis stream. Each action is either refused in
one line before anything changes or exact after: the txid goes on as Airflow's retries take it
(emitted again where its batch was refused), every table and the stream equal the state, audit
is clean. An action killed part-way and run again finishes (the same command), and run once
more after it finished changes nothing (or is refused in one line)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.helpers import produce, runtime
from tests.pipelines import lakehoused
from tests.postgres import table_rows
from tests.test_lakehouse import LINES, UPSERT, drain, keyed, state_of
from tests.test_lakehouse import table_rows as lake_rows
from tridentflow.aggregators import Count
from tridentflow.devtools.chaos.sinks import _stream_view, jsonish
from tridentflow.engines.local import LocalEngine
from tridentflow.errors import IncompleteBatchError, NotReadyError, TridentflowError
from tridentflow.faults import FaultPlan, InjectedFaultError
from tridentflow.ops.audit import audit
from tridentflow.ops.evolve import EvolveRefusedError, drop_state, migrate_state, rename_state
from tridentflow.ops.reset import reset_pipeline
from tridentflow.ops.reshard import ReshardRefusedError, reshard
from tridentflow.ops.rewind import rewind_pipeline
from tridentflow.ops.tables import compact_table, lakehouse_feeds, vacuum_table
from tridentflow.steps.committer import commit
from tridentflow.steps.coordinator import coordinate
from tridentflow.steps.emitter import emit
from tridentflow.steps.export import export
from tridentflow.steps.runtime import Runtime
from tridentflow_state.errors import StateError

EVOLVES = ("drop", "rename", "migrate")
ACTIONS = ("rewind", "reshard", "compact", "vacuum", "deploy", *EVOLVES)
IN_FLIGHT = ("coordinated", "emitted", "mid-commit")


def _in_flight(rt: Runtime, stage: str) -> int:
    """The next txid taken to ``stage``; its number."""
    txid = rt.ledger.committed_txid() + 1
    coordinate(rt, txid, batch_size=1)
    if stage in ("emitted", "mid-commit"):
        emit(rt, txid, LocalEngine())
    if stage == "mid-commit":
        with pytest.raises(InjectedFaultError):
            commit(rt.with_(faults=FaultPlan.parse(f"mid-commit@{txid}")), txid)
    return txid


def _added_state(rt: Runtime) -> Runtime:
    """The deployed code: the pipeline with one more state (``words``, counting what
    ``counts`` counts), in a new process."""
    pipeline = runtime("tests.pipelines:lakehoused", rt.redis_url, rt.home).pipeline
    counts = pipeline.states["counts"]
    pipeline.persists.append(replace(counts, state=replace(counts.state, name="words")))
    return Runtime.open(pipeline, rt.redis_url, rt.home)


class BoxedCount(Count):
    """The counts' aggregator of the migrating deploy: stores ``{"n": count}`` where Count
    stored the count, presents the count (the tables do not change)."""

    def init(self, *values):
        return {"n": 1}

    def combine(self, a, b):
        return {"n": a["n"] + b["n"]}

    def zero(self):
        return {"n": 0}

    def present(self, value):
        return value["n"]


def boxed(value):
    """The migration from Count's stored form to BoxedCount's (a second pass fails loudly)."""
    if isinstance(value, dict):
        raise TypeError(f"already migrated: {value}")
    return {"n": value}


EVOLVED = {"drop": {"kv_state": False}, "rename": {"counts_state": "tallies"},
           "migrate": {"count": BoxedCount()}}  # fmt: skip
"""The code each evolution is deployed with."""


def _evolution(new: Runtime, action: str):
    if action == "drop":
        return lambda: drop_state(new, "kv")
    if action == "rename":
        return lambda: rename_state(new, "counts", "tallies")
    return lambda: migrate_state(new, "counts", "tests.test_operator_matrix:boxed")


def _killed_part_way(patch: pytest.MonkeyPatch, action: str) -> None:
    """Make ``action`` die (ConnectionError) after its first key: a drop after one chunk of
    deletes, a rename after one key moved, a migration after one key swapped."""
    import tridentflow_state.evolve as evolve_keys

    done: list[object] = []

    def once(original):
        def cut(*args):
            if done:
                raise ConnectionError("killed")
            done.append(args)
            return original(*args)

        return cut

    if action == "drop":
        patch.setattr(evolve_keys, "DELETE_CHUNK", 1)
        patch.setattr(evolve_keys, "_unlink", once(evolve_keys._unlink))
    elif action == "rename":

        def one_key_moved(client, keyspace, old, new):
            for key, target in evolve_keys._keys_of(client, keyspace, old, new):
                client.rename(key, target)
                raise ConnectionError("killed")
            return 0

        patch.setattr("tridentflow.ops.evolve.rename_state_keys", one_key_moved)
    else:
        patch.setattr(evolve_keys, "SWAP_MIGRATED", once(evolve_keys.SWAP_MIGRATED))


def _evolve(rt: Runtime, action: str, killed: bool, patch: pytest.MonkeyPatch) -> Runtime:
    """Deploy the code ``action`` is for, then run ``action`` (``killed``: cut short, then the
    same command again), then once more: a no-op or a one-line refusal."""
    new = Runtime.open(lakehoused(**EVOLVED[action]), rt.redis_url, rt.home)
    run = _evolution(new, action)
    if killed:
        with patch.context() as cut:
            _killed_part_way(cut, action)
            with pytest.raises(ConnectionError):
                run()
    run()
    try:
        again = run()
    except EvolveRefusedError as exc:
        assert "\n" not in str(exc), exc
    else:
        assert getattr(again, "already", False) or getattr(again, "keys_moved", 1) == 0, again
    return new


def _act(rt: Runtime, action: str, killed: bool, patch: pytest.MonkeyPatch) -> Runtime:
    """Run ``action`` (``killed``: cut short at its first fault point, then run again, as
    the docs say); the runtime the pipeline goes on with."""
    if action in EVOLVES:
        return _evolve(rt, action, killed, patch)
    if action == "rewind":
        target = rt.ledger.committed_txid() - 1
        if killed:
            with pytest.raises(InjectedFaultError):
                faulty = rt.with_(faults=FaultPlan.parse(f"mid-rewind@{target}#1"))
                rewind_pipeline(faulty, target, force=True)
        rewind_pipeline(rt, target, force=True)
        assert rewind_pipeline(rt, target, force=True).result  # again: nothing more
        return rt
    if action == "reshard":
        txid = rt.ledger.committed_txid() + 1
        if killed:
            with pytest.raises(InjectedFaultError):
                reshard(rt.with_(faults=FaultPlan.parse(f"mid-reshard@{txid}#2")), 2)
        assert reshard(rt, 2).to_shards == 2
        with pytest.raises(ReshardRefusedError, match="in 2 shard\\(s\\) already"):
            reshard(rt, 2)  # again: nothing more, said in one line
        return Runtime(rt.pipeline, rt.client, rt.home, shards=2)
    if action in ("compact", "vacuum"):
        for _ in range(2):  # the second run changes nothing
            for feed in lakehouse_feeds(rt):
                if action == "compact":
                    compact_table(feed)
                else:
                    vacuum_table(rt, feed, 0, apply=True)
        return rt
    return _added_state(rt)


def _go_on(rt: Runtime, txid: int) -> None:
    """The txid in flight, as Airflow's retries take it: coordinate, emit, commit; a batch
    refused for the code that emitted it is emitted again."""
    if rt.ledger.committed_txid() >= txid:
        return
    coordinate(rt, txid, batch_size=1)
    try:
        commit(rt, txid)
    except (NotReadyError, IncompleteBatchError):  # nothing staged, or by other code: emit
        emit(rt, txid, LocalEngine())
        commit(rt, txid)


KILLABLE = ("rewind", "reshard", *EVOLVES)
"""Actions that can be cut short part-way (table maintenance and a deploy are one step)."""
CASES = [
    pytest.param(action, stage, killed, id=f"{action}-{stage}" + "-killed" * killed)
    for action in ACTIONS
    for stage in IN_FLIGHT
    for killed in ((False, True) if action in KILLABLE else (False,))
]


@pytest.mark.parametrize(("action", "stage", "killed"), CASES)
def test_an_operator_action_meets_a_txid_in_flight_and_every_table_stays_the_state(
    lake, redis_url, redis_client, home, pg_dsn, monkeypatch, action, stage, killed
):
    monkeypatch.setenv("TF_TEST_PG_DSN", pg_dsn)
    rt = runtime("tests.pipelines:lakehoused", redis_url, home)
    reset_pipeline(rt, force=True, source=True)
    produce(rt, LINES)
    for txid in (1, 2, 3):  # three txids committed and exported
        coordinate(rt, txid, batch_size=1)
        emit(rt, txid, LocalEngine())
        commit(rt, txid)
        export(rt)
    txid = _in_flight(rt, stage)
    try:
        rt = _act(rt, action, killed, monkeypatch)
    except (TridentflowError, StateError) as exc:  # refused: one line, nothing changed
        assert "\n" not in str(exc), exc
        _go_on(rt, txid)  # the txid first, then the action goes through
        rt = _act(rt, action, False, monkeypatch)
    _go_on(rt, min(txid, rt.ledger.committed_txid() + 1))
    drain(rt)
    check_every_sink(rt, pg_dsn)
    report = audit(rt)
    assert report.ok, report.line()


def check_every_sink(rt: Runtime, pg_dsn: str) -> None:
    """Every table the deployed code exports to, and the counts' stream, equal its state."""
    counts = next(f.state for f in rt.pipeline.feeds if f.name == "delta-counts")
    states = {"counts": counts, "kv": "kv"}
    for name, state in UPSERT.items():
        if states[state] not in rt.pipeline.states:
            continue  # dropped: its tables are left as they were
        key, value = ("word", "count") if state == "counts" else ("key", "value")
        rows = lake_rows(rt, name)
        assert keyed(rows, key, value) == state_of(rt, states[state]), name
        assert len(rows) == len(state_of(rt, states[state])), name  # one row per key
    assert table_rows(pg_dsn, "lake_counts", "word") == {
        w: (c,) for w, c in state_of(rt, counts).items()
    }
    if "kv" in rt.pipeline.states:
        assert table_rows(pg_dsn, "lake_kv", "key") == {
            k: (v,) for k, v in state_of(rt, "kv").items()
        }
    stream = next(f.sink for f in rt.pipeline.feeds if f.name == "stream-counts")
    shown, problem = _stream_view(rt, stream, rt.ledger.lineage())
    assert problem is None, problem
    assert shown == {w: jsonish(c) for w, c in state_of(rt, counts).items()}
