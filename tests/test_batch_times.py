"""Expiry in time (``StateSpec(expire_after=timedelta(...))``): at the commit of txid T every
key whose last update was at a txid whose batch time is at or before T's minus the period,
and which T does not update, is removed - judged by the batch times the coordinator froze
into each txid's metadata, never by a committing machine's clock. Checked against the rule
written out, on the harness and in Redis at every fault point, with retries that run on
another clock, a clock that goes back, both rules at once, and a rewind."""

from __future__ import annotations

import random
from collections import Counter
from datetime import datetime, timedelta

import pytest

from tests.helpers import runtime
from tests.pipelines import HOUR, expiring
from tests.test_expiry import POINTS, _counts, _step_by_step, draws
from tridentflow import Count, LogSource, Pipeline, SourceMode, StateKind, StateSpec
from tridentflow.engines.local import LocalEngine
from tridentflow.errors import PipelineError
from tridentflow.faults import FaultPlan, InjectedFaultError
from tridentflow.ops.audit import audit
from tridentflow.ops.rewind import rewind_pipeline
from tridentflow.ops.status import format_status, status
from tridentflow.steps.committer import commit
from tridentflow.steps.coordinator import coordinate
from tridentflow.steps.emitter import emit
from tridentflow.steps.export import changes_of
from tridentflow.steps.query import list_state
from tridentflow.steps.runtime import Runtime
from tridentflow.testing import TestingError, run_batches
from tridentflow_state import batch_times
from tridentflow_state.backing import Fence
from tridentflow_state.batch_times import BatchTimes, horizon_by_time
from tridentflow_state.keys import KeySpace

START = datetime(2026, 1, 1)
MINUTE_MS = 60_000


def model(
    batches: list[list[str]], times: list[int], period_ms: int, after: int | None = None
) -> tuple[dict[str, int], list[set[str]]]:
    """The rule, written out: each txid's words counted in, then every word the txid did not
    update whose last update was at a txid ``period_ms`` or more of batch time back (or,
    with ``after``, ``after`` or more txids back) removed. The counts left, and the words
    each txid expired."""
    counts: dict[str, int] = {}
    last: dict[str, int] = {}
    expired: list[set[str]] = []
    for txid, lines in enumerate(batches, start=1):
        at = times[txid - 1]
        words = Counter(w for line in lines for w in line.split())
        for word, n in words.items():
            counts[word] = counts.get(word, 0) + n
            last[word] = txid
        gone = {
            w for w, t in last.items()
            if w not in words and (times[t - 1] <= at - period_ms or (after and t <= txid - after))
        }  # fmt: skip
        for word in gone:
            del counts[word], last[word]
        expired.append(gone)
    return counts, expired


def clock(txids: int, seed: int) -> list[int]:
    """Batch times in ms for txids 1..``txids``: steps of 0-50 minutes (an hour's expiry
    takes one txid or several)."""
    rng = random.Random(f"clock-{seed}")
    times, now = [], int(START.timestamp() * 1000)
    for _ in range(txids):
        now += rng.choice((0, 10, 20, 30, 50)) * MINUTE_MS
        times.append(now)
    return times


def frozen(times: list[int]):
    """A batch clock (Runtime.batch_clock) that reads ``times``: txid -> ms."""
    return lambda txid: times[txid - 1]


# -- the pipeline spec ---------------------------------------------------------------------------


@pytest.mark.parametrize("period", [timedelta(0), timedelta(microseconds=10), -HOUR, 3600, "1h"])
def test_expire_after_must_be_a_timedelta_of_a_millisecond_or_more(period):
    with pytest.raises(PipelineError, match=r"expire_after=.* is not a timedelta of 1 ms or more"):
        StateSpec("counts", expire_after=period)


def test_a_non_transactional_state_cannot_expire_in_time_either():
    with pytest.raises(PipelineError, match="keeps no txid to expire by"):
        StateSpec("counts", StateKind.NON_TRANSACTIONAL, expire_after=HOUR)


def test_the_horizon_is_the_newest_txid_at_or_before_the_cut_off():
    times = {1: 0, 2: 10, 3: 10, 4: 25}
    assert [horizon_by_time(times, 5, 30, p) for p in (0, 5, 20, 21, 30, 31)] == [4, 4, 3, 1, 1, 0]
    assert horizon_by_time(times, 3, 30, 0) == 2  # only txids before the committing one


# -- the rule, with no server (tridentflow.testing) ------------------------------------------------


