"""Pipelines used only by the tests (loaded as tests.pipelines:NAME)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

from tridentflow import (
    Aggregator,
    BatchInfo,
    Combiner,
    Count,
    LogSource,
    Pipeline,
    Reducer,
    SourceMode,
    StateSpec,
    Sum,
)
from tridentflow.examples.mutating import InPlaceCount
from tridentflow.sinks import Sink
from tridentflow_state.maps import StateKind

POISON = "BOOM"


def split_or_raise(sentence: str) -> Iterator[tuple[str]]:
    """Splits like the word count, but raises on the failure sentinel (Bytewax-style)."""
    for word in sentence.split():
        if word == POISON:
            raise ValueError(f"poison word in {sentence!r}")
        yield (word,)


def poison(max_bad_records: int | None = None) -> Pipeline:
    pipeline = Pipeline(
        "poison",
        LogSource(fields=("sentence",), mode=SourceMode.OPAQUE, partitions=2),
        max_bad_records=max_bad_records,
    )
    pipeline.stream.each("sentence", split_or_raise, "word").group_by("word").persistent_aggregate(
        StateSpec("counts", StateKind.OPAQUE), Count()
    )
    return pipeline


def weigh(sentence: str) -> Iterator[tuple[str, float]]:
    """Each word with a float weight: float sums depend on the grouping of their additions."""
    for word in split_or_raise(sentence):
        yield word[0], len(word[0]) / 7 + 0.1


def folds() -> Pipeline:
    """Every kind of fast-path state (fed straight by the source): a Count, a float Sum, a
    Python Combiner that mutates its partials, and a global count (no group key)."""
    pipeline = Pipeline("folds", LogSource(fields=("sentence",), mode=SourceMode.OPAQUE))
    words = pipeline.stream.each("sentence", weigh, ("word", "weight"))
    words.group_by("word").persistent_aggregate(StateSpec("counts"), Count())
    words.group_by("word").persistent_aggregate(StateSpec("weights"), Sum(), "weight", "w")
    words.group_by("word").persistent_aggregate(StateSpec("objects"), InPlaceCount())
    words.persistent_aggregate(StateSpec("total"), Count())
    return pipeline


def strict_poison() -> Pipeline:
    return poison(max_bad_records=1)


def scores() -> Pipeline:
    """Two fields, two states, compound keys: per (user, day) sum and per user count."""
    pipeline = Pipeline(
        "scores", LogSource(fields=("user", "day", "score"), mode=SourceMode.TRANSACTIONAL)
    )
    stream = pipeline.stream
    stream.group_by(["user", "day"]).persistent_aggregate(
        StateSpec("by_day", StateKind.TRANSACTIONAL), Sum(), in_fields="score"
    )
    stream.group_by("user").persistent_aggregate(StateSpec("events", StateKind.OPAQUE), Count())
    return pipeline


class Concat(Reducer):
    """Order-sensitive on purpose: engines must agree on every fold's order."""

    def init(self) -> str:
        return ""

    def reduce(self, acc: str, word: str) -> str:
        return f"{acc}|{word}" if acc else word


class Longest(Aggregator):
    """A full Aggregator with several outputs: every word of the greatest length."""

    def init(self, batch: BatchInfo) -> list:
        return []

    def aggregate(self, acc: list, word: str) -> list:
        if not acc or len(word) > len(acc[0]):
            return [word]
        return [*acc, word] if len(word) == len(acc[0]) else acc

    def complete(self, acc: list) -> list:
        return [(w, len(w)) for w in acc]


def keep_all(current, tuples):
    return [*(current or []), *tuples]


def words_of(sentence: str) -> Iterator[tuple[str, int]]:
    for position, word in enumerate(sentence.split()):
        yield (word, position)


def first_word(word: str, position: int) -> bool:
    return position == 0


