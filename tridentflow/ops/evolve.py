"""Pipelines that evolve, by hand: ``tridentflow evolve PIPELINE --drop-state NAME``,
``--rename-state OLD=NEW`` and ``--migrate NAME=module:function``.

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

Renaming moves a kept state's keys, in place, to the name the deployed code gives it (same
kind, aggregator and key fields; the new name holding no committed values yet), between two
txids:

1. the record marks OLD "being renamed to NEW": from then on a commit of code that has
   either name is refused in one line before it writes (it retries once the rename is done);
2. a commit attempt of the next txid is begun and every shard claimed with its token, so an
   attempt already under way is fenced: none of its later writes lands;
3. what such an attempt wrote under NEW is deleted (the record then says "moving"), and every
   key of OLD is renamed to NEW's name in its own slot (RENAME: one key at a time, atomic
   each; a key already moved is not found again);
4. NEW takes OLD's place in the record (its shape, since when it counts, the change logs).

Killed at any point, the same command finishes the job.

Migrating rewrites every value of a state the deployed code has with a user function - for a
code whose aggregator stores its values another way (same kind and key fields) - between two
txids, fenced like a rename (the record marks it, commits of code with the state are refused
and retry, an attempt under way is fenced), one key at a time: the state's hash of each shard
and its undo and change logs, so a query as of an older txid, a rewind and a sink all see the
new form (a sink that can reloads at its next export: the rows it holds are of the old
form; a stream's rows stay as its readers read them, said by the command). Each key is copied
through the function in chunks and swapped in atomically with a
note that it is done, so a kill at any point transforms no value twice and the same command
finishes the job. Then the record takes the code's shape for the state and notes the
function among the state's migrations: the same command run again after it finished - killed
before it said "done", or simply run twice - is a no-op that says so (never a second
transform of every value).
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tridentflow.errors import EvolveRefusedError
from tridentflow.steps.export import owe_reloads
from tridentflow.steps.recorded_settings import (
    CHANGE_LOGS,
    DROPPING,
    MIGRATED,
    MIGRATING,
    MOVING,
    RENAMING,
    SHAPE,
    STATES,
    shapes,
)
from tridentflow.steps.runtime import Runtime
from tridentflow_state.backing import Fence
from tridentflow_state.evolve import (
    delete_state_keys,
    finish_migration,
    migrate_state_keys,
    rename_state_keys,
    state_keys,
)
from tridentflow_state.keys import KeySpace
from tridentflow_state.reshard import plan_under_way
from tridentflow_state.shards import claim_shards


@dataclass(frozen=True)
class DropResult:
    state: str
    keys_deleted: int

    def to_json(self) -> dict[str, object]:
        return {"state": self.state, "keys_deleted": self.keys_deleted}


def drop_state(rt: Runtime, name: str) -> DropResult:
    """Delete state ``name`` - one the pipeline's code no longer has - for good (see the
    module doc). Idempotent and resumable; EvolveRefusedError (one line) with nothing changed if
    the code has the state, or nothing by that name is recorded or stored."""
    pipeline = rt.pipeline.name
    if name in rt.pipeline.states:
        raise EvolveRefusedError(
            f"state {name} is still in the code of pipeline {pipeline}: deploy the code "
            f"without it before dropping it (to count it afresh instead: a new state name, "
            f"or `tridentflow reset {pipeline}`)"
        )
    states = _recorded_states(rt)
    if name not in states and next(state_keys(rt.client, rt.keyspace, name), None) is None:
        kept = sorted(set(states) - set(rt.pipeline.states))
        raise EvolveRefusedError(
            f"pipeline {pipeline} has no state {name} to drop (states kept from older code: "
            f"{', '.join(kept) or 'none'})"
        )
    if name in states and not states[name].get(DROPPING):
        _mark(rt, name, **{DROPPING: True})
    deleted = delete_state_keys(rt.client, rt.keyspace, name)
    _replace_in_record(rt, name, None)
    return DropResult(name, deleted)


def _recorded_states(rt: Runtime) -> dict[str, dict[str, object]]:
    plan = plan_under_way(rt.client, rt.keyspace)
    if plan is not None:
        raise EvolveRefusedError(
            f"pipeline {rt.pipeline.name} is being resharded to {plan.to_shards} shards: "
            f"finish that first (`tridentflow reshard {rt.pipeline.name} --shards "
            f"{plan.to_shards} --yes`)"
        )
    return dict(json.loads(rt.ledger.settings().get(STATES, "{}")))


def _mark(rt: Runtime, name: str, **fields: object) -> None:
    """Add ``fields`` to state ``name``'s entry in the record (the step under way)."""
    states = _recorded_states(rt)
    states[name] = {**states[name], **fields}
    rt.ledger.record_settings({STATES: json.dumps(states, sort_keys=True)})


