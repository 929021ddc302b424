from __future__ import annotations

import json

import pytest

from tridentflow.errors import SourceError
from tridentflow.sources.filelog import INDEX_EVERY, FileLog


@pytest.fixture
def log(tmp_path):
    log = FileLog(tmp_path / "log", segment_records=1000)
    log.ensure(3)
    return log


def test_append_and_read_ranges_across_segments(log):
    records = [{"i": i} for i in range(2500)]
    assert log.append(1, records) == (0, 2500)
    assert log.heads() == {0: 0, 1: 2500, 2: 0}
    for start, end in [(0, 10), (999, 1001), (1500, 2500), (7, 7), (INDEX_EVERY + 3, 2049)]:
        got = list(log.read(1, start, end))
        assert got == [(o, {"i": o}) for o in range(start, end)]
    assert log.append(1, [{"i": 2500}]) == (2500, 2501)


def test_reading_past_the_head_is_refused(log):
    log.append(0, ["a"])
    with pytest.raises(SourceError, match="past the head"):
        list(log.read(0, 0, 2))


def test_a_torn_append_is_invisible_and_cut_on_the_next_append(log):
    log.append(2, ["a", "b"])
    seg = log.root / "p-0002" / "seg-000000000000.jsonl"
    with open(seg, "ab") as fh:  # a crash after writing data, before HEAD moved
        fh.write(b'"torn"\n"partial')
    assert [r for _, r in log.read(2, 0, 2)] == ["a", "b"]
    log.append(2, ["c"])
    assert [r for _, r in log.read(2, 0, 3)] == ["a", "b", "c"]


def test_a_stale_index_from_a_torn_append_is_dropped(tmp_path):
    log = FileLog(tmp_path / "log")
    log.ensure(1)
    log.append(0, ["x"] * (INDEX_EVERY + 1))
    head = json.loads((log.root / "p-0000" / "HEAD").read_text())
    # a torn append of long records wrote index entries, then died before HEAD moved
    log.append(0, ["y" * 50] * (3 * INDEX_EVERY))
    (log.root / "p-0000" / "HEAD").write_text(json.dumps(head))
    log.append(0, ["z"] * (3 * INDEX_EVERY))
    assert [r for _, r in log.read(0, 2 * INDEX_EVERY, 2 * INDEX_EVERY + 2)] == ["z", "z"]


def test_partitions_grow_but_never_shrink(log):
    assert log.ensure(5) == 5
    with pytest.raises(SourceError, match="cannot shrink"):
        log.ensure(2)


def test_append_spread_is_round_robin(log):
    log.append_spread(range(7))
    assert log.heads() == {0: 3, 1: 2, 2: 2}
    log.append_spread(range(2))
    assert log.heads() == {0: 3, 1: 3, 2: 3}


def test_the_index_marks_every_index_every_th_offset_whatever_the_append_sizes(
    tmp_path, monkeypatch
):
    """Appends of odd sizes that start and end between index entries, across segments: every
    idx entry sits at a multiple of INDEX_EVERY with that record's byte position, and every
    range reads back exactly."""
    import random

    from tridentflow.sources import filelog

    monkeypatch.setattr(filelog, "INDEX_EVERY", 3)
    log = FileLog(tmp_path / "log", segment_records=10)
    log.ensure(1)
    rng = random.Random(7)
    records: list[str] = []
    for size in (1, 2, 4, 3, 7, 1, 9, 5):
        batch = [f"r{len(records) + i}-" + "é" * rng.randint(0, 3) for i in range(size)]
        log.append(0, batch)
        records += batch
    pdir = tmp_path / "log" / "p-0000"
    for seg in sorted(pdir.glob("seg-*.jsonl")):
        data = seg.read_bytes()
        starts = [0, *[i + 1 for i, b in enumerate(data) if b == ord("\n")][:-1]]
        index = seg.with_suffix(".idx").read_text().split("\n")
        entries = [tuple(map(int, ln.split())) for ln in index if ln]
        assert entries == [(rel, starts[rel]) for rel in range(0, len(starts), 3)], seg.name
    for start in range(len(records)):
        for end in range(start, len(records) + 1):
            assert [r for _, r in log.read(0, start, end)] == records[start:end]


def test_produce_lines_are_what_json_dumps_makes(tmp_path):
    """The CLI's fast path for plain lines (encode_basestring, one decode of the whole file):
    the same log lines as json.dumps(line, ensure_ascii=False), CRLF and blank lines as
    before, in round-robin order."""
    import json

    from hypothesis import given, settings
    from hypothesis import strategies as st

    from tridentflow.ops.cli import _records
    from tridentflow.registry import load_pipeline

    pipeline = load_pipeline("wordcount")
    counter = iter(range(10**6))

    @settings(max_examples=60, deadline=None)
    @given(st.lists(st.text(st.characters(blacklist_categories=("Cs",))), max_size=8))
    def same(lines):
        path = tmp_path / f"in-{next(counter)}.txt"
        path.write_bytes("".join(f"{line}\r\n" if i % 2 else f"{line}\n"
                                 for i, line in enumerate(lines)).encode("utf-8"))  # fmt: skip
        text = path.read_bytes().decode("utf-8")
        expected = [
            json.dumps(line, ensure_ascii=False, separators=(",", ":"))
            for raw in text.split("\n")[: len(lines)]
            if (line := raw.rstrip("\r\n")).strip()
        ]
        if any("\n" in line or "\r" in line for line in lines):
            return  # a line holding a line break is more than one line: not this property
        assert _records(pipeline, str(path), False) == expected

    same()
