"""Pipelines that evolve, by hand: ``tridentflow evolve PIPELINE --drop-state NAME``.

A state the pipeline's code no longer has is kept untouched (its values, undo logs and change
logs; ``status`` lists it under "kept"), so that deploying code without it loses nothing and a
``rewind`` or the previous code can still use it. Dropping it deletes all of that for good, in
three steps, each idempotent - run the command again after a kill and it finishes:

1. the record marks the state "being dropped": from then on a commit of code that still has
   the state is refused in one line, before it writes (a straggler of the old code);
2. every key of the state is deleted (tridentflow_state.evolve: values, expiry index,
   written-sets, undo logs, change logs and their seals, in every shard);
3. the state leaves the record (its shape, and the states whose change logs sinks read).

Refused in one line, with nothing changed, while the code still has the state or when
nothing by that name is recorded or stored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from tridentflow.errors import TridentflowError
from tridentflow.steps.recorded_settings import CHANGE_LOGS, DROPPING, STATES
from tridentflow.steps.runtime import Runtime
from tridentflow_state.evolve import delete_state_keys, state_keys


class EvolveRefused(TridentflowError):
    """An evolution step that cannot apply as asked: nothing was changed."""

    retry_helps = False


@dataclass(frozen=True)
class DropResult:
    state: str
    keys_deleted: int

    def to_json(self) -> dict[str, object]:
        return {"state": self.state, "keys_deleted": self.keys_deleted}


def drop_state(rt: Runtime, name: str) -> DropResult:
    """Delete state ``name`` - one the pipeline's code no longer has - for good (see the
    module doc). Idempotent and resumable; EvolveRefused (one line) with nothing changed if
    the code has the state, or nothing by that name is recorded or stored."""
    pipeline = rt.pipeline.name
    if name in rt.pipeline.states:
        raise EvolveRefused(
            f"state {name} is still in the code of pipeline {pipeline}: deploy the code "
            f"without it before dropping it (to count it afresh instead: a new state name, "
            f"or `tridentflow reset {pipeline}`)"
        )
    states = _recorded_states(rt)
    if name not in states and next(state_keys(rt.client, rt.keyspace, name), None) is None:
        kept = sorted(set(states) - set(rt.pipeline.states))
        raise EvolveRefused(
            f"pipeline {pipeline} has no state {name} to drop (states kept from older code: "
            f"{', '.join(kept) or 'none'})"
        )
    if name in states and not states[name].get(DROPPING):
        states[name] = {**states[name], DROPPING: True}
        rt.ledger.record_settings({STATES: json.dumps(states, sort_keys=True)})
    deleted = delete_state_keys(rt.client, rt.keyspace, name)
    _forget(rt, name)
    return DropResult(name, deleted)


def _recorded_states(rt: Runtime) -> dict[str, dict[str, object]]:
    return dict(json.loads(rt.ledger.settings().get(STATES, "{}")))


def _forget(rt: Runtime, name: str) -> None:
    """Take ``name`` out of the record: its shape, and the states whose change logs the
    commits write (a sink of it is gone with it)."""
    recorded = rt.ledger.settings()
    states = json.loads(recorded.get(STATES, "{}"))
    values = {}
    if name in states:
        del states[name]
        values[STATES] = json.dumps(states, sort_keys=True)
    logged = json.loads(recorded.get(CHANGE_LOGS, "[]"))
    if name in logged:
        values[CHANGE_LOGS] = json.dumps([s for s in logged if s != name])
    if values:
        rt.ledger.record_settings(values)