@pytest.mark.parametrize("after", [None, 3], ids=["time", "either"])
@pytest.mark.parametrize("seed", range(4))
def test_the_harness_keeps_exactly_the_keys_the_rule_keeps_by_batch_time(after, seed):
    batches, times = draws(12, seed), clock(12, seed)
    rng = random.Random(f"faults-{seed}")
    states = run_batches(
        expiring("opaque", after=after, period=HOUR),
        batches,
        replay=sorted(rng.sample(range(1, 13), 3)),
        crash_mid_commit=sorted(rng.sample(range(1, 13), 3)),
        at=[datetime.fromtimestamp(t / 1000) for t in times],
    )
    expected, expired = model(batches, times, HOUR // timedelta(milliseconds=1), after)
    assert any(expired) and states["counts"] == expected


def test_the_harness_without_batch_times_expires_nothing_by_time():
    states = run_batches(expiring("opaque", after=None, period=HOUR), [["a"], ["b"], ["c"]])
    assert states["counts"] == {"a": 1, "b": 1, "c": 1}


def test_the_harness_refuses_batch_times_that_go_back_or_do_not_match_the_batches():
    pipeline = expiring("opaque", after=None, period=HOUR)
    with pytest.raises(TestingError, match=r"txid 2's batch time .* is before txid 1's"):
        run_batches(pipeline, [["a"], ["b"]], at=[START, START - HOUR])
    with pytest.raises(TestingError, match=r"one datetime per batch \(2\)"):
        run_batches(pipeline, [["a"], ["b"]], at=[START])


# -- the rule in Redis ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["tests.pipelines:expiring_in_time",
                                  "tests.pipelines:expiring_in_time_sharded",
                                  "tests.pipelines:expiring_in_time_transactional",
                                  "tests.pipelines:expiring_either_way"])  # fmt: skip
