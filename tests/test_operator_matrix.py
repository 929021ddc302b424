"""Operator actions meet a txid in flight (issue 65, goal 3): a rewind, a reshard, ``tables
compact``, ``tables vacuum --retention-hours 0`` and a deploy of code that adds a state, each
while the next txid is coordinated, emitted but not committed, or cut short half-way through
its commit - with Delta and Iceberg tables (upserted and appended) behind the states. Each is
either refused in one line before anything changes or exact after: the txid goes on as
Airflow's retries take it (emitted again where its batch was refused), every table equals the
state, audit is clean. An action killed at one of its own fault points and run again finishes
(the same command), and run once more after it finished changes nothing."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.helpers import produce, runtime
from tests.test_lakehouse import LINES, check_upserts, drain
from tridentflow.engines.local import LocalEngine
from tridentflow.errors import IncompleteBatchError, NotReadyError, TridentflowError
from tridentflow.faults import FaultPlan, InjectedFault
from tridentflow.ops.audit import audit
from tridentflow.ops.reset import reset_pipeline
from tridentflow.ops.reshard import ReshardRefused, reshard
from tridentflow.ops.rewind import rewind_pipeline
from tridentflow.ops.tables import compact_table, lakehouse_feeds, vacuum_table
from tridentflow.steps.committer import commit
from tridentflow.steps.coordinator import coordinate
from tridentflow.steps.emitter import emit
from tridentflow.steps.export import export
from tridentflow.steps.runtime import Runtime
from tridentflow_state.errors import StateError

ACTIONS = ("rewind", "reshard", "compact", "vacuum", "deploy")
IN_FLIGHT = ("coordinated", "emitted", "mid-commit")


def _in_flight(rt: Runtime, stage: str) -> int:
    """The next txid taken to ``stage``; its number."""
    txid = rt.ledger.committed_txid() + 1
    coordinate(rt, txid, batch_size=1)
    if stage in ("emitted", "mid-commit"):
        emit(rt, txid, LocalEngine())
    if stage == "mid-commit":
        with pytest.raises(InjectedFault):
            commit(rt.with_(faults=FaultPlan.parse(f"mid-commit@{txid}")), txid)
    return txid


def _added_state(rt: Runtime) -> Runtime:
    """The deployed code: the pipeline with one more state (``words``, counting what
    ``counts`` counts), in a new process."""
    pipeline = runtime("tests.pipelines:lakehoused", rt.redis_url, rt.home).pipeline
    counts = pipeline.states["counts"]
    pipeline.persists.append(replace(counts, state=replace(counts.state, name="words")))
    return Runtime.open(pipeline, rt.redis_url, rt.home)


def _act(rt: Runtime, action: str, killed: bool) -> Runtime:
    """Run ``action`` (``killed``: cut short at its first fault point, then run again, as
    the docs say); the runtime the pipeline goes on with."""
    if action == "rewind":
        target = rt.ledger.committed_txid() - 1
        if killed:
            with pytest.raises(InjectedFault):
                faulty = rt.with_(faults=FaultPlan.parse(f"mid-rewind@{target}#1"))
                rewind_pipeline(faulty, target, force=True)
        rewind_pipeline(rt, target, force=True)
        assert rewind_pipeline(rt, target, force=True).result  # again: nothing more
        return rt
    if action == "reshard":
        txid = rt.ledger.committed_txid() + 1
        if killed:
            with pytest.raises(InjectedFault):
                reshard(rt.with_(faults=FaultPlan.parse(f"mid-reshard@{txid}#2")), 2)
        assert reshard(rt, 2).to_shards == 2
        with pytest.raises(ReshardRefused, match="in 2 shard\\(s\\) already"):
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


KILLABLE = ("rewind", "reshard")
"""Actions with fault points of their own (table maintenance and a deploy are one step)."""
CASES = [
    pytest.param(action, stage, killed, id=f"{action}-{stage}" + "-killed" * killed)
    for action in ACTIONS
    for stage in IN_FLIGHT
    for killed in ((False, True) if action in KILLABLE else (False,))
]


@pytest.mark.parametrize(("action", "stage", "killed"), CASES)
def test_an_operator_action_meets_a_txid_in_flight_and_every_table_stays_the_state(
    lake, redis_url, redis_client, home, action, stage, killed
):
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
        rt = _act(rt, action, killed)
    except (TridentflowError, StateError) as exc:  # refused: one line, nothing changed
        assert "\n" not in str(exc), exc
        _go_on(rt, txid)  # the txid first, then the action goes through
        rt = _act(rt, action, killed=False)
    _go_on(rt, min(txid, rt.ledger.committed_txid() + 1))
    drain(rt)
    check_upserts(rt)
    report = audit(rt)
    assert report.ok, report.line()
