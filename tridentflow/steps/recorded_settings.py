"""A pipeline's settings that change what its commits write, recorded with the pipeline in
Redis, so that every component - Airflow's tasks, the CLI, the view - reads the same:

* ``retain_txids``: how many committed txids of undo logs the commits keep (``query --as-of``,
  ``rewind``);
* ``change_logs``: the states whose commits write a change log (what sinks and new-values
  streams read), and ``change_log_limit``, how many of them are kept;
* ``states``: each state's shape - its kind, its aggregator, its key fields (and what it
  aggregates, its expiry) - and the txid it was first committed in. A pipeline evolves: a new
  state starts empty at the next txid ("since txid T"), a state the code no longer has is kept
  untouched, another expiry applies from the next txid; another kind, aggregator or key fields
  on a state that holds values is refused before anything is written (the values were made
  by the old one), in one line naming the change and the ways out.

(The state's shard count is recorded the same way by ``tridentflow_state.shards``.)

Where this process's value comes from decides what a difference from the record means:

* the pipeline's code, or the command line (``run --retain-txids``, ``tridentflow settings
  --record``): a change - the next commit records it, and every component follows;
* the environment (``TRIDENTFLOW_RETAIN_TXIDS``): this process's default. Once the pipeline has
  a recorded value, that one holds: readers use it (``status`` says the environment differs)
  and a commit whose environment says otherwise is refused in one line, so that one
  component's environment cannot decide for the others.

A commit that would write change logs of fewer states than recorded (a process holding another
version of the pipeline, without one of its sinks) is refused in one line too: the sink would
miss that txid's changes. Every check is read-only; ``record`` is idempotent.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tridentflow.errors import (
    SettingsDisagreeError,
    StateEvolvingError,
    StateShapeChangedError,
)
from tridentflow.steps.runtime import FROM_CODE, FROM_COMMAND_LINE, FROM_DEFAULT
from tridentflow_state.batch_times import ExpiryRule

if TYPE_CHECKING:
    from tridentflow.steps.runtime import Runtime

RETAIN = "retain_txids"
CHANGE_LOGS = "change_logs"
CHANGE_LOG_LIMIT = "change_log_limit"
STATES = "states"
DROPPING = "dropping"
"""A state's field in the ``states`` record while ``tridentflow evolve --drop-state`` deletes
it: a commit of code that has the state is refused."""
RENAMING = "renaming_to"
"""A state's field in the ``states`` record while ``evolve --rename-state`` moves it: the new
name. A commit of code that has either name is refused."""
MIGRATING = "migrating_with"
"""A state's field in the ``states`` record while ``evolve --migrate`` rewrites its values:
the function's ``module:function``. A commit of code that has the state is refused."""
ORIGIN = "origin"
"""Where the pipeline's code was loaded from (``Pipeline.origin``: its ``module:attribute`` and
the folder that imports it), recorded by its first commit that knows it: the CLI loads a
pipeline given by name from it (``tridentflow status user-sums`` from any folder)."""
MIGRATED = "migrated_with"
"""A state's field in the ``states`` record once ``evolve --migrate`` finished: every function
(``module:function``) that rewrote its values, in order. The same migration run again (after
a kill before it said "done") is a no-op: it would transform every value twice."""
MOVING = "moving"
"""Set with RENAMING once the rename's keys are moving (what was under the new name is gone)."""
SHAPE = ("kind", "aggregator", "keys")
"""What a state's values are made by: another one makes the stored values wrong."""


def shapes(rt: Runtime) -> dict[str, dict[str, Any]]:
    """Each state's shape in this process's code (see the module doc)."""
    out = {}
    for name, persist in rt.pipeline.states.items():
        aggregator = getattr(persist.aggregator, "inner", persist.aggregator)  # a guard's
        kind = type(aggregator)
        out[name] = {
            "kind": persist.state.kind.value,
            "aggregator": f"{kind.__module__}.{kind.__qualname__}",
            "keys": list(persist.group_fields),
            "in": list(persist.in_fields),
            "expire_after_txids": persist.state.expire_after_txids,
            "expire_after_ms": (persist.state.expiry or ExpiryRule()).after_ms,
        }
    return out


