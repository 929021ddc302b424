"""Runs after commits of the word count: scheduled on the `counts` state's Asset, whose events
the commit task emits only when it really committed (never on a replay). Airflow coalesces the
events queued while this DAG waits into one run, so a run handles every txid it lists."""

from __future__ import annotations

from airflow.sdk import dag, get_current_context, task

from tridentflow_airflow.assets import state_asset

COUNTS = state_asset("wordcount", "counts")


@dag(
    schedule=[COUNTS],
    catchup=False,
    tags=["tridentflow", "example"],
    description="runs after word count commits (its counts Asset); handles every listed txid",
)
def tridentflow_wordcount_consumer() -> None:
    @task
    def report_new_counts() -> list[dict]:
        """What a downstream job receives: for each committed txid this run was triggered by
        (one or several), its txid, records and keys, oldest first."""
        events = get_current_context()["triggering_asset_events"][COUNTS]
        return sorted((dict(event.extra) for event in events), key=lambda e: e.get("txid", 0))

    report_new_counts()


tridentflow_wordcount_consumer()
