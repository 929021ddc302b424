"""Seed 003 for real: a partition that actually goes away (its directory moved aside, as when
a mount drops; a torn HEAD; a segment that cannot be read), not an injected dark one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.helpers import produce, runtime, sentences, word_counts
from tridentflow.engines.local import LocalEngine
from tridentflow.errors import PartitionUnavailableError
from tridentflow.ops.audit import audit
from tridentflow.ops.status import status
from tridentflow.steps.committer import commit
from tridentflow.steps.coordinator import coordinate
from tridentflow.steps.driver import run_batches
from tridentflow.steps.emitter import emit
from tridentflow.steps.query import query

ENGINE = LocalEngine()


def counts(rt, words):
    values = query(rt, rt.pipeline.states["counts"], [(w,) for w in words])[1]
    return dict(zip(words, values, strict=True))


class Outage:
    """Breaks one partition of a log the way storage breaks, and repairs it."""

    def __init__(self, log_root: Path, partition: int, aside: Path) -> None:
        self.pdir = log_root / f"p-{partition:04d}"
        self.aside = aside / self.pdir.name

    def unmount(self) -> None:
        shutil.move(self.pdir, self.aside)

    def unmount_leaving_mount_point(self) -> None:
        self.unmount()
        self.pdir.mkdir()

    def mount(self) -> None:
        if self.pdir.exists():
            self.pdir.rmdir()
        shutil.move(self.aside, self.pdir)

    def tear_head(self) -> None:
        head = self.pdir / "HEAD"
        self.saved = head.read_bytes()
        head.write_bytes(self.saved[: len(self.saved) // 2])

    def mend_head(self) -> None:
        (self.pdir / "HEAD").write_bytes(self.saved)

    def break_segment(self) -> None:
        """Replace the first segment by a directory: every read is an I/O error (EISDIR),
        whoever the reader is (root ignores permission bits, so chmod would prove nothing)."""
        segment = next(self.pdir.glob("seg-*.jsonl"))
        self.saved_segment = (segment, segment.read_bytes())
        segment.unlink()
        segment.mkdir()

    def mend_segment(self) -> None:
        segment, data = self.saved_segment
        segment.rmdir()
        segment.write_bytes(data)


def test_the_issue_scenario_through_the_cli(tf, home, tmp_path):
    """Issue 15 step by step: nothing stops, nothing is lost, nothing is shadowed."""
    assert tf("produce", "wordcount-opaque", "-", input="a b\nc d\ne f\ng h\n").returncode == 0
    run = tf("run", "wordcount-opaque", "--engine", "local")
    assert run.returncode == 0, run.stderr
    outage = Outage(home / "sources" / "wordcount-opaque", 1, tmp_path)
    outage.unmount()

    refused = tf("produce", "wordcount-opaque", "-", input="q r\ns t\nu v\nw x\n")
    assert refused.returncode == 1
    assert refused.stderr.count("\n") == 1
    assert "partition 1 is unavailable" in refused.stderr and "nothing appended" in refused.stderr
    assert not outage.pdir.exists()  # never recreated
    routed = tf(
        "produce", "wordcount-opaque", "-", "--skip-unavailable", input="q r\ns t\nu v\nw x\n"
    )
    assert routed.returncode == 0, routed.stderr
    assert "skipped unavailable partitions [1]" in routed.stdout
    assert not outage.pdir.exists()

    run = tf("run", "wordcount-opaque", "--engine", "local")
    assert run.returncode == 0, run.stderr
    assert "skipped partitions [1]" in run.stdout
    info = json.loads(tf("status", "wordcount-opaque", "--json").stdout)
    (p1,) = [p for p in info["partitions"] if p["partition"] == 1]
    assert p1["lag"] is None and "directory p-0001 is missing" in p1["unavailable"]
    assert info["unavailable_partitions"] == [1] and info["lag"] == 0
    assert "UNAVAILABLE" in tf("status", "wordcount-opaque").stdout
    cannot = tf("audit", "wordcount-opaque")
    assert cannot.returncode == 3 and cannot.stdout.startswith("cannot audit: partition 1")

    outage.mount()
    run = tf("run", "wordcount-opaque", "--engine", "local")
    assert run.returncode == 0, run.stderr
    assert tf("audit", "wordcount-opaque").stdout.strip() == "lost=0 doubled=0"
    words = ["a", "b", "c", "d", "e", "f", "g", "h", "q", "r", "s", "t", "u", "v", "w", "x"]
    out = tf("query", "wordcount-opaque", *words, "--json")
    values = {v["key"][0]: v["value"] for v in json.loads(out.stdout)["values"]}
    assert values == dict.fromkeys(words, 1)


@pytest.mark.parametrize("name", ["wordcount", "wordcount-opaque"])
@pytest.mark.parametrize("how", ["unmount", "unmount_leaving_mount_point", "tear_head"])
def test_a_partition_gone_between_txids_is_skipped_and_caught_up(
    redis_url, redis_client, home, tmp_path, name, how
):
    rt = runtime(name, redis_url, home)
    lines = sentences(24)
    produce(rt, lines[:12])
    run_batches(rt, ENGINE, max_batches=1, batch_size=1)
    outage = Outage(rt.log.root, 2, tmp_path)
    getattr(outage, how)()
    rt.log.append_spread(lines[12:], skip_unavailable=True)
    result = run_batches(rt, ENGINE, batch_size=2).results
    assert result and all(r.skipped_partitions == (2,) for r in result if r.records)
    assert status(rt)["unavailable_partitions"] == [2]
    assert all(p["lag"] is None or p["lag"] >= 0 for p in status(rt)["partitions"])
    assert not audit(rt).ok and audit(rt).unreadable
    outage.mend_head() if how == "tear_head" else outage.mount()
    run_batches(rt, ENGINE, batch_size=2)
    expected = word_counts(lines)
    assert counts(rt, list(expected)) == expected
    report = audit(rt)
    assert (report.lost, report.doubled, report.mismatched) == (0, 0, [])


@pytest.mark.parametrize("how", ["unmount", "break_segment"])
def test_a_partition_gone_during_a_transactional_txid_waits_with_one_line(
    redis_url, redis_client, home, tmp_path, how
):
    rt = runtime("wordcount", redis_url, home)
    lines = sentences(16)
    produce(rt, lines)
    coordinate(rt, 1, batch_size=2)  # the ranges are frozen with partition 1 in them
    outage = Outage(rt.log.root, 1, tmp_path)
    getattr(outage, how)()
    with pytest.raises(PartitionUnavailableError) as failure:
        emit(rt, 1, ENGINE)
    message = str(failure.value)
    assert message.startswith("partition 1 is unavailable") and "\n" not in message
    assert "replays exactly [0, 2) and waits for it" in message
    outage.mend_segment() if how == "break_segment" else outage.mount()
    emit(rt, 1, ENGINE)
    commit(rt, 1)
    run_batches(rt, ENGINE, batch_size=2)
    expected = word_counts(lines)
    assert counts(rt, list(expected)) == expected
    assert audit(rt).ok


@pytest.mark.parametrize("how", ["unmount", "break_segment", "tear_head"])
def test_a_partition_gone_during_an_opaque_txid_is_skipped_by_the_retry(
    redis_url, redis_client, home, tmp_path, how
):
    rt = runtime("wordcount-opaque", redis_url, home)
    lines = sentences(16)
    produce(rt, lines)
    coordinate(rt, 1, batch_size=3)
    emit(rt, 1, ENGINE)  # the first attempt read partition 3 ...
    outage = Outage(rt.log.root, 3, tmp_path)
    getattr(outage, how)()
    staged = emit(rt, 1, ENGINE)  # ... the retry cannot, and skips it
    assert staged.manifest["skipped"] == [3]
    result = commit(rt, 1)
    assert result.skipped_partitions == (3,)
    run_batches(rt, ENGINE, batch_size=3)
    {"unmount": outage.mount, "break_segment": outage.mend_segment, "tear_head": outage.mend_head}[
        how
    ]()
    run_batches(rt, ENGINE, batch_size=3)
    expected = word_counts(lines)
    assert counts(rt, list(expected)) == expected
    assert audit(rt).ok


def test_nothing_recreates_a_missing_partition(redis_url, redis_client, home, tmp_path):
    rt = runtime("wordcount-opaque", redis_url, home)
    produce(rt, sentences(8))
    outage = Outage(rt.log.root, 0, tmp_path)
    outage.unmount()
    rt.log.ensure(6)  # growing the log creates only the new partitions
    rt.source_scan()
    with pytest.raises(PartitionUnavailableError):
        rt.log.append_lines(0, ['"x"'])
    with pytest.raises(PartitionUnavailableError):
        rt.log.append_spread(["y"])
    assert not outage.pdir.exists()
    assert sorted(rt.log.scan().unavailable) == [0]
    assert sorted(rt.log.scan().heads) == [1, 2, 3, 4, 5]
