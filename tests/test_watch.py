"""When a pipeline needs a run (tridentflow.steps.watch: what the asset watcher asks): records
past the committed offsets or an unheld txid are work; a live run's txid is not asked twice; an
unanswered fire is repeated with a back-off; events merged or doubled never lose or double a
record (the family "an orchestrator merges, doubles or delays events")."""

from __future__ import annotations

import random

import pytest

from tests.helpers import produce, runtime, sentences, word_counts
from tests.test_outage import Outage, counts
from tridentflow.engines.local import LocalEngine
from tridentflow.ops.audit import audit
from tridentflow.steps.driver import run_batches
from tridentflow.steps.runs import commit_run, coordinate_run, emit_run, release_run
from tridentflow.steps.watch import Waiting, Watch, work_waiting

ENGINE = LocalEngine()


def test_records_past_the_committed_offsets_are_work_until_committed(redis_url, redis_client, home):
    rt = runtime("wordcount", redis_url, home)
    assert work_waiting(rt) is None  # no log yet: nothing waits (and nothing is created)
    assert not rt.log.exists()
    produce(rt, sentences(10))
    waiting = work_waiting(rt)
    assert waiting is not None and waiting.records == 10 and waiting.adopt is None
    assert sum(waiting.partitions.values()) == 10 and waiting.to_json()["records"] == 10
    run_batches(rt, ENGINE, batch_size=2, max_batches=1)
    assert work_waiting(rt).records == 10 - sum(min(2, n) for n in waiting.partitions.values())
    run_batches(rt, ENGINE)
    assert work_waiting(rt) is None


def test_a_txid_held_by_a_live_run_is_not_work_and_an_unheld_one_is(redis_url, redis_client, home):
    rt = runtime("wordcount-opaque", redis_url, home)
    produce(rt, sentences(8))
    bound = coordinate_run(rt, "run-a", batch_size=1)
    assert work_waiting(rt) is None  # run-a holds its txid: its commit comes first
    assert release_run(rt, "run-a")  # its run failed: the txid waits for a run to adopt it
    waiting = work_waiting(rt)
    assert waiting is not None and waiting.adopt == bound["txid"]
    assert "no run holds it" in waiting.describe()
    adopted = coordinate_run(rt, "run-b")
    assert adopted["txid"] == bound["txid"] and work_waiting(rt) is None
    emit_run(rt, "run-b", ENGINE)
    committed = commit_run(rt, "run-b")["records"]
    assert committed == 4 and work_waiting(rt).records == 8 - committed
    run_batches(rt, ENGINE)
    assert work_waiting(rt) is None


def test_a_txid_held_by_a_finished_run_is_work(redis_url, redis_client, home):
    """The owner failed while Redis was away (its callback could not release the txid), so
    its lease is live; the orchestrator says the run finished: a new run adopts it."""
    rt = runtime("wordcount-opaque", redis_url, home)
    produce(rt, sentences(4))
    bound = coordinate_run(rt, "run-a")
    states = {"run-a": "running"}
    assert work_waiting(rt, states.get) is None
    states["run-a"] = "failed"
    assert work_waiting(rt, states.get).adopt == bound["txid"]
    assert work_waiting(rt, {}.get) is None  # it cannot tell: the lease decides
    watch = Watch()
    assert watch.poll(rt, 0.0, states.get).adopt == bound["txid"]
    adopted = coordinate_run(rt, "run-b", run_state=states.get)  # released, adopted
    assert adopted["txid"] == bound["txid"] and adopted["released"]


def test_an_unreadable_partition_is_not_work_until_it_can_be_read(
    redis_url, redis_client, home, tmp_path
):
    rt = runtime("wordcount", redis_url, home)
    produce(rt, sentences(12))
    run_batches(rt, ENGINE)
    outage = Outage(rt.log.root, 1, tmp_path)
    outage.unmount()
    rt.log.append_spread(sentences(12, seed=3), skip_unavailable=True)
    waiting = work_waiting(rt)
    assert waiting is not None and 1 not in waiting.partitions
    run_batches(rt, ENGINE)
    assert work_waiting(rt) is None  # only the dark partition's records are left: no work
    outage.mount()
    assert work_waiting(rt) is None  # nothing was appended to it while it was dark
    produce(rt, sentences(4, seed=4))
    assert work_waiting(rt).partitions.get(1), "its new records are work again"


