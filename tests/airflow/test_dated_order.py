"""The verdicts of tridentflow_airflow.dated_order: when a run with a logical date may bind its
first txid (the live backfills are in tests/airflow/test_connect_live.py)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tridentflow_airflow.dated_order import EarlierRun, Verdict, verdict

pytestmark = pytest.mark.airflow
DAY = datetime(2026, 11, 1, tzinfo=UTC)


def earlier(state: str, backfill: bool = True, bound: bool = False) -> EarlierRun:
    return EarlierRun("backfill__2026-11-01", DAY, state, backfill, bound)


@pytest.mark.parametrize(
    ("backfill", "before", "expected"),
    [
        (True, None, Verdict.GO),  # the first run of all
        (True, earlier("success", bound=True), Verdict.GO),
        (True, earlier("running", bound=True), Verdict.GO),  # bound: its emit may still run
        (True, earlier("running"), Verdict.WAIT),  # a parallel backfill: it binds first
        (False, earlier("running", backfill=False), Verdict.WAIT),  # a catch-up alike
        (True, earlier("queued"), Verdict.REFUSE),  # run_backwards
        (True, earlier("failed"), Verdict.REFUSE),  # an earlier date never bound
        (True, earlier("success"), Verdict.GO),  # marked success by hand: skipped on purpose
        (False, earlier("queued"), Verdict.GO),  # not a backfill: txids follow binding order
        (True, earlier("queued", backfill=False), Verdict.GO),
        (True, earlier("failed", backfill=False), Verdict.GO),  # adoption, as for any run
    ],
)
def test_a_run_binds_after_the_run_before_it_by_date(backfill, before, expected):
    decided, why = verdict("tridentflow_x", "backfill__2026-11-02", backfill, before)
    assert decided is expected
    assert (why == "") is (expected is Verdict.GO)
    assert "\n" not in why


def test_the_refusals_say_what_to_do_in_one_line():
    _, backwards = verdict("tridentflow_x", "r2", True, earlier("queued"))
    assert backwards == (
        "tridentflow_x: run r2 refused - run backfill__2026-11-01 (logical date "
        "2026-11-01T00:00:00+00:00) is still queued before it: a backfill that runs backwards "
        "would bind txids against the dates; create the backfill without run_backwards"
    )
    _, failed = verdict("tridentflow_x", "r2", True, earlier("failed"))
    assert "failed before binding its txid" in failed and "clear run backfill__" in failed
