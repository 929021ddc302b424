"""A txid's steps as Airflow counts them: every try of the ``coordinate``, ``emit`` and
``commit`` tasks of every run that worked on the txid (the runs it was adopted from included),
read from Airflow's metadata DB by the api-server that serves the view.

The ledger records what reaches Redis: a try that failed before it could (a Redis outage) is
missing there, with its seconds. Wherever Airflow answers, the console shows these figures
instead, so that a step's tries equal the tries Airflow lists for it and its seconds the sum
of their durations - for simple, retried, cleared and adopted runs alike. Read-only; None
where no metadata DB answers (the CLI, the view's unit tests).

``step_figures`` is a plain function over ``TaskTry`` rows: testable without Airflow.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

STEPS = ("coordinate", "emit", "commit")
NEVER_RAN = frozenset({"upstream_failed", "skipped", "removed"})
"""States Airflow stamps a start and an end on without running the task (its upstream failed,
say): not a try."""


@dataclass(frozen=True)
class TaskTry:
    """One try of a step's task: which run, which try, when it started and ended (ms since
    the epoch; ``ended_ms`` None while it runs)."""

    run_id: str
    step: str
    try_number: int
    started_ms: int
    ended_ms: int | None


def step_figures(
    tries: Iterable[TaskTry], now_ms: int, until_ms: int | None = None
) -> dict[str, dict[str, Any]]:
    """Per step with a try that started (by ``until_ms``, when given: a committed txid's
    figures at its commit): ``tries`` (how many), ``task_ms`` (their durations summed, a
    running try's up to ``now_ms``), ``task_started_ms`` (the first start), ``task_ended_ms``
    (the last end), ``runs`` (the run ids, sorted) and ``counted_by`` "airflow"."""
    out: dict[str, dict[str, Any]] = {}
    for t in sorted(tries, key=lambda t: (t.started_ms, t.run_id, t.try_number)):
        if until_ms is not None and t.started_ms > until_ms:
            continue
        ended = t.ended_ms if t.ended_ms is not None else now_ms
        step = out.setdefault(
            t.step,
            {"tries": 0, "task_ms": 0, "task_started_ms": t.started_ms, "task_ended_ms": None,
             "runs": [], "counted_by": "airflow"},
        )  # fmt: skip
        step["tries"] += 1
        step["task_ms"] += max(0, ended - t.started_ms)
        if t.ended_ms is not None:
            step["task_ended_ms"] = max(step["task_ended_ms"] or 0, t.ended_ms)
        if t.run_id not in step["runs"]:
            step["runs"] = sorted([*step["runs"], t.run_id])
    return out


def replays_after(tries: Iterable[TaskTry], committed_ms: int) -> list[dict[str, Any]]:
    """The steps tried again after the commit at ``committed_ms`` (cleared in Airflow: each
    try found the txid committed and changed nothing), as ``status.replays_after_commit``
    words them: [{step, tries_at_commit, tries_now, last_ended_ms}]."""
    every = list(tries)
    at_commit = step_figures(every, committed_ms, until_ms=committed_ms)
    now = step_figures(every, committed_ms)
    return [
        {
            "step": step,
            "tries_at_commit": at_commit[step]["tries"],
            "tries_now": now[step]["tries"],
            "last_ended_ms": now[step]["task_ended_ms"],
        }
        for step in STEPS
        if step in at_commit and now[step]["tries"] > at_commit[step]["tries"]
    ]


def _ms(moment: Any) -> int | None:
    return None if moment is None else int(moment.timestamp() * 1000)


def airflow_tries(dag_ids: str | Iterable[str], run_ids: Iterable[str]) -> list[TaskTry] | None:
    """Every try that ran of the steps' tasks in ``run_ids`` of the DAGs ``dag_ids`` (those
    that run the pipeline): the task instances' earlier tries (Airflow's task instance
    history) and their current one (not a task Airflow marked without running it:
    NEVER_RAN). None if Airflow's metadata DB cannot be read here."""
    runs = sorted(set(run_ids))
    dags = sorted({dag_ids} if isinstance(dag_ids, str) else set(dag_ids))
    if not runs or not dags:
        return []
    try:
        from airflow.models.taskinstance import TaskInstance
        from airflow.models.taskinstancehistory import TaskInstanceHistory
        from airflow.utils.session import create_session
        from sqlalchemy import select

        found: dict[tuple[str, str, int], TaskTry] = {}
        with create_session() as session:
            for model in (TaskInstanceHistory, TaskInstance):  # the current try wins
                rows = session.execute(
                    select(
                        model.run_id, model.task_id, model.try_number,
                        model.start_date, model.end_date, model.state,
                    ).where(
                        model.dag_id.in_(dags), model.run_id.in_(runs),
                        model.task_id.in_(STEPS), model.map_index == -1,
                    )
                )  # fmt: skip
                for run_id, task_id, try_number, start, end, state in rows:
                    started = _ms(start)
                    ran = str(getattr(state, "value", state)) not in NEVER_RAN
                    if started is None or not ran:  # queued, or never to run: not a try
                        found.pop((run_id, task_id, try_number), None)
                        continue
                    found[(run_id, task_id, try_number)] = TaskTry(
                        run_id, task_id, try_number, started, _ms(end)
                    )
    except Exception:  # no metadata DB here, or not Airflow's: do not guess
        return None
    return list(found.values())
