"""Runs once per committed txid of the word count: scheduled on the `counts` state's Asset,
whose events the commit task emits only when it really committed (never on a replay)."""

from __future__ import annotations

from airflow.sdk import dag, get_current_context, task

from tridentflow_airflow.assets import state_asset

COUNTS = state_asset("wordcount", "counts")


@dag(
    schedule=[COUNTS],
    catchup=False,
    tags=["tridentflow", "example"],
    description="runs once per committed txid of the word count (its counts Asset)",
)
def tridentflow_wordcount_consumer() -> None:
    @task
    def report_new_counts() -> list[dict]:
        """What a downstream job receives: the committed txid, records and keys."""
        events = get_current_context()["triggering_asset_events"][COUNTS]
        return [dict(event.extra) for event in events]

    report_new_counts()


tridentflow_wordcount_consumer()