def _replace_in_record(rt: Runtime, old: str, new: str | None) -> None:
    """State ``old`` leaves the record - its shape, its place among the states whose change
    logs the commits write - and ``new`` (if any) takes it: the code's shape for it, counting
    since ``old`` did. Idempotent."""
    recorded = rt.ledger.settings()
    states = json.loads(recorded.get(STATES, "{}"))
    values = {}
    if old in states:
        since = states.pop(old).get("since")
        if new is not None:
            states[new] = {**shapes(rt)[new], "since": since}
        values[STATES] = json.dumps(states, sort_keys=True)
    logged = json.loads(recorded.get(CHANGE_LOGS, "[]"))
    if old in logged:
        values[CHANGE_LOGS] = json.dumps(sorted({*logged, *([new] if new else [])} - {old}))
    if values:
        rt.ledger.record_settings(values)


@dataclass(frozen=True)
class RenameResult:
    old: str
    new: str
    keys_moved: int

    def to_json(self) -> dict[str, object]:
        return {"old": self.old, "new": self.new, "keys_moved": self.keys_moved}


def rename_state(rt: Runtime, old: str, new: str) -> RenameResult:
    """Rename kept state ``old`` to ``new``, the name the deployed code gives it (see the
    module doc). Idempotent and resumable; EvolveRefusedError (one line) with nothing changed when
    it cannot apply."""
    states = _recorded_states(rt)
    entry = states.get(old)
    if entry is not None and entry.get(MIGRATING):
        raise EvolveRefusedError(
            f"state {old} of {rt.pipeline.name} is being migrated with {entry[MIGRATING]}: "
            "finish that first"
        )
    if entry is None or not entry.get(RENAMING):
        _check_renamable(rt, states, old, new)
        _mark(rt, old, **{RENAMING: new})
    elif entry[RENAMING] != new:
        raise EvolveRefusedError(
            f"state {old} of {rt.pipeline.name} is being renamed to {entry[RENAMING]}: "
            f"finish that first (`tridentflow evolve {rt.pipeline.name} --rename-state "
            f"{old}={entry[RENAMING]}`)"
        )
    fence_the_next_txid(rt, (old, new))
    if not _recorded_states(rt)[old].get(MOVING):  # a fenced attempt may have written as NEW
        delete_state_keys(rt.client, rt.keyspace, new)
        _mark(rt, old, **{MOVING: True})
    moved = rename_state_keys(rt.client, rt.keyspace, old, new)
    _replace_in_record(rt, old, new)
    return RenameResult(old, new, moved)


def _check_renamable(rt: Runtime, states: dict[str, dict[str, object]], old: str, new: str) -> None:
    pipeline = rt.pipeline.name
    if old in rt.pipeline.states:
        raise EvolveRefusedError(
            f"state {old} is still in the code of pipeline {pipeline}: deploy the code that "
            f"names it {new} first"
        )
    if new not in rt.pipeline.states:
        raise EvolveRefusedError(
            f"the code of pipeline {pipeline} has no state {new}: deploy the code that names "
            f"the state {new} first"
        )
    if old not in states:
        kept = sorted(set(states) - set(rt.pipeline.states))
        raise EvolveRefusedError(
            f"pipeline {pipeline} has no state {old} to rename (states kept from older "
            f"code: {', '.join(kept) or 'none'})"
        )
    own = shapes(rt)[new]
    differ = [f for f in SHAPE if states[old].get(f) != own[f]]
    if differ:
        was = ", ".join(f"{f} {states[old].get(f)}" for f in differ)
        now = ", ".join(f"{f} {own[f]}" for f in differ)
        raise EvolveRefusedError(
            f"state {old} of {pipeline} holds values made with {was}; the code makes {new} "
            f"with {now}: a rename keeps the values, so only to the same kind, aggregator "
            "and key fields"
        )
    since = states.get(new, {}).get("since")
    committed = rt.ledger.committed_txid()
    if new in states and (since is None or int(str(since)) <= committed):
        raise EvolveRefusedError(
            f"state {new} of {pipeline} already holds values (since txid {since}): a rename "
            f"moves {old} into a name with none; drop {new} first (deploy code without it, "
            f"then `tridentflow evolve {pipeline} --drop-state {new}`), or rewind"
        )


