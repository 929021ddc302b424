"""Benchmark: what a FileSource remembers in Redis after 100,000 and 1,000,000 files (issue 69,
goal 3) - by default (every file remembered, for ever) and with ``forget_after`` (bounded).

    python -m benchmarks.file_memory [--files 100000,1000000] [--per-day 10000] [--forget-days 1]

A bucket receives --per-day files a day, evenly spaced (mtimes), under date-partitioned names
of a realistic length (``s3://landing/events/date=2026-11-03/part-00042-<uuid>.parquet``).
The coordinator's listings are replayed as the production code takes them
(``FilesLog.take``, through TAKE_FILES): each listing brings the files landed since the last
(an hour's worth), then every taken file is committed (the committed offsets move to the
heads) and, with ``forget_after``, the manifest is trimmed as the coordinator's scan does.
Only the bookkeeping is measured, not the files (none exist): the bytes are Redis's own
``MEMORY USAGE`` of every key of the pipeline, after the last listing.

* ``remember-all``: the default - every file stays in the taken hash and the manifest;
* ``forget``: ``forget_after=--forget-days`` days; with ``retain_txids`` 24 (a day of hourly
  txids kept rewindable), the manifest keeps what those txids read.

Needs a Redis: TRIDENTFLOW_REDIS_URL, else a private redis-server (no persistence).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from tridentflow.devtools import devredis
from tridentflow.sources.files import FilesLog, FoundFile
from tridentflow.steps.runtime import connect
from tridentflow_state.keys import KeySpace

T0 = 1_780_000_000  # 2026-05-28: the first file's mtime (s)
HOURS_PER_DAY = 24


def spec(forget_days: float | None) -> dict:
    return {
        "uri": "s3://landing/events",
        "format": "parquet",
        "pattern": "*.parquet",
        "partitions": 1,
        "min_age_s": 0,
        "forget_after_s": forget_days * 86400 if forget_days else None,
    }


def name(i: int, when: int) -> str:
    day = datetime.fromtimestamp(when, UTC).strftime("%Y-%m-%d")
    return f"landing/events/date={day}/part-{i % 100000:05}-{uuid.UUID(int=i)}.parquet"


def pipeline_bytes(client, keyspace: KeySpace) -> int:
    return sum(
        int(client.memory_usage(key, samples=0) or 0)
        for key in client.scan_iter(match=keyspace.pattern, count=1000)
    )


def run(client, files: int, per_day: int, forget_days: float | None) -> dict:
    """Take ``files`` files hour by hour; the bytes the pipeline's keys hold at the end."""
    keyspace = KeySpace(f"bench-files-{uuid.uuid4().hex[:6]}")
    log = FilesLog(client, "", keyspace, spec(forget_days))
    step = 86400 / per_day
    per_hour = max(1, per_day // HOURS_PER_DAY)
    started = time.perf_counter()
    for txid, first in enumerate(range(0, files, per_hour), 1):
        landed = [
            FoundFile(name(i, int(T0 + i * step)), 40_000, int((T0 + i * step) * 1e9))
            for i in range(first, min(files, first + per_hour))
        ]
        log.take(landed)
        head = log.heads()[0]
        client.hset(keyspace.offsets, "0", head)  # the hour's txid committed
        client.hset(keyspace.ledger, "committed", txid)
        client.hset(keyspace.undo_meta, f"offsets:{txid}", f'{{"0": {head}}}')
        if forget_days:  # the undo logs keep a day of hourly txids rewindable
            client.hset(keyspace.undo_meta, "from", max(1, txid - HOURS_PER_DAY + 1))
            log.trim({0: head})
    took = time.perf_counter() - started
    held = log.remembered()
    used = pipeline_bytes(client, keyspace)
    for key in client.scan_iter(match=keyspace.pattern, count=1000):
        client.unlink(key)
    return {"bytes": used, "seconds": took, **held}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--files", default="100000,1000000")
    parser.add_argument("--per-day", type=int, default=10_000)
    parser.add_argument("--forget-days", type=float, default=1.0)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tf-bench-file-memory-"))
    try:
        with devredis.url_or_private(work / "redis") as url:
            client = connect(url)
            print(
                f"FileSource bookkeeping in Redis: {args.per_day:,} files a day, taken hour by "
                f"hour; forget = forget_after {args.forget_days:g} day(s), retain_txids "
                f"{HOURS_PER_DAY}"
            )
            print(f"{'files':>10} {'mode':>13} {'Redis bytes':>13} {'bytes/file':>10} "
                  f"{'remembered':>10} {'manifest':>9} {'forgotten':>10} "
                  f"{'take s':>7}")  # fmt: skip
            for files in (int(n) for n in args.files.split(",")):
                for mode, days in (("remember-all", None), ("forget", args.forget_days)):
                    got = run(client, files, args.per_day, days)
                    print(
                        f"{files:>10,} {mode:>13} {got['bytes']:>13,} "
                        f"{got['bytes'] / files:>10.1f} {got['taken']:>10,} "
                        f"{got['manifest']:>9,} {got['forgotten']:>10,} {got['seconds']:>7.1f}"
                    )
            client.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
