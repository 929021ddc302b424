"""Batch operations (repartitions, aggregates, merge, join) against plain-Python references on
random batches (hypothesis), on the local engine. The references are written independently
of tridentflow.engines.batchops: they only know the documented order of a batch (partition by
partition, offset by offset)."""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tridentflow import (
    Aggregator,
    Count,
    First,
    LogSource,
    Max,
    Mean,
    Min,
    Pipeline,
    Reducer,
    StateSpec,
    Sum,
)
from tridentflow.aggregators import apply_staged
from tridentflow.engines.base import ExecContext
from tridentflow.engines.local import LocalEngine
from tridentflow.pipeline import Stream
from tridentflow.plan import compile_pipeline
from tridentflow.sources.filelog import FileLog
from tridentflow_state.maps import GLOBAL_KEY

USERS = ["ann", "bob", "cy", "dee"]
record = st.fixed_dictionaries(
    {
        "user": st.sampled_from(USERS),
        "n": st.integers(min_value=-20, max_value=20),
        "flag": st.sampled_from([0, 1, 1.0, True, "1"]),
    }
)
batches = st.lists(st.lists(record, max_size=12), min_size=1, max_size=4)
FIELDS = ("user", "n", "flag")


class Collect(Reducer):
    """Order-sensitive: the values in the order the fold sees them."""

    def init(self) -> list:
        return []

    def reduce(self, acc: list, *values: Any) -> list:
        return [*acc, values[0]]


class TopTwo(Aggregator):
    """A full Aggregator with 0..2 outputs: the two largest values, largest first."""

    def init(self, batch):
        return []

    def aggregate(self, acc, n):
        return sorted([*acc, n], reverse=True)[:2]

    def complete(self, acc):
        return [(v,) for v in acc]


def keep_all(current: Any, tuples: list[tuple]) -> list[tuple]:
    return [*(current or []), *tuples]


def collect(stream: Stream, name: str = "out") -> None:
    """Persist every tuple of ``stream`` into one global value, in batch order."""
    stream.partition_persist(StateSpec(name), keep_all, in_fields=stream.fields)


def source(partitions: int = 4) -> Pipeline:
    return Pipeline("ops", LogSource(fields=FIELDS, partitions=partitions))


def run_batch(root: Path, pipeline: Pipeline, parts: list[list[dict]], txid: int = 1) -> dict:
    """Run one batch holding ``parts`` (one list of records per source partition) on the local
    engine; each state's values as the commit would store them on an empty state."""
    log = FileLog(root)
    log.ensure(len(parts))
    for p, records in enumerate(parts):
        log.append(p, records)
    plan = compile_pipeline(pipeline)
    ranges = {p: (0, h) for p, h in log.heads().items()}
    result = LocalEngine().compute(plan, str(root), ranges, ExecContext(txid, ""))
    assert not result.bad
    assert result.stages and all(r.ok for r in result.stages)
    states = pipeline.states
    return {
        name: {k: apply_staged(states[name].aggregator, None, v) for k, v in pairs}
        for name, pairs in result.partials.items()
    }


def flat(parts: list[list[dict]]) -> list[dict]:
    return [r for part in parts for r in part]


@settings(max_examples=40, deadline=None)
@given(parts=batches)
def test_global_aggregates_of_every_kind(tmp_path_factory, parts):
    p = source()
    s = p.stream
    collect(s.aggregate("n", Count(), "c"), "count")
    collect(s.aggregate("n", Sum(), "s"), "sum")
    collect(s.aggregate("n", Min(), "lo"), "min")
    collect(s.aggregate("n", Max(), "hi"), "max")
    collect(s.aggregate("n", Mean(), "mean"), "mean")
    collect(s.aggregate("n", First(), "first"), "first")
    collect(s.aggregate("n", Collect(), "seen"), "reducer")
    collect(s.aggregate("n", TopTwo(), "top"), "aggregator")
    got = run_batch(tmp_path_factory.mktemp("log"), p, parts)
    ns = [r["n"] for r in flat(parts)]
    one = lambda name: [tuple(t) for t in got[name].get(GLOBAL_KEY, [])]  # noqa: E731
    assert one("count") == [(len(ns),)]  # an empty batch gives zero()
    assert one("sum") == [(sum(ns),)]
    assert one("min") == [(min(ns, default=None),)]
    assert one("max") == [(max(ns, default=None),)]
    assert one("mean") == [([sum(ns), len(ns)],)]
    assert one("first") == [(ns[0] if ns else None,)]
    assert one("reducer") == [(ns,)]  # batch order: partition by partition, in offset order
    top = sorted(ns, reverse=True)[:2]
    assert one("aggregator") == [(v,) for v in top]