def code_shape(rt: Runtime) -> dict[str, str]:
    """What makes a txid's staged partials in this process's code: each state's kind,
    aggregator, key and input fields, as one line a state. The emitter stamps it on the staged
    batch; a commit by code of another shape refuses the batch (``check_code_shape``)."""
    return {
        name: f"{shape['kind']} {shape['aggregator']} keys={shape['keys']} in={shape['in']}"
        for name, shape in shapes(rt).items()
    }


def code_shape_changes(rt: Runtime, staged: dict[str, str] | None) -> str | None:
    """What differs between the code shape a batch was ``staged`` by (None: a batch from
    before the stamp, taken as it is) and this process's; None when nothing does."""
    if staged is None:
        return None
    own = code_shape(rt)
    if staged == own:
        return None
    gone = sorted(set(staged) - set(own))
    new = sorted(set(own) - set(staged))
    changed = sorted(n for n in set(staged) & set(own) if staged[n] != own[n])
    parts = [
        *([f"states {', '.join(gone)} gone"] if gone else []),
        *([f"states {', '.join(new)} new"] if new else []),
        *(f"state {n} was {staged[n]}, is {own[n]}" for n in changed),
    ]
    return "; ".join(parts)


def shape_changes(rt: Runtime, recorded: dict[str, str]) -> list[str]:
    """One line per state whose shape this process's code changes incompatibly (see the
    module doc); [] when nothing is recorded yet. Read-only."""
    have = json.loads(recorded.get(STATES, "{}"))
    lines = []
    for name, own in shapes(rt).items():
        old = have.get(name)
        if old is None:
            continue
        if old.get(DROPPING):
            lines.append(
                f"state {name} of {rt.pipeline.name} is being dropped (`tridentflow evolve "
                f"--drop-state {name}`): deploy the code without it, or finish the drop and "
                f"the state starts empty"
            )
            continue
        changed = [f for f in SHAPE if old.get(f) != own[f]]
        if changed:
            was = ", ".join(f"{f} {old.get(f)}" for f in changed)
            now = ", ".join(f"{f} {own[f]}" for f in changed)
            lines.append(
                f"state {name} of {rt.pipeline.name} holds values made with {was} (since txid "
                f"{old.get('since', '?')}); this code makes it with {now}: give the new one "
                f"another state name, or `tridentflow rewind`/`reset {rt.pipeline.name}` to "
                f"recompute it; if the stored values stay right as they are, `tridentflow "
                f"settings {rt.pipeline.name} --record`"
            )
    return lines


def evolution_under_way(rt: Runtime, recorded: dict[str, str]) -> str | None:
    """One line if a state of this process's code is being renamed (either name) or
    migrated (``tridentflow evolve``); else None. Read-only."""
    have = json.loads(recorded.get(STATES, "{}"))
    for old, entry in have.items():
        new = entry.get(RENAMING)
        if new and (old in rt.pipeline.states or new in rt.pipeline.states):
            return (
                f"state {old} of {rt.pipeline.name} is being renamed to {new} (`tridentflow "
                f"evolve --rename-state`): this commit writes nothing; retry once it is done"
            )
        if entry.get(MIGRATING) and old in rt.pipeline.states:
            return (
                f"state {old} of {rt.pipeline.name} is being migrated with "
                f"{entry[MIGRATING]} (`tridentflow evolve --migrate`): this commit writes "
                "nothing; retry once it is done"
            )
    return None


def _states_value(rt: Runtime, recorded: dict[str, str]) -> str:
    """The ``states`` record after this process: its code's shapes - a state new to the
    record since the next txid (None: the record began after its first commit) - and the
    states its code no longer has, kept as they were (and each state's finished migrations)."""
    have = json.loads(recorded.get(STATES, "{}"))
    own = shapes(rt)
    since = None
    if set(own) - set(have):  # a state new to the record (read the ledger only then)
        committed = rt.ledger.committed_txid()
        since = committed + 1 if STATES in recorded or committed == 0 else None
    out = dict(have)
    for name, shape in own.items():
        kept = {MIGRATED: have[name][MIGRATED]} if MIGRATED in have.get(name, {}) else {}
        out[name] = {**shape, "since": have[name]["since"] if name in have else since, **kept}
    return json.dumps(out, sort_keys=True)