def test_a_fire_is_not_repeated_until_unanswered_for_its_delay_then_backs_off(
    redis_url, redis_client, home
):
    rt = runtime("wordcount", redis_url, home)
    produce(rt, sentences(6))
    watch = Watch(refire_after=10)
    assert isinstance(watch.poll(rt, 0.0), Waiting)
    assert watch.poll(rt, 1.0) is None and watch.poll(rt, 9.9) is None  # unanswered, young
    assert watch.poll(rt, 10.0) is not None  # unanswered 10 s: again, now after 20 s
    assert watch.poll(rt, 29.9) is None
    assert watch.poll(rt, 30.0) is not None  # then 40 s
    assert watch.poll(rt, 69.0) is None
    coordinate_run(rt, "run-a", batch_size=1)  # answered: a run bound a txid
    ahead = watch.poll(rt, 70.0)  # it holds txid 1, which reads 1 record a partition: the
    assert ahead is not None and ahead.beyond == 1 and ahead.records == 2  # rest is beyond it
    assert "beyond what txid 1 (running) can read" in ahead.describe()
    assert watch.poll(rt, 70.1) is None  # once: the next run queues behind run-a
    emit_run(rt, "run-a", ENGINE)
    commit_run(rt, "run-a")
    assert watch.poll(rt, 70.5) is None  # the queued run has not bound yet: no second fire
    assert watch.poll(rt, 80.0) is not None  # ...unless it never comes: again after 10 s
    coordinate_run(rt, "run-b", batch_size=1)  # the queued run binds txid 2
    assert watch.poll(rt, 80.1) is None  # answered; txid 2 can read all that waits
    emit_run(rt, "run-b", ENGINE)
    commit_run(rt, "run-b")
    assert watch.poll(rt, 81.0) is None
    produce(rt, sentences(2, seed=9))
    assert watch.poll(rt, 81.5) is not None  # new records after a quiet spell: at once
    with pytest.raises(ValueError, match="refire_after must be > 0"):
        Watch(refire_after=0)


def test_a_run_that_reads_none_of_the_waiting_records_does_not_answer_the_fire(
    redis_url, redis_client, home
):
    """No hot loop: partition 0 says it has records no run can read (dark to the emit for
    txids 1-50); each run that commits without reading them answers nothing, so the watcher
    fires again only after its back-off, not after every commit."""
    rt = runtime("wordcount-opaque", redis_url, home, faults="dark:0@1-50")
    rt.source_heads()
    rt.log.append_spread(sentences(4))  # one record per partition
    watch = Watch(refire_after=10)
    fired = []
    for second in range(0, 75):
        if watch.poll(rt, float(second)) is not None:
            fired.append(second)
            run_batches(rt, ENGINE, max_batches=1)  # reads partitions 1-3, then nothing
    assert rt.ledger.committed_offsets().get(0, 0) == 0 and work_waiting(rt).partitions == {0: 1}
    assert fired == [0, 1, 11, 31, 71], fired  # 1: progress at 0; then +10, +20, +40 s


class Orchestrator:
    """Airflow's side of event-driven runs, as it behaves: a fire while a run is queued is
    merged into it (one queued run per DAG), runs start one at a time (max_active_runs=1)
    after a delay, a run may fail and release its txid, events may be delivered twice."""

    def __init__(self, rt, rng: random.Random, batch_size: int) -> None:
        self.rt, self.rng, self.batch_size = rt, rng, batch_size
        self.queued = False
        self.active: list[str] = []  # the run's id while it runs, step by step
        self.step = 0
        self.runs = 0

    def fire(self) -> None:
        self.queued = True  # merged with any queued event (the asset's queue holds one)

    def tick(self) -> None:
        if not self.active:
            if self.queued and self.rng.random() < 0.6:  # the scheduler's delay
                self.queued = False
                self.runs += 1
                self.active = [f"run-{self.runs}"]
                self.step = 0
            return
        run_id = self.active[0]
        if self.rng.random() < 0.1:  # the run fails at this step; its callback releases
            release_run(self.rt, run_id)
            self.active = []
            return
        if self.step == 0:
            coordinate_run(self.rt, run_id, self.batch_size)
        elif self.step == 1:
            emit_run(self.rt, run_id, ENGINE)
        else:
            commit_run(self.rt, run_id)
            self.active = []
        self.step += 1


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_merged_doubled_and_failed_runs_never_lose_or_double_a_record(
    redis_url, redis_client, home, seed
):
    rng = random.Random(seed)
    rt = runtime("wordcount-opaque", redis_url, home)
    watch = Watch(refire_after=5)
    airflow = Orchestrator(rt, rng, batch_size=rng.choice([1, 3, 10]))
    produced: list[str] = []
    clock = 0.0
    for tick in range(5000):
        if tick < 250 and rng.random() < 0.15:  # bursts and trickles, then quiet
            lines = sentences(rng.choice([1, 1, 2, 7, 20]), seed=seed * 1000 + tick)
            produce(rt, lines)
            produced += lines
        clock += rng.choice([0.2, 1.0, 3.0])
        if watch.poll(rt, clock) is not None:
            airflow.fire()
            if rng.random() < 0.2:
                airflow.fire()  # delivered twice
        airflow.tick()
        if tick >= 250 and not (airflow.queued or airflow.active or work_waiting(rt)):
            break  # quiet: nothing waits, nothing queued or running
    else:
        raise AssertionError("records still waiting 4,750 ticks after the source went quiet")
    assert produced and not rt.ledger.pending_txids()
    assert rt.ledger.committed_offsets() == rt.log.heads()
    expected = word_counts(produced)
    assert counts(rt, sorted(expected)) == expected
    assert audit(rt).ok


