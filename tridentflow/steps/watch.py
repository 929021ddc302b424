"""When a pipeline needs a run: what an event-driven scheduler (Airflow's asset watcher) asks.

A watcher only says "a run has work"; what a run reads is decided by its coordinator, as for any
other run. So the question is asked of the ledger and the source's heads, never of the events a
watcher sent before, and it holds these rules:

* **Work waits** when a partition's head is past the committed offsets (records no committed
  txid covers), or a txid is bound but uncommitted and no run holds it (its run failed or gave
  it up: a new run adopts it). An unavailable partition's records are not work now: they wait
  until it can be read, like the emit's skip.
* **No work is asked twice while a run is on it**: while a txid is held by a live run (its
  lease has not run out, and the orchestrator - ``run_state`` - does not say the run has
  finished), only records beyond what that txid can read are work (``Watch`` fires for them
  once, so that the next run queues behind the current one: a backlog drains run after run);
  the rest waits for that run's commit. A txid whose owner run finished without committing it
  (it failed while Redis was away, so its callback could not release it) is work: the next
  run's coordinator releases and adopts it, as for any scheduled run.
* **A fire is answered** once the ledger moves (a run bound a txid, or a txid committed; a
  fire for the records beyond a held txid T, once a txid after T is bound). An
  unanswered fire (its event merged into a run that already read, the DAG paused, the event
  lost) is repeated after ``refire_after`` seconds, doubling up to ``REFIRE_CAP_S``.
* **No hot loop**: a commit that moved no committed offset while the same records waited (a
  run that could read none of them) does not answer the fire either, so a source whose head
  says more than a run can read costs a run per back-off step, not a run per poll. "The same
  records" is judged by offsets - where the committed offsets and the heads stand - never by
  how many: a run that read some while as many new ones arrived answered its fire.
* **No second run for one fire**: an unanswered fire is not repeated while the orchestrator
  has a run of the pipeline's DAG queued or starting that has not bound a txid yet
  (``active_runs``: its queued and running runs, beyond those holding a txid) - a coordinator
  slow to bind would otherwise get a second run that commits an empty txid.
* **A reset or a rewind answers every fire**: the ledger a fire waited on is gone (another
  generation, or fewer txids than the fire waited for), so the watcher forgets it and judges
  the new ledger afresh - never waits for an old txid the new ledger may take long to pass.

Hence every record lands in a run: a burst merged into one run leaves its rest waiting, and the
next poll after that run's commit fires again; a watcher that fires twice makes at most one run
that finds nothing (an empty txid, no Spark job). Reads only: a watcher never writes to Redis.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tridentflow.sources.base import NamesWaiting
from tridentflow.steps.runs import FINISHED, RunState
from tridentflow.steps.runtime import Runtime

REFIRE_AFTER_S = 10.0
"""An unanswered fire is repeated after this long (then twice as long each time, up to
REFIRE_CAP_S). Airflow drops the asset events of a paused DAG, so a DAG unpaused with records
waiting gets its first run within this back-off; while it stays paused, one asset event a
minute at most."""
REFIRE_CAP_S = 60.0

ActiveRuns = Callable[[], "int | None"]
"""How many runs of the pipeline's DAG are queued or running now (None: cannot tell)."""