def test_redis_keeps_exactly_the_keys_the_rule_keeps_with_a_fault_at_every_point(
    redis_url, home, name
):
    """A fault at every point of the txids that expire keys: the state after the last txid
    is the rule's; each txid's change log removes exactly the keys it expired; the history
    keeps each txid's batch time; audit's recount (by those times) is clean."""
    batches, times = draws(12, seed=11), clock(12, seed=11)
    rt = runtime(name, redis_url, home).with_(batch_clock=frozen(times))
    rt.ledger.reset(force=True)
    after = rt.pipeline.states["counts"].state.expire_after_txids
    expected, expired = model(batches, times, HOUR // timedelta(milliseconds=1), after)
    points = iter(POINTS * 4)
    faults = {t: f"{next(points)}@{t}" for t in range(1, 13) if expired[t - 1] or t % 3 == 0}
    _step_by_step(rt, batches, faults)
    assert sum(map(len, expired)) >= 5 and _counts(rt) == expected
    feed = rt.pipeline.feeds[0]
    for txid in range(1, 13):
        removed = {key[0] for _encoded, key, value in changes_of(rt, feed, txid) if value is None}
        assert removed == expired[txid - 1], txid
    history = {entry["txid"]: entry for entry in rt.ledger.history(20)}
    assert [history[t]["at_ms"] for t in range(1, 13)] == times
    report = audit(rt)
    assert (report.ok, report.unaudited, report.keys) == (True, [], len(expected)), report.line()


def test_a_retry_on_another_clock_decides_as_the_frozen_batch_time_says(redis_url, home):
    """Txid 2 is coordinated at 00:30 and its commit dies half-way; its retry runs where the
    clock says 05:00 (a later task, another host): the batch time is still 00:30, so ``a``
    (last updated at 00:00) is kept - expired only at txid 3 (01:10)."""
    times = [0, 30 * MINUTE_MS, 70 * MINUTE_MS]
    late = [5 * 60 * MINUTE_MS] * 3
    rt = runtime("tests.pipelines:expiring_in_time", redis_url, home)
    rt.ledger.reset(force=True)
    first = rt.with_(batch_clock=frozen(times))
    _step_by_step(first, [["a b"]], {})
    crashing = first.with_(faults=FaultPlan.parse("mid-commit@2"))
    from tests.helpers import produce

    produce(rt, ["b"])
    coordinate(crashing, 2, batch_size=1000)
    emit(crashing, 2, LocalEngine())
    with pytest.raises(InjectedFaultError):
        commit(crashing, 2)
    retry = rt.with_(batch_clock=frozen(late))
    coordinate(retry, 2, batch_size=1000)  # the stored metadata: the time frozen at 00:30
    emit(retry, 2, LocalEngine())
    commit(retry, 2)
    assert _counts(rt) == {"a": 1, "b": 2}
    _step_by_step(first, [["b"]], {}, first=3)
    assert _counts(rt) == {"b": 3}
    assert audit(rt).ok


def test_batch_times_never_go_back_along_the_txids(redis_url, home):
    """A clock that goes back (a failover to a Redis whose clock is behind): the coordinator
    freezes txid-1's time instead, so no key's last update moves into the future."""
    times = [0, 60 * MINUTE_MS, 10 * MINUTE_MS, 100 * MINUTE_MS]
    rt = runtime("tests.pipelines:expiring_in_time", redis_url, home)
    rt.ledger.reset(force=True)
    rt = rt.with_(batch_clock=frozen(times))
    _step_by_step(rt, [["a"], ["b"], ["c"], ["d"]], {})
    history = {entry["txid"]: entry["at_ms"] for entry in rt.ledger.history(10)}
    assert [history[t] for t in (1, 2, 3, 4)] == [m * MINUTE_MS for m in (0, 60, 60, 100)]
    assert _counts(rt) == {"b": 1, "c": 1, "d": 1}  # c at 01:00, not 00:10: kept at 01:40
    assert audit(rt).ok


def test_the_batch_times_a_later_claim_can_ask_for_are_kept_and_older_ones_thinned(
    redis_url, home, monkeypatch
):
    """30 txids ten minutes apart, an hour's expiry: without rewinds the sorted set keeps
    every txid from the one an hour behind the last on; with undo logs of 5 txids, from the
    one an hour behind the oldest txid a rewind may return to. Older txids are thinned to the
    newest of each hour of batch time (txids 6, 12, 18 end hours 0-2; 23 the fourth's part
    below the exact ones)."""
    for retain, oldest, thinned in ((0, 24, [6, 12, 18, 23]), (5, 19, [6, 12, 18])):
        monkeypatch.setenv("TRIDENTFLOW_RETAIN_TXIDS", str(retain))
        rt = runtime("tests.pipelines:expiring_in_time", redis_url, home)
        rt.ledger.reset(force=True)
        times = [t * 10 * MINUTE_MS for t in range(30)]
        rt = rt.with_(batch_clock=frozen(times))
        _step_by_step(rt, [["w"]] * 30, {})
        kept = BatchTimes(rt.client, rt.keyspace).all()
        assert sorted(kept) == [*thinned, *range(oldest, 31)], retain
        assert all(kept[t] == times[t - 1] for t in kept)


def _claims(client, keyspace, times: list[int], first: int, periods: list[int], retain: int):
    """Claim txids ``first``.. (batch times ``times[txid - 1]``) as commits do (the ledger
    moved along, each txid's commit token set): txid -> period -> the horizon answered."""
    times_of = BatchTimes(client, keyspace)
    answers = {}
    for txid in range(first, len(times) + 1):
        client.hset(keyspace.ledger, "committed", txid - 1)
        client.hset(keyspace.tx(txid), "commit_token", 1)
        found = times_of.claim(Fence(txid, 1), times[txid - 1], retain, periods)
        answers[txid] = found
    return answers


@pytest.mark.parametrize("seed", range(12))
def test_a_longer_period_deployed_later_expires_at_most_an_hour_late_never_early(
    redis_client, seed, monkeypatch
):
    """Code with short periods claims 150 txids (random steps of batch time, a random undo
    window), then code with a period up to 30 times longer claims 150 more - the times it
    reaches back to were thinned by the first code. Every answer of the first code's periods
    is exact; the longer one's answer is never after the exact horizon (no key expires early)
    and every txid in between lies in the exact horizon's hour (late by less than an hour of
    batch time). Pages of 3 txids exercise the thinning's watermark. Before the thinning,
    the longer period answered 0 - nothing expired - until its whole period had passed."""
    monkeypatch.setattr(batch_times, "THIN_PAGE", 3)
    rng = random.Random(f"thin-{seed}")
    now, times = 0, []
    for _ in range(300):
        now += rng.choice((0, 1, 5, 10, 20, 45, 90)) * MINUTE_MS
        times.append(now)
    short = sorted({rng.randint(10, 120) * MINUTE_MS for _ in range(2)})
    longer = [*short, rng.randint(150, 3600) * MINUTE_MS]
    retain = rng.choice((0, 0, 3, 10))
    keyspace = KeySpace(f"thin-{seed}")
    before = _claims(redis_client, keyspace, times[:150], 1, short, retain)
    after = _claims(redis_client, keyspace, times, 151, longer, retain)
    every = dict(enumerate(times, start=1))
    hour = batch_times.THIN_MS
    for txid, found in [*before.items(), *after.items()]:
        for period, answer in found.items():
            exact = horizon_by_time(every, txid, times[txid - 1], period)
            if period in short:
                assert answer == exact, (txid, period)
                continue
            assert answer <= exact, (txid, period)
            late = range(answer + 1, exact + 1)
            same_hour = all(times[t - 1] // hour == times[exact - 1] // hour for t in late)
            assert same_hour, (txid, answer, exact)
    kept = BatchTimes(redis_client, keyspace).all()
    hours = len({ms // hour for ms in times})
    assert len(kept) <= hours + 300 - min(after) + 1  # thinned: one an hour at most below


def _two_rules(totals_period: timedelta | None) -> Pipeline:
    """Words into ``counts`` (expiring after an hour of batch time) and ``totals``
    (``totals_period``; the code a deploy changes)."""
    from tridentflow.examples.wordcount import split

    pipeline = Pipeline(
        "two-rules", LogSource(fields=("sentence",), partitions=2, mode=SourceMode.OPAQUE)
    )
    words = pipeline.stream.each("sentence", split, "word")
    spec = StateSpec("counts", StateKind.OPAQUE, expire_after=HOUR)
    words.group_by("word").persistent_aggregate(spec, Count(), out_field="count")
    spec = StateSpec("totals", StateKind.OPAQUE, expire_after=totals_period)
    words.group_by("word").persistent_aggregate(spec, Count(), out_field="total")
    return pipeline


def test_a_period_added_later_to_another_state_expires_by_the_times_the_first_rule_kept(
    redis_url, home, monkeypatch
):
    """30 txids ten minutes apart under code whose ``totals`` never expire and whose
    ``counts`` expire after an hour; then code giving ``totals`` three hours. Txid 31 builds
    its index; txid 32 (at 05:45) reaches back to 02:45 - txid 17 - where the first code kept
    only the newest txid of each hour (12 at 01:50, 18 at 02:50): it expires every key last
    updated at or before txid 12 and keeps 13-17 (never early; late within 02:00-02:59).
    Without the thinning it expired nothing. Audit recounts each txid by the rule its commit
    applied, the thinned horizon as the commit took it: ``r`` (txids 1 and 25) is not expired
    at txid 20 by a rule that did not exist then (it reported doubled=1)."""
    monkeypatch.setenv("TRIDENTFLOW_RETAIN_TXIDS", "0")
    times = [t * 10 * MINUTE_MS for t in range(30)] + [300 * MINUTE_MS, 345 * MINUTE_MS]
    first = Runtime.open(_two_rules(None), redis_url, home).with_(batch_clock=frozen(times))
    first.ledger.reset(force=True)
    batches = [[f"w{t}" + (" r" if t in (1, 25) else "")] for t in range(1, 31)]
    _step_by_step(first, batches, {})
    assert audit(first).ok
    later = Runtime.open(_two_rules(3 * HOUR), redis_url, home).with_(batch_clock=frozen(times))
    _step_by_step(later, [["x"], ["y"]], {}, first=31)
    page = list_state(later, later.pipeline.states["totals"], limit=100)
    totals = {key[0]: value for key, value in page.items}
    assert set(totals) == {*(f"w{t}" for t in range(13, 31)), "r", "x", "y"}
    assert totals["r"] == 2
    report = audit(later)
    assert (report.ok, report.unaudited) == (True, []), report.line()


def test_a_rewind_brings_expired_keys_back_and_the_replay_judges_by_its_own_batch_time(
    redis_url, home, monkeypatch
):
    monkeypatch.setenv("TRIDENTFLOW_RETAIN_TXIDS", "10")
    times = [0, 40 * MINUTE_MS, 80 * MINUTE_MS, 90 * MINUTE_MS]
    rt = runtime("tests.pipelines:expiring_in_time", redis_url, home)
    rt.ledger.reset(force=True)
    rt = rt.with_(batch_clock=frozen(times))
    _step_by_step(rt, [["a"], ["b"], ["c"], ["d"]], {})
    assert _counts(rt) == {"b": 1, "c": 1, "d": 1}  # a (00:00) went at txid 3 (01:20)
    rewind_pipeline(rt, 2, force=True)
    assert _counts(rt) == {"a": 1, "b": 1}
    replay = rt.with_(batch_clock=frozen([0, 40 * MINUTE_MS, 50 * MINUTE_MS]))
    coordinate(replay, 3, batch_size=1000)  # c and d as one batch, at 00:50 this time
    emit(replay, 3, LocalEngine())
    commit(replay, 3)
    assert _counts(rt) == {"a": 1, "b": 1, "c": 1, "d": 1}  # 00:50: a is not an hour old
    assert BatchTimes(rt.client, rt.keyspace).all() == {1: 0, 2: 40 * MINUTE_MS, 3: 50 * MINUTE_MS}
    assert audit(rt).ok


def test_status_says_the_rule_in_batch_time(redis_url, home):
    rt = runtime("tests.pipelines:expiring_either_way", redis_url, home)
    rt.ledger.reset(force=True)
    rt = rt.with_(batch_clock=frozen([0, 70 * MINUTE_MS]))
    _step_by_step(rt, [["a"], ["b"]], {})
    info = status(rt)["states"]["counts"]
    assert (info["expire_after_txids"], info["expire_after_seconds"]) == (3, 3600.0)
    assert info["expired_by_txid"] == {"2": 1, "1": 0}
    assert "expire after 3 txids or 1:00:00 of batch time (expired by txid 2: 1, 1: 0)" in (
        format_status(status(rt))
    )
