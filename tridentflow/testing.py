"""Test a pipeline under pytest with no server: no Redis, no JVM, no Airflow.

``run_batches(pipeline, batches, replay=[...])`` runs consecutive txids of a pipeline on the
local engine (the same plan, operations and aggregators the Spark engine runs), stages each emit
attempt through production's file staging area (``tridentflow.steps.staging``: every partial
as the JSON line the commit reads back, the completeness check on loading) and commits what
it loads back through the production commit - ``tridentflow_state.commit.CommitAttempt``'s
phases and the committer's Python apply, over in-memory states and an in-memory ledger
(``MemoryCommitStore``) - so a test and production cannot disagree: the same txid rules
(``tridentflow_state.maps``: a transactional state skips a key its txid already wrote, an
opaque one recomputes from ``prev``, a non-transactional one applies everything again), the
same expiry, the same rollback. It returns each state's values,
as ``tridentflow query`` shows them::

    from tridentflow.testing import ABORT, CollectSink, run_batches

    def test_counts_stay_exact_when_a_txid_is_replayed():
        states = run_batches(my_pipeline(), [["a b", "b"], ["b c"]], replay=[1, 2])
        assert states["counts"] == {"a": 1, "b": 3, "c": 1}

What a run can go through, as in production:

* ``replay=[T, ...]``: txid T's commit runs again after one that wrote every key and died
  before marking T committed (a retried or cleared commit task). ``replay={T: records}``: the
  replay reads other records (an opaque source's replay may differ; a transactional source's
  never does, so that is refused for one).
* ``crash_mid_commit=[T, ...]``: T's first commit attempt dies where production's
  ``mid-commit`` fault point fires, with half of the batch's keys written;
  the retry commits the whole batch (keys only the first attempt wrote are rolled back).
* ``ABORT`` inside a batch (Bytewax's sentinel): T's first emit attempt dies there, after the
  records before it went through your functions; the retry emits the whole batch.
* ``at=[datetime, ...]``: each txid's batch time, as the coordinator would freeze it (a
  state's ``expire_after`` is judged by these, never by the clock of the test); without it
  every txid has the same time, so nothing expires by time.

Keys: a one-field group key is its value (``"you"``), a key of several fields a tuple, a state
with no group fields (a global aggregate) has the one key ``()``. Removed keys are absent.

Files: a ``FileSource`` pipeline's batch may list files (``pathlib.Path``; Parquet, CSV or
JSON lines, by the source's format): their records are the rows the FileSource reads from
them, and a file that cannot be parsed is one quarantined record naming it, as in production.

Sinks: a ``CollectSink`` in a ``new_values_stream().sink(...)`` collects what the export would
write after each commit (``sink.batches``: txid -> rows). Other sinks are not called (they
need their store). A static state in Redis (``RedisHashLookup``) cannot run here: use a
``FileLookup`` in tests. A record one of your functions fails on is raised, naming the record
(``on_bad="quarantine"`` sets it aside as production does, in ``states.quarantined``).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from tridentflow.engines.base import ComputeResult, ExecContext
from tridentflow.engines.local import LocalEngine
from tridentflow.errors import PipelineError, TestingError, TridentflowError
from tridentflow.nodes import QueryNode, lineage, parents_of
from tridentflow.pipeline import Pipeline
from tridentflow.plan import compile_chain, compile_pipeline
from tridentflow.sinks.base import ExportContext, Row, Sink
from tridentflow.sources.base import ReadsFiles
from tridentflow.sources.filelog import FileLog
from tridentflow.steps.committer import apply_in_chunks
from tridentflow.steps.emitter import attempt_header
from tridentflow.steps.export import stream_rows
from tridentflow.steps.staging import FileStagingArea, StagedBatch
from tridentflow_state.backing import MemoryBackingMap
from tridentflow_state.codec import decode_key
from tridentflow_state.commit import CommitAttempt, MemoryCommitStore, PhaseHooks
from tridentflow_state.maps import StoredValue, make_map_state

__all__ = ["ABORT", "CollectSink", "States", "TestingError", "run_batches"]


class _Abort:
    def __repr__(self) -> str:
        return "ABORT"


ABORT: Any = _Abort()
"""Put in a batch: that txid's first emit attempt dies here; its retry emits the whole batch."""


