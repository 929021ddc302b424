"""Benchmark: a word count of a Kafka topic - tridentflow's KafkaSource vs the file log on the
same records, and vs the limit a user would measure against.

    python -m benchmarks.kafka_source [--records 2000000] [--engines local,spark]

Starts a private redis-server and a Tansu broker (tridentflow.devtools.devkafka; in-memory storage)
on free ports, produces ``--records`` sentences (1-6 words, tridentflow.devtools.sample_data) to a
4-partition topic and the same ones to a file log, then times, each on the same machine:

* **KafkaSource**: the whole exactly-once run of ``wordcount-kafka``'s pipeline (coordinate,
  emit, commit of every txid, 250,000 offsets per partition and txid) on each engine;
* **file log**: the same pipeline over the embedded file log holding the same records;
* **the limit**: one confluent-kafka consumer reading the whole topic from offset 0 and
  counting words in a plain Python loop (``str.split`` and a Counter) - no state, no
  exactly-once, nothing kept anywhere but this process's memory.

Every run must end with the same counts (checked). Records/s = records / wall time.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path

from tridentflow.aggregators import Count
from tridentflow.devtools import devredis
from tridentflow.devtools.devkafka import LocalKafka
from tridentflow.devtools.sample_data import sentences
from tridentflow.engines.local import LocalEngine
from tridentflow.examples.wordcount import split
from tridentflow.nodes import StateSpec
from tridentflow.pipeline import Pipeline
from tridentflow.sources.kafka import KafkaLog
from tridentflow.sources.specs import KafkaSource, LogSource, SourceMode
from tridentflow.steps.driver import run_batches
from tridentflow.steps.query import list_state
from tridentflow.steps.runtime import Runtime, connect
from tridentflow_state.maps import StateKind

BATCH = 250_000
TOPIC = "bench-words"


def word_count(name: str, source: LogSource) -> Pipeline:
    pipeline = Pipeline(name, source)
    (
        pipeline.stream.each("sentence", split, "word")
        .group_by("word")
        .persistent_aggregate(StateSpec("counts", StateKind.OPAQUE), Count(), out_field="count")
    )
    return pipeline.validate()


def counts_of(rt: Runtime) -> dict[str, int]:
    page = list_state(rt, rt.pipeline.states["counts"], limit=10_000_000)
    return {k[0]: v for k, v in page.items}


def engine_of(name: str):
    if name == "local":
        return LocalEngine()
    from tridentflow.engines.spark import SparkEngine, spark_session

    return SparkEngine(spark_session("tridentflow-bench-kafka", "local[*]"))


def timed_run(rt: Runtime, engine_name: str) -> float:
    engine = engine_of(engine_name)
    started = time.perf_counter()
    run_batches(rt, engine, batch_size=BATCH)
    return time.perf_counter() - started


def the_limit(bootstrap: str, heads: dict[int, int]) -> tuple[float, Counter]:
    """One consumer, the whole topic, a plain loop."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench-limit",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    started = time.perf_counter()
    consumer.assign([TopicPartition(TOPIC, p, 0) for p in heads])
    counts: Counter = Counter()
    ended: set[int] = set()
    while len(ended) < len(heads):
        for m in consumer.consume(10_000, 0.01):  # what came by then: never a wait per call
            if m.error() is not None:
                ended.add(m.partition())
                continue
            counts.update(json.loads(m.value())["sentence"].split())
    elapsed = time.perf_counter() - started
    consumer.close()
    return elapsed, counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--engines", default="local,spark")
    args = parser.parse_args()
    engines = [e for e in args.engines.split(",") if e]
    work = Path(tempfile.mkdtemp(prefix="tf-bench-kafka-"))
    port = devredis.free_port()
    server = devredis.start(port, work / "redis", appendonly=False)
    url = f"redis://127.0.0.1:{port}/0"
    lines = sentences(args.records, seed=2026)
    expected = Counter(w for line in lines for w in line.split())
    records = [{"sentence": line} for line in lines]
    rows = []
    try:
        with LocalKafka() as broker:
            config = {"bootstrap.servers": broker.bootstrap}
            producer_log = KafkaLog(TOPIC, config, "bench")
            producer_log.create(4)
            started = time.perf_counter()
            for chunk in range(0, len(records), 200_000):
                producer_log.append_spread(records[chunk : chunk + 200_000])
            produced = time.perf_counter() - started
            heads = producer_log.scan().heads
            print(
                f"{args.records:,} records produced to {TOPIC} in {produced:.1f} s "
                f"(heads {sum(heads.values()):,})",
                flush=True,
            )
            for engine in engines:
                for kind in ("kafka", "file"):
                    if kind == "kafka":
                        source: LogSource = KafkaSource(
                            fields=("sentence",),
                            mode=SourceMode.TRANSACTIONAL,
                            partitions=4,
                            batch_size=BATCH,
                            topic=TOPIC,
                            config=config,
                        )
                    else:
                        source = LogSource(fields=("sentence",), partitions=4, batch_size=BATCH)
                    name = f"bench-{kind}-{engine}"
                    home = work / name
                    rt = Runtime(word_count(name, source), connect(url), home)
                    rt.ledger.reset(force=True)
                    if kind == "file":
                        rt.source_heads()
                        rt.log.append_spread(records)
                    seconds = timed_run(rt, engine)
                    assert counts_of(rt) == dict(expected), f"{name}: counts differ"
                    rows.append(
                        (f"{'KafkaSource' if kind == 'kafka' else 'file log'}", engine, seconds)
                    )
                    print(f"  {rows[-1][0]:<12} {engine:<6} {seconds:7.1f} s", flush=True)
            limit, counted = the_limit(broker.bootstrap, heads)
            assert counted == expected, "the limit's counts differ"
            rows.append(("one consumer, plain loop (the limit)", "-", limit))
    finally:
        server.kill()
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nword count of {args.records:,} records (4 partitions), exact counts checked")
    print(f"{'reader':<38} {'engine':<7} {'seconds':>8} {'records/s':>12}")
    for reader, engine, seconds in rows:
        print(f"{reader:<38} {engine:<7} {seconds:8.1f} {args.records / seconds:12,.0f}")


if __name__ == "__main__":
    main()