def everything() -> Pipeline:
    """Every batch operation in one pipeline, with order-sensitive folds: the engines'
    equality test runs it on Spark and on the local engine."""
    p = Pipeline("everything", LogSource(fields=("sentence",), partitions=3))
    words = p.stream.each("sentence", words_of, ["word", "position"])
    counts = words.group_by("word").persistent_aggregate(StateSpec("counts"), Count())
    words.partition_by("word").parallelism_hint(3).group_by("word").partition_aggregate(
        "position", Concat(), "positions"
    ).partition_persist(StateSpec("per_partition"), keep_all, in_fields=("word", "positions"))
    firsts = words.filter(["word", "position"], first_word).project("word")
    lasts = words.shuffle().parallelism_hint(2).project("word")
    merged = p.merge(firsts, lasts)
    merged.group_by("word").persistent_aggregate(StateSpec("concat"), Concat(), "word")
    chained = (
        words.global_()
        .chained_agg()
        .aggregate("word", Count(), "n")
        .aggregate("word", Longest(), ["longest", "length"])
        .chain_end()
    )
    chained.partition_persist(StateSpec("chain"), keep_all, in_fields=chained.fields)
    looked_up = words.state_query(counts, "word", "before")
    looked_up.partition_persist(StateSpec("answers"), keep_all, in_fields=["word", "before"])
    by_sentence = words.group_by("word").aggregate("position", Sum(), "total")
    joined = p.join(
        looked_up, "word", by_sentence, "word", ["word", "sentence", "position", "before", "total"]
    )
    joined.broadcast().parallelism_hint(2).partition_aggregate(
        ["word"], Concat(), "all"
    ).partition_persist(StateSpec("joined"), keep_all, in_fields="all")
    # Trident's localOrShuffle (stays put; with a hint that changes the partitions, a shuffle),
    # a hinted state stage, and a grouped state query
    words.local_or_shuffle().project("word").group_by("word").persistent_aggregate(
        StateSpec("local"), Concat(), "word"
    ).parallelism_hint(3)
    words.local_or_shuffle().parallelism_hint(5).group_by("word").partition_aggregate(
        "position", Concat(), "positions"
    ).partition_persist(StateSpec("local5"), keep_all, in_fields=("word", "positions"))
    words.group_by("word").state_query(counts, "seen").partition_persist(
        StateSpec("grouped_query"), keep_all, in_fields=["word", "seen"]
    )
    return p


class AddN(Combiner):
    """The issue's Combiner: mutates and returns its left argument."""

    def init(self, *values):
        return {"n": 1}

    def combine(self, a, b):
        a["n"] += b["n"]
        return a

    def zero(self):
        return {"n": 0}


class AppendAll(Reducer):
    """The issue's Reducer: appends to its accumulator in place."""

    def init(self):
        return []

    def reduce(self, acc, word):
        acc.append(word)
        return acc


def in_place() -> Pipeline:
    """An opaque source, opaque states fed by aggregators that mutate their arguments."""
    pipeline = Pipeline(
        "in-place", LogSource(fields=("sentence",), mode=SourceMode.OPAQUE, partitions=2)
    )
    words = pipeline.stream.each("sentence", split_or_raise, "word")
    words.group_by("word").persistent_aggregate(StateSpec("n", StateKind.OPAQUE), AddN())
    words.group_by("word").persistent_aggregate(
        StateSpec("all", StateKind.OPAQUE), AppendAll(), "word"
    )
    pipeline.stream.persistent_aggregate(StateSpec("total", StateKind.OPAQUE), AddN())
    return pipeline


class Explodes(Aggregator):
    """A full Aggregator that raises inside a Spark task (after the record stage, so the
    batch fails visibly instead of quarantining a record)."""

    def init(self, batch: BatchInfo) -> int:
        return 0

    def aggregate(self, acc: int, word: str) -> int:
        if word == POISON:
            raise ValueError(f"cannot aggregate {word!r}")
        return acc + 1

    def complete(self, acc: int) -> list:
        return [acc]


def explodes() -> Pipeline:
    pipeline = Pipeline("explodes", LogSource(fields=("word",), mode=SourceMode.OPAQUE))
    pipeline.stream.partition_by("word").group_by("word").aggregate(
        "word", Explodes(), "n"
    ).partition_persist(StateSpec("n", StateKind.OPAQUE), keep_all, "word", "n")
    return pipeline