class States(dict[str, dict[Any, Any]]):
    """State name -> {key: value}, as ``tridentflow query`` presents values."""

    __test__ = False

    def __init__(self, values: dict[str, dict[Any, Any]], committed: int, quarantined: list):
        super().__init__(values)
        self.committed = committed
        """The last txid committed."""
        self.quarantined: list[dict[str, Any]] = quarantined
        """Records set aside (``on_bad="quarantine"``): txid, partition, offset, error, record."""


@dataclass
class CollectSink(Sink):
    """A sink that keeps what each export wrote: ``batches`` (txid -> the new-values stream's
    rows, one per changed key, a removed key's values None) and ``fields``. ``latest()``
    is every key's last row. Keep the instance you pass to ``sink()``: it is the one that
    collects."""

    name: str = "collect"
    batches: dict[int, list[Row]] = field(default_factory=dict)
    fields: tuple[str, ...] = ()
    key_fields: tuple[str, ...] = ()

    def bind(self, fields: tuple[str, ...], key_fields: tuple[str, ...]) -> CollectSink:
        self.fields, self.key_fields = tuple(fields), tuple(key_fields)
        return self

    def position(self, ctx: ExportContext) -> int:
        return max(self.batches, default=0)

    def apply(
        self, ctx: ExportContext, txid: int, rows: Sequence[Row], replace_all: bool = False
    ) -> bool:
        if txid in self.batches:
            return False
        self.batches[txid] = list(rows)
        return True

    def rows(self) -> list[Row]:
        """Every row exported, in txid order."""
        return [row for txid in sorted(self.batches) for row in self.batches[txid]]

    def latest(self) -> dict[Any, Row]:
        """Each key's last exported row (key: as ``run_batches`` presents keys)."""
        n = len(self.key_fields)
        return {_present_key(tuple(row[:n])): row for row in self.rows()}


Batch = Sequence[Any] | Mapping[int, Sequence[Any]]
"""A txid's records: a list (all in partition 0), or {partition: records}."""


def run_batches(
    pipeline: Pipeline,
    batches: Iterable[Batch],
    replay: Iterable[int] | Mapping[int, Batch] = (),
    crash_mid_commit: Iterable[int] = (),
    on_bad: str = "raise",
    at: Sequence[datetime] | None = None,
    spark: Any = None,
) -> States:
    """Run ``batches`` as txids 1, 2, ... of ``pipeline`` (coordinate, emit on the local
    engine - or, with ``spark`` (a SparkSession, classic or Connect), on the Spark engine -
    commit to in-memory states), with the replays and crashes asked for; each state's values
    after the last commit. Deterministic; nothing outside the process (but Spark's)."""
    if on_bad not in ("raise", "quarantine"):
        raise TestingError(f"on_bad is 'raise' or 'quarantine', got {on_bad!r}")
    _refuse_redis_lookups(pipeline)
    batches = list(batches)
    run = _Run(pipeline, on_bad, _batch_times(at, len(batches)), spark)
    replays = dict(replay) if isinstance(replay, Mapping) else {t: _SAME for t in replay}
    crashes = set(crash_mid_commit)
    unknown = sorted(t for t in (*replays, *crashes) if not 1 <= t <= len(batches))
    if unknown:
        raise TestingError(
            f"replay/crash_mid_commit name txid(s) {unknown}, but the batches are txids "
            f"1..{len(batches)}"
        )
    if any(r is not _SAME for r in replays.values()) and pipeline.source.mode.value == (
        "transactional"
    ):
        raise TestingError(
            "a transactional source replays exactly the records it read: replay={T: records} "
            "needs an opaque source (replay=[T] replays the same records)"
        )
    with tempfile.TemporaryDirectory(prefix="tridentflow-testing-") as root:
        run.open(root)
        for txid, batch in enumerate(batches, start=1):
            run.txid(txid, batch, replays.get(txid), txid in crashes)
    return run.result()


_SAME: Any = object()
"""A replay of the same records (``replay=[T]``)."""


