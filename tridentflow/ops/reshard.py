"""``tridentflow reshard PIPELINE --shards M --yes``: a pipeline with committed state moves to
M state shards without a reset, between two txids.

1. The ledger records the plan - from N shards in layout L to M shards in a new layout L'
   whose hash tags differ from L's (state.keys.shard_tags) - in one HSETNX: from then on
   every commit is refused in one line before it writes (ReshardUnderWayError: an Airflow task
   retries it) and every other reshard or ``evolve`` step is refused.
2. A commit attempt of the next txid is begun and every old shard claimed with its token:
   an attempt already under way writes nothing more there, nor marks its txid.
3. Every key of every state in layout L - values, expiry index, written-sets, undo logs,
   change logs - is copied into layout L', field by field into the shard each key's CRC-32
   gives it among M, in chunks (state.reshard; memory bounded by the chunk); each key copied
   whole is noted, so a rerun skips it. The new shards get their fences and generation.
4. With ``--wait-replicas`` (TRIDENTFLOW_WAIT_REPLICAS), the copy must be on that many
   replicas of every new shard's master first, and the switch on the ledger's after.
   The ledger names L' (shard count, layout number, the plan's next phase: one HSET). From
   here a reader or a step that read L finds it moved and reads L' (a commit is told to run
   again).
5. The old shards' fences close for good, then L's keys are deleted, in chunks; the plan
   goes.

Killed at any point (the ``mid-reshard`` fault point), the same command finishes the job;
the recorded shard count changes only when every key has been copied. A batch staged before
the reshard still commits: its blocks are read back and routed to the new shards.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from tridentflow.errors import ReshardRefusedError
from tridentflow.ops.evolve import fence_the_next_txid
from tridentflow.steps.recorded_settings import DROPPING, MIGRATING, RENAMING, STATES
from tridentflow.steps.runtime import Runtime
from tridentflow.steps.staging import RedisStagingArea
from tridentflow_state.keys import check_shards
from tridentflow_state.reshard import (
    Plan,
    close_old_fences,
    copy_layout,
    delete_old_layout,
    finish,
    next_layout,
    plan_under_way,
    prepare_fences,
    record_plan,
    switch_layout,
)
from tridentflow_state.shards import stored_layout


@dataclass(frozen=True)
class ReshardResult:
    pipeline: str
    from_shards: int
    to_shards: int
    layout: int
    keys_copied: int
    fields_copied: int
    keys_deleted: int
    seconds: float

    def to_json(self) -> dict[str, object]:
        return {
            "pipeline": self.pipeline,
            "from_shards": self.from_shards,
            "to_shards": self.to_shards,
            "layout": self.layout,
            "keys_copied": self.keys_copied,
            "fields_copied": self.fields_copied,
            "keys_deleted": self.keys_deleted,
            "seconds": round(self.seconds, 3),
            "line": self.line(),
        }

    def line(self) -> str:
        """What was done, in one line (the CLI's output, the view's answer)."""
        return (
            f"reshard: pipeline {self.pipeline} moved from {self.from_shards} to "
            f"{self.to_shards} shard(s): {self.keys_copied} key(s), {self.fields_copied} "
            f"field(s) copied, {self.keys_deleted} old key(s) deleted in {self.seconds:.1f}s"
        )


def reshard(rt: Runtime, shards: int) -> ReshardResult:
    """Move pipeline ``rt.pipeline``'s state to ``shards`` shards (see the module doc).
    Idempotent and resumable with the same count; ReshardRefusedError (one line) with nothing
    changed when it cannot apply."""
    started = time.monotonic()
    try:
        check_shards(shards)
    except ValueError as exc:
        raise ReshardRefusedError(f"--shards: {exc}") from None
    client, base, name = rt.client, rt.keyspace, rt.pipeline.name
    plan = plan_under_way(client, base)
    if plan is None:
        plan = _new_plan(rt, shards)
        if not record_plan(client, base, plan):  # another reshard recorded its plan first
            plan = plan_under_way(client, base)
            assert plan is not None
    if plan.to_shards != shards:
        raise ReshardRefusedError(
            f"pipeline {name} is being resharded to {plan.to_shards} shards: finish that "
            f"first (`tridentflow reshard {name} --shards {plan.to_shards} --yes`)"
        )
    keys = fields = 0
    if plan.phase == "copying":
        fence = fence_the_next_txid(rt, _state_names(rt), plan.old(base))
        assert fence is not None, "no commit can land while the plan is recorded"
        committed = fence.txid - 1
        keys, fields = copy_layout(client, base, plan, lambda: _fault(rt, committed, 1))
        _fault(rt, committed, 2)
        prepare_fences(client, base, plan, fence)
        then = "run the same reshard again once they caught up"
        rt.require_replicated("the reshard's copy", then, shards=True, also=plan.new(base))
        switch_layout(client, base, plan)
        rt.require_replicated("the reshard's switch to the new layout", then)
        _fault(rt, committed, 3)
    committed = rt.ledger.committed_txid()
    close_old_fences(client, base, plan)
    _discard_unlisted_staging(rt, plan)
    deleted = delete_old_layout(client, base, plan, lambda: _fault(rt, committed, 4))
    finish(client, base)
    return ReshardResult(name, plan.from_shards, plan.to_shards, plan.to_layout, keys, fields,
                         deleted, time.monotonic() - started)  # fmt: skip


def _discard_unlisted_staging(rt: Runtime, plan: Plan) -> None:
    """Blocks of the pending txids that emits which died part-way left in the old layout:
    the commits' cleanup looks in the layouts their manifests name, so these go now (a
    batch a manifest lists stays, to commit in the new layout)."""
    area = RedisStagingArea(rt.client, rt.keyspace, rt.ledger.generation)
    for txid in rt.ledger.pending_txids():
        area.discard_unlisted(plan.old(rt.keyspace), txid)


def _fault(rt: Runtime, committed: int, point: int) -> None:
    rt.faults.fire("mid-reshard", committed + 1, point)


def _new_plan(rt: Runtime, shards: int) -> Plan:
    """The plan from the stored layout to ``shards``; ReshardRefusedError if there is nothing to
    move or another step is under way."""
    client, base, name = rt.client, rt.keyspace, rt.pipeline.name
    stored = stored_layout(client, base)
    if stored is None or rt.ledger.committed_txid() == 0:
        raise ReshardRefusedError(
            f"pipeline {name} has no committed state to move: set state_shards={shards} in "
            "its code (or TRIDENTFLOW_STATE_SHARDS) before its first run"
        )
    if stored[0] == shards:
        raise ReshardRefusedError(f"pipeline {name}'s state is in {shards} shard(s) already")
    for state, entry in json.loads(rt.ledger.settings().get(STATES, "{}")).items():
        for mark, what in ((DROPPING, "dropped"), (RENAMING, "renamed"), (MIGRATING, "migrated")):
            if entry.get(mark):
                raise ReshardRefusedError(
                    f"state {state} of {name} is being {what} (`tridentflow evolve`): finish "
                    "that first"
                )
    return Plan(stored[0], stored[1], shards, next_layout(client, base), "copying")


def _state_names(rt: Runtime) -> list[str]:
    recorded = json.loads(rt.ledger.settings().get(STATES, "{}"))
    return sorted({*recorded, *rt.pipeline.states})