def slow_word(sentence: str) -> Iterator[tuple[str]]:
    """A per-record function that takes its time: a job long enough to be cut mid-way."""
    import time

    time.sleep(0.02)
    for word in sentence.split():
        yield (word,)


def slow() -> Pipeline:
    """A word count whose every record costs 20 ms (Spark jobs that run for seconds)."""
    pipeline = Pipeline("slow", LogSource(fields=("sentence",), mode=SourceMode.OPAQUE))
    pipeline.stream.each("sentence", slow_word, "word").group_by("word").persistent_aggregate(
        StateSpec("counts", StateKind.OPAQUE), Count()
    )
    return pipeline


def _shared_words(name: str) -> Pipeline:
    from tridentflow.examples.wordcount import wordcount_over
    from tridentflow.sources.specs import RedisStreamSource

    source = RedisStreamSource(
        fields=("sentence",),
        mode=SourceMode.OPAQUE,
        partitions=2,
        streams="shared-events:p{partition}",
    )
    return wordcount_over(name, source, "a word count over streams other readers share")


def shared_a() -> Pipeline:
    """Two pipelines reading the same two streams (``shared-events:p0``, ``p1``)."""
    return _shared_words("shared-a")


def shared_b() -> Pipeline:
    return _shared_words("shared-b")


# -- sinks (tests/test_sinks.py) ---------------------------------------------------------------


def apply_ops(current, tuples):
    """``set KEY VALUE`` sets, ``del KEY`` removes (REMOVE): the last op of the batch wins."""
    from tridentflow_state.maps import REMOVE

    op, value = tuples[-1]
    return REMOVE if op == "del" else value


def parse_op(line: str) -> Iterator[tuple[str, str, int | None]]:
    parts = line.split()
    if parts[0] == "set":
        yield ("set", parts[1], int(parts[2]))
    else:
        yield ("del", parts[1], None)


def times_ten(word, count):
    return (word, None if count is None else count * 10)


def is_long(word, count) -> bool:
    return len(word) > 2


def sinked() -> Pipeline:
    """Word counts and a key/value state with removals, each exported to PostgreSQL (through
    map and filter for the counts) and to a Redis stream; DSN from TRIDENTFLOW_POSTGRES_DSN."""
    from tridentflow import PostgresSink, RedisStreamSink

    pipeline = Pipeline(
        "sinked",
        LogSource(fields=("line",), mode=SourceMode.TRANSACTIONAL, partitions=2, batch_size=1),
        change_log_limit=3,
    )
    counts = (
        pipeline.stream.filter("line", lambda line: not line.startswith(("set ", "del ")))
        .each("line", lambda line: ((w,) for w in line.split()), "word")
        .group_by("word")
        .persistent_aggregate(StateSpec("counts", StateKind.OPAQUE), Count(), out_field="count")
    )
    kv = (
        pipeline.stream.filter("line", lambda line: line.startswith(("set ", "del ")))
        .each("line", parse_op, ["op", "key", "value"])
        .partition_persist(StateSpec("kv", StateKind.OPAQUE), apply_ops, "key", ["op", "value"])
    )
    counts.new_values_stream().map(times_ten).filter(["word", "count"], is_long).sink(
        PostgresSink("counts_x10")
    )
    kv.new_values_stream().sink(PostgresSink("kv"))
    kv.new_values_stream().sink(RedisStreamSink("kv-changes{partition}", partitions=2))
    return pipeline


def kv_follower() -> Pipeline:
    """Reads sinked's kv-changes streams and counts the changes per key (exactly-once end to
    end: chained pipelines)."""
    from tridentflow import RedisStreamSource

    pipeline = Pipeline(
        "kv-follower",
        RedisStreamSource(fields=("key", "value"), streams="kv-changes{partition}", partitions=2,
                          mode=SourceMode.TRANSACTIONAL, batch_size=3),
    )  # fmt: skip
    pipeline.stream.group_by("key").persistent_aggregate(
        StateSpec("changes", StateKind.OPAQUE), Count(), out_field="n"
    )
    return pipeline