def _batch_times(at: Sequence[datetime] | None, count: int) -> list[int]:
    """Each txid's batch time in ms (``at``; none given: all 0); TestingError (one line) if
    ``at`` is not one non-decreasing datetime per batch."""
    if at is None:
        return [0] * count
    times = list(at)
    if len(times) != count or not all(isinstance(t, datetime) for t in times):
        raise TestingError(f"at= gives one datetime per batch ({count}), got {times!r}")
    ms = [int(t.timestamp() * 1000) for t in times]
    back = next((i for i in range(1, count) if ms[i] < ms[i - 1]), None)
    if back is not None:
        raise TestingError(
            f"at=: txid {back + 1}'s batch time {times[back]} is before txid {back}'s "
            f"{times[back - 1]}; batch times never go back (the coordinator raises them)"
        )
    return ms


class _Run:
    """One ``run_batches``: the log the batches are appended to, the in-memory states."""

    def __init__(
        self, pipeline: Pipeline, on_bad: str, batch_times: list[int], spark: Any = None
    ) -> None:
        self.pipeline = pipeline
        self.batch_times = batch_times
        self.store = MemoryCommitStore()
        """The ledger's order and tokens and the batch times, in memory."""
        self.plan = compile_pipeline(pipeline)
        self.on_bad = on_bad
        self.engine = LocalEngine() if spark is None else _spark_engine(pipeline, spark)
        self.partitions = pipeline.source.partitions
        self.backings = {name: MemoryBackingMap() for name in pipeline.states}
        self.expired: dict[str, list[str]] = {}
        """State -> the keys the last commit attempt expired (expire_after_txids/_after)."""
        self.committed = 0
        self.quarantined: list[dict[str, Any]] = []
        self.root = ""
        self.log: FileLog | None = None
        self.staging: FileStagingArea | None = None
        self.emits: dict[int, int] = {}
        """Txid -> its emit attempts so far (each staged under its number)."""
        self.read = 0  # records appended before this txid, every partition counted

    def open(self, root: str) -> None:
        self.root = root
        self.log = FileLog(root)
        self.log.ensure(self.partitions)
        self.staging = FileStagingArea(Path(root) / "staging")

    # -- a txid --------------------------------------------------------------------------------
    def txid(self, txid: int, batch: Batch, replay: Any, crash: bool) -> None:
        parts = self._parts(batch, txid)
        base = self.read
        ranges = self._append({p: [r for r in rs if r is not ABORT] for p, rs in parts.items()})
        aborted_at = {p: records.index(ABORT) for p, records in parts.items() if ABORT in records}
        if aborted_at:  # the first attempt: your functions ran up to ABORT, then it died
            cut = {p: (start, start + aborted_at.get(p, end - start))
                   for p, (start, end) in ranges.items()}  # fmt: skip
            self._compute(txid, cut, base)
        first = self._emit(txid, ranges, base)
        attempts = [first]
        if crash:  # the first attempt died with half of the keys written
            self._commit(txid, first, dies_at="half_written")
        if replay is not None and replay is not _SAME:
            ranges = self._append(self._parts(replay, txid))
            attempts.append(self._emit(txid, ranges, base))
        elif replay is not None:
            attempts.append(first)
        self._quarantine(txid, list(attempts[-1].bad_records()))
        for staged in attempts[:-1]:  # wrote every key and died before the mark
            self._commit(txid, staged, dies_at="written")
        attempt = self._commit(txid, attempts[-1])  # dies nowhere: it marks
        self.expired = attempt.expired if attempt is not None else {}
        self.read = base + sum(end - start for start, end in ranges.values())
        self.committed = txid
        self._export(txid, attempts[-1])

    def _parts(self, batch: Batch, txid: int) -> dict[int, list[Any]]:
        if isinstance(batch, (str, bytes)) or not isinstance(batch, (Sequence, Mapping)):
            raise TestingError(
                f"txid {txid}: a batch is a list of records or {{partition: records}}, got "
                f"{type(batch).__name__}"
            )
        parts = dict(batch) if isinstance(batch, Mapping) else {0: list(batch)}
        wrong = sorted(p for p in parts if not (isinstance(p, int) and 0 <= p < self.partitions))
        if wrong:
            raise TestingError(
                f"txid {txid}: partition(s) {wrong} out of the source's 0..{self.partitions - 1}"
            )
        return {p: list(records) for p, records in parts.items()}

    def _append(self, parts: dict[int, list[Any]]) -> dict[int, tuple[int, int]]:
        """Each partition's records appended to the log: the offset range they got (a batch
        of files: the lines their source reads from them, as they are)."""
        assert self.log is not None
        log = self.log
        try:
            return {
                p: log.append_lines(p, lines)
                if (lines := self._file_lines(parts.get(p, []))) is not None
                else log.append(p, parts.get(p, []))
                for p in range(self.partitions)
            }
        except TridentflowError as exc:
            raise TestingError(f"a batch holds a record the log refuses: {exc}") from None

    def _file_lines(self, records: list[Any]) -> list[str] | None:
        """The lines a batch of files (``pathlib.Path`` each) gives its FileSource - Parquet,
        CSV or JSON lines, read as the FileSource reads them; None for a batch of records."""
        paths = [r for r in records if isinstance(r, Path)]
        if not paths:
            return None
        source = self.pipeline.source
        if len(paths) != len(records) or not isinstance(source, ReadsFiles):
            raise TestingError(
                "a batch of files (pathlib.Path) needs a FileSource pipeline and only files; "
                f"got {len(paths)} of {len(records)} for a {type(source).__name__}"
            )
        lines = []
        for path in paths:
            for raw in source.records_of_file(str(path)):
                try:
                    lines.append(raw.decode("utf-8"))
                except UnicodeDecodeError:
                    raise TestingError(
                        f"{path}: a line is not UTF-8 (production quarantines it; the "
                        "harness's log holds text)"
                    ) from None
        return lines

    def _compute(self, txid: int, ranges: dict[int, tuple[int, int]], base: int) -> ComputeResult:
        """What the engine makes of the records in ``ranges``: counts, partials, bad records."""
        ctx = ExecContext(txid, "", position_base=base, read_state=self._read_state)
        return self.engine.compute(self.plan, self.root, ranges, ctx)

    def _emit(self, txid: int, ranges: dict[int, tuple[int, int]], base: int) -> StagedBatch:
        """One emit attempt of ``txid``: computed, staged through production's file staging
        area (every partial as the JSON line the commit reads back), loaded and checked
        complete as the commit loads it."""
        result = self._compute(txid, ranges, base)
        attempt = self.emits[txid] = self.emits.get(txid, 0) + 1
        header = attempt_header(
            self.pipeline.name, txid, attempt, self.pipeline.source.mode.value,
            self.engine.name, ranges,
        )  # fmt: skip
        header["stages"] = [r.to_json() for r in result.stages]
        assert self.staging is not None
        self.staging.write(header, result.counts, result.partials, result.bad)
        return self.staging.load(txid, attempt)

    def _read_state(self, pipeline: str, state: str, keys: list[str]) -> list[Any]:
        if pipeline != self.pipeline.name or state not in self.backings:
            raise TestingError(
                f"a stateQuery of {pipeline}/{state}: run_batches holds only the states of "
                f"pipeline {self.pipeline.name}"
            )
        committed = self.committed
        stored = make_map_state(
            self.pipeline.states[state].state.kind, self.backings[state], state
        ).read(keys)
        return [None if s is None else s.committed_view(committed) for s in stored]

    def _quarantine(self, txid: int, bad: list[dict[str, Any]]) -> None:
        if not bad:
            return
        if self.on_bad == "raise":
            first = bad[0]
            raise TestingError(
                f"txid {txid}: record {first['record']} failed: {first['error']} (production "
                "quarantines it and goes on: on_bad='quarantine' does the same here)"
            )
        self.quarantined += [{"txid": txid, **b} for b in bad]

    def _commit(self, txid: int, staged: StagedBatch, dies_at: str = "") -> CommitAttempt | None:
        """One commit attempt of ``txid`` through the production protocol
        (``tridentflow_state.commit.CommitAttempt`` over the in-memory store and states, each
        state's partials applied as the committer's ``PythonApply`` does), dying at the phase
        ``dies_at`` names (``half_written``, ``written``) as a process would. The attempt, if
        it marked the txid."""
        hooks = _DiesAt(dies_at)
        attempt = CommitAttempt.begin_in(self.store, txid, hooks=hooks)
        if attempt is None:
            raise TestingError(f"txid {txid} is committed already")  # the harness's own bug
        states = {
            name: (p.state.kind, self.backings[name]) for name, p in self.pipeline.states.items()
        }
        at_ms = self.batch_times[txid - 1] if self.pipeline.expires_in_time else None
        try:
            writers = attempt.claim(states, None, self.pipeline.expiring, at_ms)
            attempt.expect(sum(staged.key_count(name) for name in writers))
            for name, state in writers.items():
                persisted = self.pipeline.states[name].aggregator
                apply_in_chunks(state, persisted, staged.items(name), attempt)
            attempt.finish_writes(staged.keys)
            attempt.mark({}, {})
        except _DiedError:
            return None
        attempt.settle()
        return attempt

    # -- exports and results -------------------------------------------------------------------
    def _export(self, txid: int, staged: StagedBatch) -> None:
        for feed in self.pipeline.feeds:
            if not isinstance(feed.sink, CollectSink):
                continue
            persist = self.pipeline.states[feed.state]
            keys = sorted(set(staged.keys(feed.state)) | set(self.expired.get(feed.state, ())))
            stored = make_map_state(persist.state.kind, self.backings[feed.state]).read(keys)
            items = [
                (k, decode_key(k), None if s is None or s.curr is None else
                 persist.aggregator.present(s.curr))
                for k, s in zip(keys, stored, strict=True)
            ]  # fmt: skip
            feed.sink.apply(_EXPORT_CONTEXT, txid, stream_rows(items, compile_chain(feed.node)))

    def result(self) -> States:
        values: dict[str, dict[Any, Any]] = {}
        for name, persist in self.pipeline.states.items():
            present = persist.aggregator.present
            out: dict[Any, Any] = {}
            for key, raw in sorted(self.backings[name].scan_items()):
                stored = StoredValue.from_json(raw, key, name)
                if stored.curr is not None:
                    out[_present_key(decode_key(key))] = present(stored.curr)
            values[name] = out
        return States(values, self.committed, self.quarantined)


