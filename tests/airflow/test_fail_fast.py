"""What a retry cannot fix fails an Airflow task at once (tridentflow_airflow.operators.
fail_fast): a sink's refusal is one logged line with its fix and no cause's traceback; an
outage is raised as it is, for Airflow to retry."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from tridentflow.sinks import SinkError, SinkRefusedError
from tridentflow.sinks.lakehouse import column_array
from tridentflow_airflow.compat import AirflowFailException
from tridentflow_airflow.operators import fail_fast


@pytest.fixture
def logged() -> Iterator[list[str]]:
    """The messages tridentflow_airflow.operators logs during the test (not caplog: the suite
    may run with -p no:logging)."""
    lines: list[str] = []
    handler = logging.Handler(logging.ERROR)
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("tridentflow_airflow.operators")
    logger.addHandler(handler)
    yield lines
    logger.removeHandler(handler)


def test_a_sinks_refusal_fails_the_task_at_once_in_one_logged_line(logged):
    """A real refusal (a key column of ints and floats): AirflowFailException, whose message
    is the refusal's line with its way out, logged alone before Airflow's traceback; the
    traceback holds no frame of the cause (``from None``)."""
    with pytest.raises(SinkRefusedError) as refusal:
        column_array("k", [1, 2.5], key=True)
    assert not refusal.value.retry_helps
    with pytest.raises(AirflowFailException) as failed, fail_fast():
        column_array("k", [1, 2.5], key=True)
    line = str(failed.value)
    assert "\n" not in line and "key column k gets integers and floats" in line, line
    assert "new_values_stream().map(...)" in line and line.endswith("then clear the task)")
    assert failed.value.__cause__ is None and failed.value.__suppress_context__
    assert logged == [line]


def test_an_outage_is_raised_as_it_is_for_airflow_to_retry(logged):
    """A sink error a retry may fix (a lock held, a replica late) passes through unchanged."""
    outage = SinkError("sink pg: cannot connect to PostgreSQL at 127.0.0.1:5432: refused")
    assert outage.retry_helps
    with pytest.raises(SinkError) as raised, fail_fast():
        raise outage
    assert raised.value is outage and not logged