# -- undo logs: query as of, rewind (tests/test_rewind.py) -------------------------------------


def kept(version: int = 1) -> Pipeline:
    """Every kind of state write with undo logs kept for 4 txids: word counts (opaque, the
    numeric Lua path), a transactional Sum of word lengths (times ``version``: the function a
    fix changes), a key/value state with removals (a Python updater, REMOVE) and a global
    count. TRIDENTFLOW_STATE_SHARDS shards them."""
    pipeline = Pipeline(
        "kept",
        LogSource(fields=("line",), mode=SourceMode.TRANSACTIONAL, partitions=2, batch_size=2),
        retain_txids=4,
    )
    words = pipeline.stream.filter("line", lambda line: not line.startswith(("set ", "del "))).each(
        "line", lambda line: ((w,) for w in line.split()), "word"
    )
    words.group_by("word").persistent_aggregate(StateSpec("counts", StateKind.OPAQUE), Count())
    words.each("word", lambda w: ((len(w) * version,),), "size").group_by(
        "word"
    ).persistent_aggregate(StateSpec("sizes", StateKind.TRANSACTIONAL), Sum(), "size", "size")
    words.persistent_aggregate(StateSpec("total", StateKind.OPAQUE), Count())
    pipeline.stream.filter("line", lambda line: line.startswith(("set ", "del "))).each(
        "line", parse_op, ["op", "key", "value"]
    ).partition_persist(StateSpec("kv", StateKind.OPAQUE), apply_ops, "key", ["op", "value"])
    return pipeline


def kept_fixed() -> Pipeline:
    """``kept`` after a fix: the sizes are counted twice over (version 2)."""
    pipeline = kept(2)
    return pipeline


class FlakySink(Sink):
    """A user's sink that keeps each key's last value in a Redis hash, and raises whatever
    ``TF_FLAKY_SINK`` names (``KeyError``, ``OverflowError``, ``RuntimeError``...; unset:
    nothing) in the method ``TF_FLAKY_AT`` names (``apply`` by default, ``position``,
    ``close``): a driver's error, a bug of its own, any foreign exception."""

    resyncable = False

    def __init__(self, name: str = "flaky") -> None:
        self.name = name
        self.fields: tuple[str, ...] = ()

    def bind(self, fields, key_fields) -> FlakySink:
        bound = FlakySink(self.name)
        bound.fields = tuple(fields)
        return bound

    @staticmethod
    def _maybe_raise(where: str) -> None:
        import builtins
        import os

        kind = os.environ.get("TF_FLAKY_SINK")
        if kind and os.environ.get("TF_FLAKY_AT", "apply") == where:
            raise getattr(builtins, kind)(f"the flaky sink's {where} failed")

    def key(self, pipeline: str) -> str:
        return f"flaky-sink:{pipeline}:{self.name}"

    def position(self, ctx) -> int:
        self._maybe_raise("position")
        return int(ctx.client.hget(self.key(ctx.pipeline), "__txid__") or 0)

    def apply(self, ctx, txid, rows, replace_all=False) -> bool:
        import json

        if self.position(ctx) >= txid:
            return False
        ctx.fire("mid-export", txid)
        self._maybe_raise("apply")
        mapping = {json.dumps(list(r[:-1])): json.dumps(r[-1]) for r in rows}
        mapping["__txid__"] = str(txid)
        ctx.client.hset(self.key(ctx.pipeline), mapping=mapping)
        return True

    def close(self) -> None:
        self._maybe_raise("close")


def flaky_sinked() -> Pipeline:
    """Word counts exported to a FlakySink (its failures chosen by the environment)."""
    pipeline = Pipeline(
        "flaky-sinked",
        LogSource(fields=("line",), mode=SourceMode.TRANSACTIONAL, partitions=2, batch_size=1),
    )
    counts = (
        pipeline.stream.each("line", lambda line: ((w,) for w in line.split()), "word")
        .group_by("word")
        .persistent_aggregate(StateSpec("counts", StateKind.OPAQUE), Count(), out_field="count")
    )
    counts.new_values_stream().sink(FlakySink())
    return pipeline


