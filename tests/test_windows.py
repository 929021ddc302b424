"""Windows (Trident's tumbling and sliding windows): count windows on the source's record
positions and event-time windows on a field, persisted per window; exact whatever the
batching, through replays and a dark partition."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from tests.helpers import drain_retrying
from tridentflow import Count, LogSource, Pipeline, SourceMode, StateSpec, Sum
from tridentflow.engines.local import LocalEngine
from tridentflow.errors import IncompleteBatchError, PipelineError
from tridentflow.faults import Dark, Fault, FaultPlan
from tridentflow.ops.audit import audit
from tridentflow.steps.committer import commit
from tridentflow.steps.coordinator import coordinate
from tridentflow.steps.emitter import emit
from tridentflow.steps.query import list_state
from tridentflow.steps.runtime import Runtime, connect
from tridentflow.windows import Windows


def test_windows_hold_each_value_in_size_over_slide_windows():
    assert list(Windows(10, 10)(23)) == [(20,)]
    assert list(Windows(10, 5)(23)) == [(20,), (15,)]
    assert list(Windows(10, 5)(-1)) == [(-5,), (-10,)]
    assert list(Windows(3, 1)(0)) == [(0,), (-1,), (-2,)]
    assert list(Windows(10, 4)(9)) == [(8,), (4,), (0,)]  # 10/4: two or three windows
    for value in (0.3, 0.7, 1e9 + 0.1, -2.05):  # floats: each value in [start, start + size)
        starts = [w for (w,) in Windows(0.1, 0.05)(value)]
        assert starts and all(w <= value < w + 0.1 for w in starts)
    assert isinstance(next(Windows(10, 5)(23))[0], int)


@pytest.mark.parametrize(
    ("size", "slide"), [(0, 0), (10, 0), (5, 10), (-1, -1), (math.inf, 1), (True, 1), ("1", 1)]
)
def test_bad_windows_are_one_clear_error(size, slide):
    with pytest.raises(PipelineError, match="window"):
        Windows(size, slide)


@pytest.mark.parametrize("value", ["12", None, math.nan, True])
def test_a_value_that_is_not_a_number_fails_its_record(value):
    with pytest.raises(PipelineError, match="the window field must be"):
        list(Windows(10, 5)(value))


ENGINE = LocalEngine()


def windowed(mode: SourceMode) -> Pipeline:
    p = Pipeline(
        f"windowed-{mode.value}",
        LogSource(fields=("ts", "amount"), mode=mode, partitions=3, position_field="pos"),
    )
    s = p.stream
    s.tumbling_window(10, on="pos").group_by("window").persistent_aggregate(
        StateSpec("tumbling"), Count()
    )
    s.sliding_window(10, 5, on="pos").group_by("window").persistent_aggregate(
        StateSpec("sliding"), Count()
    )
    s.tumbling_window(100, on="ts").group_by("window").persistent_aggregate(
        StateSpec("minutes", "transactional" if mode is SourceMode.TRANSACTIONAL else "opaque"),
        Sum(),
        "amount",
    )
    return p


def _run(redis_url, home, mode, records, batch_size, faults=None) -> dict:
    faults = faults or FaultPlan()
    rt = Runtime(windowed(mode), connect(redis_url), home, faults, namespace=home.name)
    rt.ledger.reset(force=True)
    rt.log.ensure(3)
    rt.log.append_spread(records)
    drain_retrying(rt, batch_size)
    assert sum(rt.ledger.committed_offsets().values()) == len(records)
    states = {}
    for name, persist in rt.pipeline.states.items():
        states[name] = {k[0]: v for k, v in list_state(rt, persist, limit=10_000).items}
    states["_audit"] = audit(rt).unaudited
    return states


RECORDS = [[(i * 37) % 1000, i % 7] for i in range(203)]  # event times out of order


def test_count_windows_are_exact_whatever_the_batching(redis_url, tmp_path):
    """Positions are global: the same records in batches of 4 or 25, with commits failing
    half-way and before the mark, give the same windows; every full window holds 10."""
    clean = _run(redis_url, tmp_path / "a", SourceMode.TRANSACTIONAL, RECORDS, 25)
    faults = FaultPlan(
        (
            Fault("mid-commit", 2, 1, "crash"),
            Fault("before-ledger", 3, 1, "raise"),
            Fault("in-emit", 5, 1, "crash"),
        )
    )
    replayed = _run(redis_url, tmp_path / "b", SourceMode.TRANSACTIONAL, RECORDS, 4, faults)
    assert replayed == clean
    tumbling, sliding = clean["tumbling"], clean["sliding"]
    assert tumbling == {w: 10 for w in range(0, 200, 10)} | {200: 3}
    assert sliding == {-5: 5} | {w: 10 for w in range(0, 195, 5)} | {195: 8, 200: 3}
    minutes = Counter()
    for ts, amount in RECORDS:
        minutes[ts // 100 * 100] += amount
    assert clean["minutes"] == dict(minutes)
    assert clean["_audit"] == ["tumbling", "sliding", "minutes"]  # positions: not audited


def test_count_windows_stay_exact_when_an_opaque_partition_goes_dark(redis_url, tmp_path):
    """An opaque batch skips a dark partition: the skipped records come later, at positions
    after every record committed before them; no position is used twice or left out."""
    faults = FaultPlan(darks=(Dark(1, 2, 4),))
    states = _run(redis_url, tmp_path / "c", SourceMode.OPAQUE, RECORDS, 6, faults)
    assert states["tumbling"] == {w: 10 for w in range(0, 200, 10)} | {200: 3}
    assert sum(states["sliding"].values()) == 2 * len(RECORDS)


def test_a_pipelined_batch_after_a_replayed_one_never_reuses_positions(redis_url, tmp_path):
    """Family: a pipelined opaque batch staged from where an attempt of the txid before it
    stopped, that txid then replayed with more records, and the batch skipping (dark) the
    partition that changed: its start on that partition is stale, so the positions it gives
    records overlap the replay's - the commit must refuse it (found by the chaos harness:
    a sliding window held 12)."""
    faults = FaultPlan(darks=(Dark(1, 2, 2),))
    rt = Runtime(windowed(SourceMode.OPAQUE), connect(redis_url), tmp_path, faults,
                 namespace="pipelined")  # fmt: skip
    rt.ledger.reset(force=True)
    rt.log.ensure(3)
    rt.log.append(0, RECORDS[0:2])
    rt.log.append(1, RECORDS[2:3])
    rt.log.append(2, RECORDS[3:5])
    for txid, size in ((1, 2), (2, 4)):
        rt.ledger.claim(txid, f"run-{txid}")
        coordinate(rt, txid, batch_size=size)
    emit(rt, 1, ENGINE)  # partition 0 [0, 2), 1 [0, 1), 2 [0, 2)
    rt.log.append(0, RECORDS[5:8])
    emit(rt, 2, ENGINE)  # from txid 1's attempt 1: partition 0 [2, 5); partition 1 dark
    rt.log.append(1, RECORDS[8:9])
    emit(rt, 1, ENGINE)  # replayed: partition 1 reads [0, 2) now (opaque), the rest as before
    assert commit(rt, 1).status == "committed"
    with pytest.raises(IncompleteBatchError, match="positions would be wrong"):
        commit(rt, 2)
    rt = rt.with_(faults=FaultPlan())
    drain_retrying(rt, 4)
    sliding = list_state(rt, rt.pipeline.states["sliding"], limit=10_000)
    per_window = {k[0]: v for k, v in sliding.items}
    assert max(per_window.values()) <= 10
    assert sum(per_window.values()) == 2 * 9
