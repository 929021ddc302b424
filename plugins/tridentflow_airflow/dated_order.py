"""Runs with a logical date bind their txids in date order - what makes a backfill (and a
catch-up of a time-based schedule) keep the order a user means.

A coordinator binding a run's first txid looks at the run just before it by logical date
(Airflow's ``get_previous_dagrun``) and at whether that run bound a txid (the ledger):

* none, or it bound already: go;
* it is running but has not bound yet (a backfill or catch-up with several active runs): wait
  for it, then look again (a retry, past ``ORDER_WAIT_S``);
* both are backfill runs and the earlier one is still queued: the backfill runs backwards -
  refused in one line, no retry (Airflow's own refusal at creation, tridentflow_airflow.
  backfill_guard, covers the UI and REST API; this covers the CLI);
* both are backfill runs and the earlier one failed before binding: refused (binding this one
  would put its txid before the earlier date's), until that run is cleared;
* anything else (no logical date, a manual run after a scheduled one, a run marked success by
  hand): go - txids follow the order runs bind in.

A run that holds a txid (a retry, a cleared task, a backfill reprocessing a completed run)
replays it: no check. A run whose txid a rewind took back binds afresh, in date order again:
rewind + a backfill that reprocesses completed runs recomputes a range of dates in order.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from tridentflow.steps.runtime import Runtime
from tridentflow_airflow.errors import OutOfOrderWaitError

ORDER_WAIT_S = 120.0
"""How long a coordinator waits in its try for the run before it (by date) to bind."""
POLL_S = 0.5
log = logging.getLogger(__name__)


class Verdict(StrEnum):
    GO = "go"
    WAIT = "wait"
    REFUSE = "refuse"


@dataclass(frozen=True)
class EarlierRun:
    """The run just before this one by logical date, as far as the order cares."""

    run_id: str
    logical_date: datetime | None
    state: str  # queued | running | success | failed
    backfill: bool
    bound: bool  # it bound a txid (the ledger says so)


def verdict(
    dag_id: str, run_id: str, backfill: bool, earlier: EarlierRun | None
) -> tuple[Verdict, str]:
    """Whether run ``run_id`` may bind its first txid now, and why not (one line)."""
    if earlier is None or earlier.bound:
        return Verdict.GO, ""
    when = earlier.logical_date.isoformat() if earlier.logical_date else "none"
    if earlier.state == "running":
        return Verdict.WAIT, (
            f"{dag_id}: run {run_id} waits for run {earlier.run_id} (logical date {when}) to "
            "bind its txid first: txids follow logical dates"
        )
    if not (backfill and earlier.backfill):
        return Verdict.GO, ""
    if earlier.state == "queued":
        return Verdict.REFUSE, (
            f"{dag_id}: run {run_id} refused - run {earlier.run_id} (logical date {when}) is "
            "still queued before it: a backfill that runs backwards would bind txids against "
            "the dates; create the backfill without run_backwards"
        )
    if earlier.state == "failed":
        return Verdict.REFUSE, (
            f"{dag_id}: run {run_id} refused - run {earlier.run_id} (logical date {when}) "
            "failed before binding its txid, and this run's txid would come before it: clear "
            f"run {earlier.run_id} (or re-create the backfill with reprocess failed runs)"
        )
    return Verdict.GO, ""


def _text(value: Any) -> str:
    return str(getattr(value, "value", value)).lower()


def earlier_run(context: Any, rt: Runtime) -> EarlierRun | None:
    """The run before this one by logical date (Airflow, through the Task SDK), or None: no
    logical date, no such run, or an Airflow whose Task SDK cannot tell (3.1)."""
    ti = context["ti"]
    ask = getattr(ti, "get_previous_dagrun", None)
    if context["dag_run"].logical_date is None or ask is None:
        return None
    found = ask()
    if found is None:
        return None
    return EarlierRun(
        run_id=found.run_id,
        logical_date=found.logical_date,
        state=_text(found.state),
        backfill=_text(found.run_type) == "backfill",
        bound=has_bound(rt, found.run_id),
    )


def has_bound(rt: Runtime, run_id: str) -> bool:
    """Whether ``run_id`` took its place in the txid order: it holds a txid, or held one that
    a later run adopted. A run whose txid a rewind took back binds afresh when it runs again:
    not bound."""
    return rt.ledger.txid_of_run(run_id) is not None or rt.ledger.lost_txid(run_id) is not None


def bind_in_date_order(context: Any, rt: Runtime, timeout: float = ORDER_WAIT_S) -> None:
    """Return once this run may bind its first txid (see the module doc); AirflowFailException
    (no retry) for a run refused, OutOfOrderWaitError (retried) past ``timeout``."""
    run = context["dag_run"]
    if rt.ledger.txid_of_run(run.run_id) is not None:
        return  # a replay: its txid is its own
    backfill = _text(run.run_type) == "backfill"
    deadline = time.monotonic() + timeout
    waiting = ""
    while True:
        decided, why = verdict(run.dag_id, run.run_id, backfill, earlier_run(context, rt))
        if decided is Verdict.GO:
            return
        if decided is Verdict.REFUSE:
            from airflow.sdk.exceptions import AirflowFailException

            raise AirflowFailException(why)
        if time.monotonic() >= deadline:
            raise OutOfOrderWaitError(f"{why} (still waiting after {timeout:.0f} s; retried)")
        if why != waiting:
            log.info("%s", why)
            waiting = why
        time.sleep(POLL_S)