def _key_and_number(line: str) -> Iterator[tuple[str, int]]:
    key, number = line.split()
    yield (key, int(number))


def summed(name: str, sink, transform=None) -> Pipeline:
    """Records ``KEY INTEGER`` summed per key; the new values (key, total), through
    ``transform`` if given (a map), exported to ``sink``."""
    pipeline = Pipeline(
        name, LogSource(fields=("line",), mode=SourceMode.TRANSACTIONAL, partitions=1)
    )
    totals = (
        pipeline.stream.each("line", _key_and_number, ["key", "n"])
        .group_by("key")
        .persistent_aggregate(StateSpec("totals", StateKind.OPAQUE), Sum(), "n", "total")
    )
    changes = totals.new_values_stream()
    if transform is not None:
        changes = changes.map(transform)
    changes.sink(sink)
    return pipeline


def _key_value(*row):
    return row[0], row[-1]


def lakehoused(counts_state: str = "counts", count=None, kv_state: bool = True) -> Pipeline:
    """``sinked``'s states (word counts; a key/value state with removals) exported to Delta
    Lake and Iceberg tables, upserted and appended, under the directory TF_TEST_LAKE names
    (an Iceberg SQL catalog on SQLite there); where TF_TEST_PG_DSN is set, to PostgreSQL
    tables and a Redis stream too. The shape a deploy may change: the counts' state name and
    aggregator (``count``: Count by default), and whether the key/value state is there."""
    import os

    from tridentflow import DeltaSink, IcebergSink, PostgresSink, RedisStreamSink

    lake = os.environ["TF_TEST_LAKE"]
    postgres = os.environ.get("TF_TEST_PG_DSN")
    catalog = {
        "type": "sql",
        "uri": f"sqlite:///{lake}/catalog.db",
        "warehouse": f"file://{lake}/wh",
    }
    pipeline = Pipeline(
        "lakehoused",
        LogSource(fields=("line",), mode=SourceMode.TRANSACTIONAL, partitions=2, batch_size=1),
        change_log_limit=3,
        retain_txids=20,
    )
    counts = (
        pipeline.stream.filter("line", lambda line: not line.startswith(("set ", "del ")))
        .each("line", lambda line: ((w,) for w in line.split()), "word")
        .group_by("word")
        .persistent_aggregate(
            StateSpec(counts_state, StateKind.OPAQUE), count or Count(), out_field="count"
        )
    )
    counts.new_values_stream().sink(DeltaSink(f"{lake}/delta-counts", name="delta-counts"))
    counts.new_values_stream().sink(
        IcebergSink("lake.counts", catalog=catalog, name="iceberg-counts")
    )
    if postgres:
        counts.new_values_stream().sink(PostgresSink("lake_counts", dsn=postgres))
        counts.new_values_stream().map(_key_value, ["key", "value"]).sink(
            RedisStreamSink("lake-counts", name="stream-counts")
        )
    if not kv_state:
        return pipeline
    kv = (
        pipeline.stream.filter("line", lambda line: line.startswith(("set ", "del ")))
        .each("line", parse_op, ["op", "key", "value"])
        .partition_persist(StateSpec("kv", StateKind.OPAQUE), apply_ops, "key", ["op", "value"])
    )
    kv.new_values_stream().sink(DeltaSink(f"{lake}/delta-kv", name="delta-kv"))
    kv.new_values_stream().sink(
        DeltaSink(f"{lake}/delta-kv-log", mode="append", name="delta-kv-log")
    )
    kv.new_values_stream().sink(IcebergSink("lake.kv", catalog=catalog, name="iceberg-kv"))
    kv.new_values_stream().sink(
        IcebergSink("lake.kv_log", catalog=catalog, mode="append", name="iceberg-kv-log")
    )
    if postgres:
        kv.new_values_stream().sink(PostgresSink("lake_kv", dsn=postgres))
    return pipeline


# -- expiry (tests/test_expiry.py) -------------------------------------------------------------


