"""A txid's step figures from Airflow's tries (tridentflow_airflow.tries): plain functions
over the rows the metadata DB holds; the live stack compares them with Airflow's REST answers
(test_airflow_runs.py)."""

from __future__ import annotations

from tridentflow_airflow.tries import TaskTry, replays_after, step_figures

S = 1_700_000_000_000  # ms


def test_a_simple_run_counts_one_try_per_step_and_its_duration():
    tries = [
        TaskTry("manual__1", "coordinate", 1, S, S + 1_200),
        TaskTry("manual__1", "emit", 1, S + 2_000, S + 9_500),
        TaskTry("manual__1", "commit", 1, S + 10_000, S + 10_400),
    ]
    figures = step_figures(tries, now_ms=S + 60_000)
    assert {s: (f["tries"], f["task_ms"]) for s, f in figures.items()} == {
        "coordinate": (1, 1_200),
        "emit": (1, 7_500),
        "commit": (1, 400),
    }
    assert figures["emit"]["task_started_ms"] == S + 2_000
    assert figures["emit"]["task_ended_ms"] == S + 9_500
    assert figures["emit"]["counted_by"] == "airflow"


def test_an_adopted_txid_counts_the_tries_of_both_runs_not_the_time_between_them():
    """The reported case: emit failed three times in the first run (Redis away; none reached
    the ledger), the next run adopted the txid and emitted once. 4 tries over 2 runs, and the
    seconds are the tries' durations - not the 150 s from the first try to the last end."""
    failed_emits = [(n, S + n * 40_000) for n in (1, 2, 3)]
    tries = [
        TaskTry("manual__1", "coordinate", 1, S, S + 1_000),
        *(TaskTry("manual__1", "emit", n, at, at + 2_000) for n, at in failed_emits),
        TaskTry("manual__2", "coordinate", 1, S + 150_000, S + 150_500),
        TaskTry("manual__2", "emit", 1, S + 151_000, S + 159_000),
        TaskTry("manual__2", "commit", 1, S + 160_000, S + 160_300),
    ]
    figures = step_figures(tries, now_ms=S + 200_000, until_ms=S + 160_200)
    assert (figures["emit"]["tries"], figures["emit"]["task_ms"]) == (4, 3 * 2_000 + 8_000)
    assert figures["emit"]["runs"] == ["manual__1", "manual__2"]
    assert (figures["coordinate"]["tries"], figures["coordinate"]["task_ms"]) == (2, 1_500)
    assert figures["commit"]["tries"] == 1  # started before its commit, ended after it


def test_a_running_try_counts_up_to_now_and_a_replay_after_the_commit_is_apart():
    tries = [
        TaskTry("r", "emit", 1, S, S + 5_000),
        TaskTry("r", "commit", 1, S + 6_000, S + 7_000),
        TaskTry("r", "commit", 2, S + 50_000, S + 50_200),  # cleared after the commit
        TaskTry("r", "emit", 2, S + 60_000, None),  # cleared and running now
    ]
    at_commit = step_figures(tries, now_ms=S + 61_000, until_ms=S + 6_900)
    assert (at_commit["commit"]["tries"], at_commit["commit"]["task_ms"]) == (1, 1_000)
    assert at_commit["emit"]["tries"] == 1
    now = step_figures(tries, now_ms=S + 61_000)
    assert (now["emit"]["tries"], now["emit"]["task_ms"]) == (2, 5_000 + 1_000)
    assert now["emit"]["task_ended_ms"] == S + 5_000  # the running try has not ended
    assert replays_after(tries, S + 6_900) == [
        {"step": "emit", "tries_at_commit": 1, "tries_now": 2, "last_ended_ms": S + 5_000},
        {"step": "commit", "tries_at_commit": 1, "tries_now": 2, "last_ended_ms": S + 50_200},
    ]


def test_no_tries_no_figures():
    assert step_figures([], now_ms=S) == {}
    assert replays_after([], S) == []
