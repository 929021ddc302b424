"""A fourth kind of source, defined in this module and nowhere else: its specification opens
its log with ``open_log`` as the built-in ones do, and its log declares the optional
capabilities (``produce``, ``delete``, ``trim``, ``chaos``). The CLI's produce, run, status,
audit, query, trim and ``reset --source`` and the chaos harness's source handling work with it
without any other module knowing it exists (issue 39)."""

from __future__ import annotations

import io
import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from tests.conftest import SEED_COUNTS, SEED_SENTENCES
from tridentflow.aggregators import Count
from tridentflow.errors import SourceError
from tridentflow.examples.wordcount import split
from tridentflow.nodes import StateSpec
from tridentflow.ops.cli import main
from tridentflow.pipeline import Pipeline
from tridentflow.sources import custom_locator
from tridentflow.sources.base import ChaosTraits, LogScan, SourceContext
from tridentflow.sources.specs import LogSource, SourceMode
from tridentflow_state.maps import StateKind


class JsonLinesLog:
    """One JSON-lines file per partition in a directory: offsets are line numbers."""

    chaos = ChaosTraits(disturb="none", fresh="ledger-only")

    def __init__(self, directory: str, partitions: int) -> None:
        self.directory = Path(directory)
        self.n = partitions

    @property
    def root(self) -> str:
        return custom_locator("tests.test_source_plugin:reopen", [str(self.directory), self.n])

    def _lines(self, p: int) -> list[str]:
        path = self.directory / f"p{p}.jsonl"
        return path.read_text().splitlines() if path.exists() else []

    def exists(self) -> bool:
        return self.directory.is_dir()

    def partitions(self) -> int:
        return self.n

    def ensure(self, partitions: int) -> int:
        self.directory.mkdir(parents=True, exist_ok=True)
        return self.n

    def scan(self, committed: dict[int, int] | None = None) -> LogScan:
        return LogScan({p: len(self._lines(p)) for p in range(self.n)})

    def probe(self, partition: int, start: int, end: int) -> None:
        if end > len(self._lines(partition)):
            raise SourceError(f"partition {partition} has no offset {end - 1}")

    def read_raw(self, partition: int, start: int, end: int) -> Iterator[tuple[int, bytes]]:
        lines = self._lines(partition)
        for offset in range(start, end):
            yield offset, lines[offset].encode()

    def acknowledge(self, committed: dict[int, int]) -> None:
        pass

    def produce(
        self,
        pipeline: str,
        lines: list[str],
        asked_partitions: int | None,
        source_partitions: int,
        skip_unavailable: bool = False,
    ) -> str:
        self.ensure(self.n)
        for i, line in enumerate(lines):
            with (self.directory / f"p{i % self.n}.jsonl").open("a") as fh:
                fh.write(line + "\n")
        return f"wrote {len(lines)} lines for {pipeline} as JSON lines"

    def trim(self, committed: dict[int, int]) -> dict[int, tuple[int, str]]:
        """Keeps every line; notes what it was asked to trim (the test reads it back)."""
        (self.directory / "trim-asked.json").write_text(json.dumps(committed))
        return {}

    def delete(self) -> None:
        shutil.rmtree(self.directory)


def reopen(spec: list[Any]) -> JsonLinesLog:
    """What read tasks call with the locator's spec."""
    return JsonLinesLog(*spec)


@dataclass(frozen=True)
class JsonLinesSource(LogSource):
    """The fourth source: its specification, opening its own log."""

    uses_redis: ClassVar[bool] = False

    def open_log(self, ctx: SourceContext) -> JsonLinesLog:
        return JsonLinesLog(str(ctx.home / "jsonlines" / ctx.pipeline), self.partitions)


def wordcount_jsonlines() -> Pipeline:
    source = JsonLinesSource(fields=("sentence",), mode=SourceMode.TRANSACTIONAL, partitions=3)
    pipeline = Pipeline("wordcount-jsonlines", source, description="word count of JSON lines")
    (
        pipeline.stream.each("sentence", split, "word")
        .group_by("word")
        .persistent_aggregate(StateSpec("counts", StateKind.OPAQUE), Count(), out_field="count")
    )
    return pipeline


REF = "tests.test_source_plugin:wordcount_jsonlines"


def cli(*args: str) -> str:
    out = io.StringIO()
    assert main(list(args), out) == 0
    return out.getvalue()


def test_a_fourth_source_works_through_every_command(redis_url, redis_client, home, tmp_path):
    where = ["--redis-url", redis_url, "--home", str(home)]
    data = tmp_path / "lines.txt"
    data.write_text("\n".join(SEED_SENTENCES) + "\n")
    said = cli("produce", REF, str(data), "--home", str(home))  # no Redis needed to append
    assert said == "wrote 3 lines for wordcount-jsonlines as JSON lines\n"
    directory = home / "jsonlines" / "wordcount-jsonlines"
    assert sorted(p.name for p in directory.iterdir()) == ["p0.jsonl", "p1.jsonl", "p2.jsonl"]

    cli("run", REF, "--engine", "local", "--no-progress", *where)
    assert cli("audit", REF, *where).strip() == "lost=0 doubled=0"
    counted = cli("query", REF, *SEED_COUNTS, *where).splitlines()
    assert counted == [f"{w}\t{n}" for w, n in SEED_COUNTS.items()]
    status = json.loads(cli("status", REF, "--json", *where))
    assert status["committed_txid"] == 1
    said = cli("trim", REF, *where)
    assert said == "trimmed 0 committed entries of wordcount-jsonlines (read by every reader)\n"
    assert json.loads((directory / "trim-asked.json").read_text()) == {"0": 1, "1": 1, "2": 1}

    cli("reset", REF, "--source", "--yes", *where)
    assert not directory.exists()  # the log's delete(), called by reset --source
    assert json.loads(cli("status", REF, "--json", *where))["committed_txid"] == 0


def test_the_chaos_harness_runs_schedules_on_the_fourth_source(redis_url, redis_client):
    """Faults at every step, crashes, retries, resets in flight over the fourth source: it
    declared no disturbance of its own (``ChaosTraits(disturb="none")``), so the harness
    appends through its ``produce`` and does everything else it does to any pipeline."""
    from tridentflow.devtools.chaos import run_chaos

    results = run_chaos(6, seed=4000, pipelines=[REF], redis_restarts=False, redis_url=redis_url)
    assert len(results) == 6 and all(r.ok for r in results), [r.line() for r in results]