def expiring(
    kind: str = "opaque",
    after: int | None = 2,
    shards: int | None = None,
    period: timedelta | None = None,
    sink: bool = True,
) -> Pipeline:
    """The word count into ``counts`` (over a transactional source for a transactional
    state, else an opaque one), whose keys expire after ``after`` txids without an update
    (and/or ``period`` of batch time); its new values appended to a Redis stream."""
    from tridentflow.examples.wordcount import split
    from tridentflow.sinks.redisstream import RedisStreamSink

    pipeline = Pipeline(
        f"expiring-{kind}",
        LogSource(
            fields=("sentence",),
            partitions=2,
            batch_size=1000,
            mode=SourceMode.OPAQUE if kind == "opaque" else SourceMode.TRANSACTIONAL,
        ),
        state_shards=shards,
    )
    counts = (
        pipeline.stream.each("sentence", split, "word")
        .group_by("word")
        .persistent_aggregate(StateSpec("counts", kind, expire_after_txids=after,
                                        expire_after=period), Count(), out_field="count")
    )  # fmt: skip
    if sink:
        counts.new_values_stream().sink(RedisStreamSink(f"expiring-out-{kind}-{shards or 1}"))
    return pipeline


def expiring_transactional() -> Pipeline:
    return expiring("transactional")


def expiring_after_3() -> Pipeline:
    return expiring("opaque", after=3)


def expiring_after_20() -> Pipeline:
    return expiring("opaque", after=20)


def expiring_sharded() -> Pipeline:
    return expiring("opaque", shards=3)


HOUR = timedelta(hours=1)


def expiring_in_time() -> Pipeline:
    """Keys expire after an hour of batch time without an update (tests/test_batch_times.py)."""
    return expiring("opaque", after=None, period=HOUR)


def expiring_in_time_sharded() -> Pipeline:
    return expiring("opaque", after=None, shards=3, period=HOUR)


def expiring_in_time_transactional() -> Pipeline:
    return expiring("transactional", after=None, period=HOUR)


def expiring_either_way() -> Pipeline:
    """After 3 txids or an hour of batch time, whichever comes first."""
    return expiring("opaque", after=3, period=HOUR)


def expiring_either_way_unexported() -> Pipeline:
    """The same, with no sink (its Redis keys are the pipeline's only)."""
    return expiring("opaque", after=3, period=HOUR, sink=False)


# -- the lakehouse sinks' edges (tests/test_lakehouse_edges.py) -------------------------------


def parse_event(line: str) -> Iterator[tuple[object, object, object]]:
    """A JSON event ``{"user": ..., "region": ..., "amount": ...}``; region optional."""
    import json

    event = json.loads(line)
    yield (event["user"], event.get("region"), event["amount"])


def lake_sums() -> Pipeline:
    """The sum of ``amount`` per (user, region) of JSON events - a region may be None, an
    amount an int or a float - exported to a Delta and an Iceberg table under TF_TEST_LAKE
    (as ``lakehoused``). One record a txid."""
    import os

    from tridentflow import DeltaSink, IcebergSink

    lake = os.environ["TF_TEST_LAKE"]
    catalog = {
        "type": "sql",
        "uri": f"sqlite:///{lake}/catalog.db",
        "warehouse": f"file://{lake}/wh",
    }
    adopt = os.environ.get("TF_TEST_ADOPT") == "1"
    pipeline = Pipeline(
        "lake-sums",
        LogSource(fields=("line",), mode=SourceMode.TRANSACTIONAL, partitions=1, batch_size=1),
    )
    totals = (
        pipeline.stream.each("line", parse_event, ["user", "region", "amount"])
        .group_by(["user", "region"])
        .persistent_aggregate(
            StateSpec("totals", StateKind.OPAQUE), Sum(), "amount", out_field="total"
        )
    )
    totals.new_values_stream().sink(DeltaSink(f"{lake}/sums", name="delta-sums", adopt=adopt))
    totals.new_values_stream().sink(
        IcebergSink("lake.sums", catalog=catalog, name="iceberg-sums", adopt=adopt)
    )
    return pipeline