@settings(max_examples=40, deadline=None)
@given(parts=batches)
def test_grouped_aggregates_and_chains(tmp_path_factory, parts):
    p = source()
    by_user = p.stream.group_by("user")
    collect(by_user.aggregate("n", Sum(), "s"), "sum")
    collect(by_user.aggregate("n", Collect(), "seen"), "reducer")
    collect(by_user.aggregate("n", TopTwo(), "top"), "top")
    chain = by_user.chained_agg().aggregate("n", Count(), "c").aggregate("n", Max(), "hi")
    collect(chain.aggregate("n", TopTwo(), "top").chain_end(), "chain")
    got = run_batch(tmp_path_factory.mktemp("log"), p, parts)
    groups: dict[str, list[int]] = defaultdict(list)
    for r in flat(parts):
        groups[r["user"]].append(r["n"])
    tuples = lambda name: sorted(tuple(t) for t in got[name].get(GLOBAL_KEY, []))  # noqa: E731
    assert tuples("sum") == sorted((u, sum(ns)) for u, ns in groups.items())
    assert tuples("reducer") == sorted((u, ns) for u, ns in groups.items())
    assert tuples("top") == sorted(
        (u, v) for u, ns in groups.items() for v in sorted(ns, reverse=True)[:2]
    )
    assert tuples("chain") == sorted(
        (u, len(ns), max(ns), v) for u, ns in groups.items() for v in sorted(ns, reverse=True)[:2]
    )


@settings(max_examples=40, deadline=None)
@given(parts=batches)
def test_partition_level_operations(tmp_path_factory, parts):
    p = source()
    s = p.stream
    # on the source stage: one partition per source partition read, empty ones included
    collect(s.partition_aggregate("n", Count(), "c"), "per_source")
    collect(s.partition_aggregate("n", Collect(), "seen"), "reducer_per_source")
    by_user = s.partition_by("user").parallelism_hint(3)
    collect(by_user.group_by("user").partition_aggregate("n", Count(), "c"), "by_user")
    collect(by_user.partition_aggregate("n", Count(), "c"), "per_partition")
    collect(s.broadcast().parallelism_hint(3).partition_aggregate("n", Count(), "c"), "broadcast")
    collect(s.shuffle().parallelism_hint(2).partition_aggregate("n", Count(), "c"), "shuffled")
    collect(s.global_().parallelism_hint(2).partition_aggregate("n", Count(), "c"), "global")
    collect(s.batch_global().partition_aggregate("n", Sum(), "s"), "batch_global")
    got = run_batch(tmp_path_factory.mktemp("log"), p, parts)
    total = sum(len(part) for part in parts)
    values = lambda name: [tuple(t) for t in got[name].get(GLOBAL_KEY, [])]  # noqa: E731
    assert values("per_source") == [(len(part),) for part in parts]  # zero() when empty
    assert values("reducer_per_source") == [([r["n"] for r in part],) for part in parts]
    assert sorted(values("by_user")) == sorted(Counter(r["user"] for r in flat(parts)).items())
    per_partition = values("per_partition")
    assert len(per_partition) == 3 and sum(c for (c,) in per_partition) == total
    assert values("broadcast") == [(total,)] * 3
    shuffled = values("shuffled")
    assert len(shuffled) == 2 and sum(c for (c,) in shuffled) == total
    assert values("global") == [(total,), (0,)]  # Trident: the other task completes empty
    assert values("batch_global") == [(sum(r["n"] for r in flat(parts)),)]


@settings(max_examples=40, deadline=None)
@given(parts=batches)
def test_merge_join_and_compound_keys(tmp_path_factory, parts):
    p = source()
    s = p.stream
    positive = s.filter("n", lambda n: n > 0).project(["user", "n"])
    negative = s.filter("n", lambda n: n < 0).map(lambda u, n, f: (u, -n), ["who", "size"])
    merged = p.merge(positive, negative)
    collect(merged.group_by("user").aggregate("n", Sum(), "s"), "merged")
    totals = s.group_by("user").aggregate("n", Sum(), "total")
    collect(p.join(s, "user", totals, "user", ["user", "n", "flag", "total"]), "joined")
    s.group_by(["user", "flag"]).persistent_aggregate(StateSpec("compound"), Collect(), "n")
    got = run_batch(tmp_path_factory.mktemp("log"), p, parts)
    rows = flat(parts)
    magnitude: Counter = Counter()
    for r in rows:
        magnitude[r["user"]] += abs(r["n"])
    merged_rows = sorted(tuple(t) for t in got["merged"].get(GLOBAL_KEY, []))
    assert merged_rows == sorted((u, m) for u, m in magnitude.items() if m)
    user_total: Counter = Counter()
    for r in rows:
        user_total[r["user"]] += r["n"]
    expected_join = sorted(
        (r["user"], r["n"], repr(r["flag"]), user_total[r["user"]]) for r in rows
    )
    joined = sorted((u, n, repr(f), t) for u, n, f, t in got["joined"].get(GLOBAL_KEY, []))
    assert joined == expected_join
    compound: dict[tuple, list[int]] = defaultdict(list)
    for r in rows:  # 1, 1.0, True and "1" are four different keys
        compound[(r["user"], type(r["flag"]).__name__, r["flag"])].append(r["n"])
    assert len(got["compound"]) == len(compound)
    assert sorted(map(tuple, got["compound"].values())) == sorted(map(tuple, compound.values()))