@dataclass(frozen=True)
class Waiting:
    """Why the pipeline needs a run now: ``records`` past the committed offsets (per
    partition in ``partitions``), or a bound txid no run holds (``adopt``)."""

    records: int
    partitions: dict[int, int]
    adopt: int | None = None
    beyond: int | None = None
    """Set: the records are beyond what held txid ``beyond`` can read (its run is live)."""
    since: dict[int, int] = field(default_factory=dict)
    """Where each partition's waiting records start (committed offsets, or a held txid's
    reach): with ``partitions``, which records wait - compared by offsets, not counts."""
    unit: str = "records"
    """What ``records`` counts: offsets, named as the log names them (files, versions)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "records": self.records,
            "partitions": {str(p): n for p, n in sorted(self.partitions.items())},
            "adopt": self.adopt,
            "beyond": self.beyond,
        }

    def describe(self) -> str:
        if self.adopt is not None:
            return f"txid {self.adopt} is bound and no run holds it: a new run adopts it"
        if self.beyond is not None:
            return f"{self.records} {self.unit} beyond what txid {self.beyond} (running) can read"
        return f"{self.records} {self.unit} past the committed offsets"


def work_waiting(rt: Runtime, run_state: RunState | None = None) -> Waiting | None:
    """The work a new run of ``rt``'s pipeline would find (``Waiting``), or None: nothing
    waits, or a live run holds a txid (its commit comes first). Reads only; a source that does
    not exist yet has no work (a Kafka topic: its producers make it)."""
    pending = rt.ledger.pending_txids()
    return None if held_txid(rt, pending, run_state) is not None else _unheld_work(rt, pending)


def held_txid(rt: Runtime, pending: list[int], run_state: RunState | None = None) -> int | None:
    """The first of ``pending`` a live run holds: its lease has not run out and
    ``run_state`` (what the orchestrator says of the owner run) does not say it finished."""
    if not pending:
        return None
    now = rt.redis_now_ms()
    for txid in pending:
        info = rt.ledger.tx_info(txid)
        owner = info.get("owner")
        if not owner or int(info.get("lease_until") or 0) <= now:
            continue
        if run_state is None or run_state(owner) not in FINISHED:
            return txid
    return None


def _unheld_work(rt: Runtime, pending: list[int]) -> Waiting | None:
    behind, since = _records_behind(rt)
    unit = _unit(rt)
    if pending:
        return Waiting(sum(behind.values()), behind, adopt=pending[0], since=since, unit=unit)
    return Waiting(sum(behind.values()), behind, since=since, unit=unit) if behind else None


def _unit(rt: Runtime) -> str:
    return rt.log.offset_unit() if isinstance(rt.log, NamesWaiting) else "records"


def _beyond_held(rt: Runtime, held: int, pending: list[int]) -> Waiting | None:
    """Records no run will read before a next one: past what ``held`` (the only pending txid,
    its run live) can read - its frozen ranges (a transactional source), or its batch size
    from the committed offsets (the others). None if it may read them all, or its batch is
    not coordinated yet."""
    if pending != [held]:
        return None
    meta = rt.ledger.metadata(held)
    if not meta or not rt.log.exists():
        return None
    committed = rt.ledger.committed_offsets()
    heads = rt.log.scan(committed).heads  # an unavailable partition is not in heads
    if "ranges" in meta:
        reach = {int(p): int(r[1]) for p, r in meta["ranges"].items()}
    elif "batch_size" in meta:
        reach = {p: committed.get(p, 0) + int(meta["batch_size"]) for p in heads}
    else:
        return None
    beyond = {p: head - reach[p] for p, head in heads.items() if p in reach and head > reach[p]}
    since = {p: reach[p] for p in beyond}
    if not beyond:
        return None
    return Waiting(sum(beyond.values()), beyond, beyond=held, since=since, unit=_unit(rt))


def _records_behind(rt: Runtime) -> tuple[dict[int, int], dict[int, int]]:
    """Per readable partition with any, its records past the committed offsets, and where
    they start (its committed offset)."""
    if not rt.log.exists():
        return {}, {}
    offsets = rt.ledger.committed_offsets()
    heads = rt.log.scan(offsets).heads  # an unavailable partition is not in heads
    behind = {p: head - offsets.get(p, 0) for p, head in heads.items()}
    waiting = {p: n for p, n in behind.items() if n > 0}
    return waiting, {p: offsets.get(p, 0) for p in waiting}


class Watch:
    """A watcher's memory between polls: fires when work waits (or, while a run holds the
    txid, records beyond its reach), unless an earlier fire is still unanswered and younger
    than its refire delay (the module docstring's rules)."""

    def __init__(self, refire_after: float = REFIRE_AFTER_S) -> None:
        if not refire_after > 0:
            raise ValueError(f"refire_after must be > 0 seconds, got {refire_after!r}")
        self.refire_after = refire_after
        self._fired_at: float | None = None
        self._fired_mark: tuple[str, int, int] | None = None
        self._fired_for: Waiting | None = None
        self._awaiting_bind_after: int | None = None  # a fire for records beyond a held txid
        self._delay = refire_after

    def poll(
        self,
        rt: Runtime,
        now: float,
        run_state: RunState | None = None,
        active_runs: ActiveRuns | None = None,
    ) -> Waiting | None:
        """What to fire for now (``now``: a monotonic clock, seconds), or None.
        ``active_runs``: the orchestrator's count of the DAG's queued and running runs."""
        pending = rt.ledger.pending_txids()
        held = held_txid(rt, pending, run_state)
        if held is not None:  # a run is on it: only what it cannot read may be asked for
            waiting = _beyond_held(rt, held, pending)
            if waiting is None:
                return None
        else:
            waiting = _unheld_work(rt, pending)
        if waiting is None:
            self._forget()
            return None
        ledger = rt.ledger
        mark = (ledger.current_generation() or "", ledger.committed_txid(), ledger.last_txid())
        if self._fired_mark is not None and (
            mark[0] != self._fired_mark[0] or mark[2] < self._fired_mark[2]
        ):  # reset or rewound since the fire: the ledger it waited on is gone
            self._forget()
        if self._awaiting_bind_after is not None and mark[2] > self._awaiting_bind_after:
            self._awaiting_bind_after = None  # the run queued behind it has bound its txid
        answered = self._fired_at is None or (
            self._awaiting_bind_after is None  # a look-ahead fire: answered by its run's bind
            and mark != self._fired_mark
            and waiting != self._fired_for  # moved, and progressed
        )
        if answered:
            self._delay = self.refire_after
        elif now - self._fired_at < self._delay:
            return None
        elif self._run_coming(held, active_runs):
            return None  # a run queued or starting answers it: no second run for one fire
        else:
            self._delay = min(self._delay * 2, REFIRE_CAP_S)  # unanswered: back off
        self._fired_at, self._fired_mark, self._fired_for = now, mark, waiting
        if waiting.beyond is not None:
            self._awaiting_bind_after = waiting.beyond
        return waiting

    def _forget(self) -> None:
        """No fire waits for an answer any more."""
        self._fired_at = self._fired_mark = self._fired_for = None
        self._awaiting_bind_after = None
        self._delay = self.refire_after

    @staticmethod
    def _run_coming(held: int | None, active_runs: ActiveRuns | None) -> bool:
        """Whether the orchestrator has a run queued or running beyond the one holding
        ``held`` (if any): that run has not bound a txid yet, and will."""
        if active_runs is None:
            return False
        try:
            active = active_runs()
        except Exception:  # cannot tell: the back-off decides
            return False
        return active is not None and active > (0 if held is None else 1)