def fence_the_next_txid(
    rt: Runtime, names: Iterable[str], keyspace: KeySpace | None = None
) -> Fence | None:
    """Begin a commit attempt of the next txid and claim every shard of ``keyspace`` (the
    runtime's by default) with its token: an attempt already under way writes nothing more
    (its writes are refused as fenced) nor marks its txid. That attempt's fence (None: no
    txid left to fence, which cannot happen while commits are refused)."""
    ticket = rt.ledger.begin_commit(rt.ledger.committed_txid() + 1)
    if ticket is None:  # the txid committed between the two reads: fence the one after
        ticket = rt.ledger.begin_commit(rt.ledger.committed_txid() + 1)
    if ticket is None:
        return None
    fence = Fence(ticket.txid, ticket.token, ticket.generation)
    claim_shards(rt.client, keyspace or rt.keyspace, list(names), fence)
    return fence


@dataclass(frozen=True)
class MigrateResult:
    state: str
    function: str
    keys_migrated: int
    already: bool = False
    """The state was migrated with this function before: nothing was done."""
    kept_as_written: tuple[str, ...] = ()
    """The state's sinks that cannot reload (streams their readers read): their rows of
    before the migration stay in the old form. The others reload at their next export."""

    def to_json(self) -> dict[str, object]:
        return {"state": self.state, "function": self.function,
                "keys_migrated": self.keys_migrated, "already": self.already,
                "kept_as_written": list(self.kept_as_written)}  # fmt: skip


def migrate_state(rt: Runtime, name: str, ref: str) -> MigrateResult:
    """Rewrite every value of state ``name`` with the function ``ref`` (``module:function``)
    names (see the module doc). Idempotent and resumable with the same function;
    EvolveRefusedError (one line) with nothing changed when it cannot apply."""
    function = load_function(ref)
    states = _recorded_states(rt)
    entry = states.get(name)
    if entry is not None and not entry.get(MIGRATING) and ref in entry.get(MIGRATED, ()):
        return MigrateResult(name, ref, 0, already=True)  # finished before: never twice
    if entry is None or not entry.get(MIGRATING):
        _check_migratable(rt, states, name)
        _mark(rt, name, **{MIGRATING: ref})
    elif entry[MIGRATING] != ref:
        raise EvolveRefusedError(
            f"state {name} of {rt.pipeline.name} is being migrated with {entry[MIGRATING]}: "
            f"finish that first, with the same function"
        )
    fence_the_next_txid(rt, (name,))
    migrated = migrate_state_keys(rt.client, rt.keyspace, name, function)
    # before the record says "done": a table's rows of before are in the old form
    kept = owe_reloads(rt, name, f"evolve --migrate {name}={ref}")
    states = _recorded_states(rt)
    since = states[name].get("since")
    done = [*states[name].get(MIGRATED, ()), ref]
    states[name] = {**shapes(rt)[name], "since": since, MIGRATED: done}
    rt.ledger.record_settings({STATES: json.dumps(states, sort_keys=True)})
    finish_migration(rt.client, rt.keyspace, name)
    return MigrateResult(name, ref, migrated, kept_as_written=tuple(kept))


def _check_migratable(rt: Runtime, states: dict[str, dict[str, object]], name: str) -> None:
    pipeline = rt.pipeline.name
    if name not in rt.pipeline.states:
        raise EvolveRefusedError(
            f"the code of pipeline {pipeline} has no state {name}: a migration rewrites the "
            "values of a state the deployed code has (deploy it first)"
        )
    if name not in states or states[name].get(RENAMING):
        raise EvolveRefusedError(
            f"state {name} of {pipeline} holds no committed values to migrate"
            if name not in states
            else f"state {name} of {pipeline} is being renamed: finish that first"
        )
    own = shapes(rt)[name]
    differ = [f for f in ("kind", "keys") if states[name].get(f) != own[f]]
    if differ:
        was = ", ".join(f"{f} {states[name].get(f)}" for f in differ)
        now = ", ".join(f"{f} {own[f]}" for f in differ)
        raise EvolveRefusedError(
            f"state {name} of {pipeline} holds values with {was}; the code has {now}: a "
            "migration rewrites values, not keys or kinds - give the state a new name, or "
            "reset"
        )


def load_function(ref: str) -> Any:
    """The callable ``module:function`` names; EvolveRefusedError (one line) if there is none."""
    module_name, colon, attr = ref.partition(":")
    if not (colon and module_name and attr):
        raise EvolveRefusedError(f"--migrate takes NAME=module:function, got a function {ref!r}")
    try:
        function = getattr(importlib.import_module(module_name), attr)
    except Exception as exc:
        raise EvolveRefusedError(
            f"cannot load the migration {ref}: {type(exc).__name__}: {exc}"
        ) from None
    if not callable(function):
        raise EvolveRefusedError(
            f"the migration {ref} is a {type(function).__name__}, not callable"
        )
    return function