def test_a_run_that_read_while_as_many_records_arrived_answered_its_fire(
    redis_url, redis_client, home
):
    """Judged by offsets, not counts: the run read every waiting record while the same
    number arrived in each partition; after its commit the new ones fire at once (counted,
    they looked like the same records left unread, and waited for the back-off)."""
    rt = runtime("wordcount", redis_url, home)
    produce(rt, sentences(8))
    watch = Watch(refire_after=10)
    first = watch.poll(rt, 0.0)
    assert first is not None
    coordinate_run(rt, "run-a")
    produce(rt, sentences(8, seed=2))  # the same count in every partition, during the run
    emit_run(rt, "run-a", ENGINE)
    commit_run(rt, "run-a")
    again = watch.poll(rt, 1.0)
    assert again is not None and again.partitions == first.partitions
    assert again.since != first.since


def test_a_reset_or_a_rewind_answers_a_fire_that_waited_on_the_old_ledger(
    redis_url, redis_client, home
):
    """A look-ahead fire (records beyond a held txid 3) waits for a txid after 3 to bind;
    a reset starts the ledger from nothing: the next records fire at once, not when the new
    ledger passes txid 3 (at the back-off, until the triggerer restarts)."""
    from tridentflow.ops.reset import reset_pipeline

    rt = runtime("wordcount-opaque", redis_url, home)
    produce(rt, sentences(20))
    for n in (1, 2):
        coordinate_run(rt, f"run-{n}", batch_size=1)
        emit_run(rt, f"run-{n}", ENGINE)
        commit_run(rt, f"run-{n}")
    watch = Watch(refire_after=10)
    coordinate_run(rt, "run-3", batch_size=1)
    assert watch.poll(rt, 0.0).beyond == 3  # the look-ahead fire for the run queued behind
    reset_pipeline(rt, force=True, source=True)
    produce(rt, sentences(4, seed=5))
    assert watch.poll(rt, 0.5) is not None  # answered by the reset: at once


def test_a_fire_is_not_repeated_while_its_run_is_queued_or_slow_to_bind(
    redis_url, redis_client, home
):
    """The coordinator of the run a fire started is slow to bind (7.8 s seen): the re-fire
    at 10 s would queue a second run that commits an empty txid. While the orchestrator has
    a run queued or running that holds no txid, the fire waits; once the run is gone
    without binding (it failed), the fire is repeated."""
    rt = runtime("wordcount", redis_url, home)
    produce(rt, sentences(6))
    watch = Watch(refire_after=10)
    active = {"runs": 1}
    assert watch.poll(rt, 0.0, active_runs=lambda: active["runs"]) is not None
    assert watch.poll(rt, 10.0, active_runs=lambda: active["runs"]) is None  # queued: waits
    assert watch.poll(rt, 25.0, active_runs=lambda: None) is not None  # cannot tell: back-off
    assert watch.poll(rt, 60.0, active_runs=lambda: active["runs"]) is None
    active["runs"] = 0  # the run failed before it bound
    assert watch.poll(rt, 61.0, active_runs=lambda: active["runs"]) is not None
    coordinate_run(rt, "run-a")  # a run holding its txid: beyond it, one more run may queue
    emit_run(rt, "run-a", ENGINE)
    commit_run(rt, "run-a")
    assert work_waiting(rt) is None


def test_a_file_or_a_table_version_landing_is_work_until_committed(redis_url, tmp_path):
    """The on-data watcher on the sources where data already lands: a new file in the landing
    directory, a new version of a Delta table, is work for a run (the asset watcher fires);
    once committed, nothing waits - and a file already taken is never work again."""
    from deltalake import write_deltalake

    from tests import test_delta_source as delta
    from tests import test_file_source as files

    landing = tmp_path / "landing"
    landing.mkdir()
    rt = files.runtime_of(files.pipeline(landing), redis_url, tmp_path / "f")
    assert work_waiting(rt) is None
    files.write(landing, "a.parquet", files.batch(1))
    assert work_waiting(rt).records == 1  # one file
    run_batches(rt, ENGINE)
    assert work_waiting(rt) is None
    files.write(landing, "b.parquet", files.batch(2))
    assert work_waiting(rt).describe() == "1 files past the committed offsets"
    run_batches(rt, ENGINE)
    assert work_waiting(rt) is None

    uri = tmp_path / "table"
    write_deltalake(uri, delta.rows(0))
    table_rt = delta.runtime_of(delta.pipeline(uri), redis_url, tmp_path / "d")
    assert work_waiting(table_rt).records == 1  # version 0
    run_batches(table_rt, ENGINE)
    assert work_waiting(table_rt) is None
    write_deltalake(uri, delta.rows(1), mode="append")
    write_deltalake(uri, delta.rows(2), mode="append")
    assert work_waiting(table_rt).records == 2
    assert work_waiting(table_rt).describe() == "2 versions past the committed offsets"
    run_batches(table_rt, ENGINE)
    assert work_waiting(table_rt) is None