@dataclass(frozen=True)
class Own:
    """This process's value of a setting and where it comes from (runtime's FROM_*, or the
    environment variable's name)."""

    value: str
    source: str

    @property
    def is_change(self) -> bool:
        """Whether a commit records it over a recorded value (code, command line)."""
        return self.source in (FROM_COMMAND_LINE, FROM_CODE)

    @property
    def is_default(self) -> bool:
        return self.source == FROM_DEFAULT


def own_settings(rt: Runtime) -> dict[str, Own]:
    """This process's values, from its command line, the pipeline's code or its environment."""
    retain, source = rt.own_retain_txids()
    return {
        RETAIN: Own(str(retain), source),
        CHANGE_LOGS: Own(json.dumps(rt.pipeline.fed_states), FROM_CODE),
        CHANGE_LOG_LIMIT: Own(str(rt.pipeline.change_log_limit), FROM_CODE),
    }


def disagreements(rt: Runtime, recorded: dict[str, str] | None = None) -> list[str]:
    """One line per setting this process would change without meaning to (see the module
    doc): [] when it agrees with the record, or nothing is recorded yet. Read-only."""
    recorded = rt.ledger.settings() if recorded is None else recorded
    name = rt.pipeline.name
    lines = []
    for setting, own in own_settings(rt).items():
        have = recorded.get(setting)
        if have is None or have == own.value:
            continue
        if setting == RETAIN and not own.is_change and not own.is_default:
            lines.append(
                f"{own.source}={own.value} in this process, but {name}'s commits keep {have} "
                f"txid(s) of undo logs (recorded in Redis with the pipeline): unset it to use "
                f"the recorded value, or make {own.value} the pipeline's for every component "
                f"with `tridentflow settings {name} --record` run with it set"
            )
        elif setting == CHANGE_LOGS:
            missing = sorted(set(json.loads(have)) - set(json.loads(own.value)))
            if missing:
                lines.append(
                    f"this process's pipeline {name} writes no change log of {missing}, "
                    f"which its commits have written (a sink or a new-values stream reads "
                    f"them): load the same pipeline definition in every component; after "
                    f"removing that sink for good, `tridentflow settings {name} --record`"
                )
    return lines


def check(rt: Runtime) -> None:
    """Before a commit writes: SettingsDisagreeError (one line) if this process would change a
    recorded setting without meaning to; then record this process's values. Idempotent."""
    recorded = rt.ledger.settings()
    evolving = evolution_under_way(rt, recorded)
    if evolving:
        raise StateEvolvingError(evolving)
    changes = shape_changes(rt, recorded)
    if changes:
        raise StateShapeChangedError(changes[0])
    lines = disagreements(rt, recorded)
    if lines:
        raise SettingsDisagreeError(lines[0])
    record(rt, recorded)


def record(rt: Runtime, recorded: dict[str, str] | None = None, force: bool = False) -> int:
    """Record this process's values as the pipeline's: those of its code and command line;
    its environment's only where nothing is recorded yet; defaults never (an unset value is
    no decision). ``force`` (``tridentflow settings --record``): every value, environment and
    defaults included. Returns how many changed."""
    recorded = rt.ledger.settings() if recorded is None else recorded
    values = {
        setting: own.value
        for setting, own in own_settings(rt).items()
        if force or own.is_change or (setting not in recorded and not own.is_default)
    }
    values[STATES] = _states_value(rt, recorded)
    if ORIGIN not in recorded and rt.pipeline.origin is not None:  # the first that knows it
        values[ORIGIN] = json.dumps(rt.pipeline.origin, sort_keys=True)
    if all(recorded.get(k) == v for k, v in values.items()):
        return 0
    return rt.ledger.record_settings(values)