class _DiedError(Exception):
    """An attempt's process died (the harness's crash, at a phase of the protocol)."""


class _DiesAt(PhaseHooks):
    """Dies at the named phase (``half_written``, ``written``; '': never)."""

    def __init__(self, phase: str) -> None:
        self.phase = phase

    def half_written(self, attempt: CommitAttempt) -> None:
        if self.phase == "half_written":
            raise _DiedError(self.phase)

    def written(self, attempt: CommitAttempt) -> None:
        if self.phase == "written":
            raise _DiedError(self.phase)


_EXPORT_CONTEXT = ExportContext("testing", "", client=None, redis_url="")  # type: ignore[arg-type]


def _present_key(key: tuple[Any, ...]) -> Any:
    return key[0] if len(key) == 1 else key


def _before_abort(records: list[Any]) -> list[Any]:
    return records[: records.index(ABORT)] if ABORT in records else records


def _spark_engine(pipeline: Pipeline, spark: Any) -> Any:
    """The Spark engine on ``spark``; TestingError (one line) for a pipeline that queries its
    states (they are in this process's memory, which Spark's executors cannot read)."""
    from tridentflow.engines.spark import SparkEngine

    if any(isinstance(n, QueryNode) for p in pipeline.persists for n in lineage(p.node)):
        raise TestingError(
            "spark=: a pipeline with a state_query reads its states on Spark's executors, and "
            "run_batches keeps them in this process; test it without spark= (the local engine)"
        )
    return SparkEngine(spark)


def _refuse_redis_lookups(pipeline: Pipeline) -> None:
    """TestingError (one line) for a static state kept in Redis: nothing here has Redis."""
    from tridentflow.static_state import RedisHashLookup

    seen: set[int] = set()
    todo = [p.node for p in pipeline.persists] + [f.node for f in pipeline.feeds]
    while todo:
        node = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, QueryNode) and isinstance(node.static, RedisHashLookup):
            raise PipelineError(
                f"static state in Redis hash {node.static.key!r}: run_batches has no Redis; "
                "build the pipeline with a FileLookup (a JSON file) for tests"
            )
        todo.extend(parents_of(node))
