"""Asset events of commits: one per state, only for a txid that was really committed."""

from __future__ import annotations

from collections import defaultdict

from tridentflow_airflow.assets import commit_alias, emit_commit_events, state_asset


class Recorder:
    def __init__(self) -> None:
        self.added: list[tuple[str, dict]] = []

    def add(self, asset, extra=None) -> None:
        self.added.append((asset.uri, extra))


def test_events_only_when_the_commit_really_committed():
    outlets: defaultdict = defaultdict(Recorder)
    result = {"status": "committed", "txid": 7, "records": 3, "keys": 2, "run_id": "r"}
    assert emit_commit_events(outlets, "user-scores", ["per_batch", "score_sum"], "rc", result) == 2
    assert outlets[commit_alias("user-scores")].added == [
        (
            "tridentflow://rc/user-scores/per_batch",
            {"txid": 7, "records": 3, "keys": 2, "run_id": "r"},
        ),
        (
            "tridentflow://rc/user-scores/score_sum",
            {"txid": 7, "records": 3, "keys": 2, "run_id": "r"},
        ),
    ]
    again = defaultdict(Recorder)
    replay = {"status": "already-committed", "txid": 7}
    assert emit_commit_events(again, "user-scores", ["per_batch"], "rc", replay) == 0
    assert not again


def test_asset_uris_name_the_connection_pipeline_and_state():
    asset = state_asset("wordcount", "counts")
    assert (asset.uri, asset.name) == (
        "tridentflow://redis_default/wordcount/counts",
        "tridentflow/wordcount/counts",
    )
