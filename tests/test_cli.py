"""The ``tridentflow`` console script, run as a real process (local engine; Spark: test_spark)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import SEED_COUNTS, SEED_SENTENCES
from tests.helpers import sentences, word_counts

POINTS = ["after-coordinate", "in-emit", "mid-commit", "before-ledger"]


def query_all(tf, name, words):
    out = tf("query", name, *words, "--json")
    assert out.returncode == 0, out.stderr
    return {v["key"][0]: v["value"] for v in json.loads(out.stdout)["values"]}


def test_seed_word_count_through_the_cli(tf):
    produced = tf("produce", "wordcount", "-", input="\n".join(SEED_SENTENCES) + "\n")
    assert produced.returncode == 0, produced.stderr
    run = tf("run", "wordcount", "--engine", "local")
    assert run.returncode == 0, run.stderr
    assert "exactly-once" in run.stdout
    out = tf("query", "wordcount", *SEED_COUNTS, "unknown")
    assert out.stdout.splitlines() == [f"{w}\t{n}" for w, n in SEED_COUNTS.items()] + ["unknown\t0"]
    audit = tf("audit", "wordcount")
    assert (audit.returncode, audit.stdout.strip()) == (0, "lost=0 doubled=0")
    status = tf("status", "wordcount", "--json")
    info = json.loads(status.stdout)
    assert (info["committed_txid"], info["lag"], info["pending"]) == (1, 0, [])


@pytest.mark.parametrize("name", ["wordcount", "wordcount-opaque"])
@pytest.mark.parametrize("point", POINTS)
def test_killed_at_every_fault_point_then_resumed_is_exact(tf, tmp_path, name, point):
    lines = sentences(25, seed=3)
    src = tmp_path / "in.txt"
    src.write_text("\n".join(lines) + "\n")
    assert tf("produce", name, str(src)).returncode == 0
    args = ("run", name, "--engine", "local", "--batch-size", "2")
    killed = tf(*args, "--faults", f"{point}@2=kill")
    assert killed.returncode in (-9, 137), killed.stderr
    assert "injected fault" in killed.stderr
    pending = json.loads(tf("status", name, "--json").stdout)["pending"]
    assert pending and pending[0]["txid"] == 2
    resumed = tf(*args)
    assert resumed.returncode == 0, resumed.stderr
    assert tf("audit", name).stdout.strip() == "lost=0 doubled=0"
    expected = word_counts(lines)
    assert query_all(tf, name, expected) == expected


def test_errors_are_one_line(tf):
    for args, needle in [
        (("run", "nope"), "unknown pipeline 'nope'"),
        (("run", "wordcount", "--faults", "boom@1"), "unknown point 'boom'"),
        (("status", "wordcount", "--redis-url", "redis://127.0.0.1:1/0"), "cannot reach Redis"),
        (("produce", "wordcount", "/no/such/file"), "cannot read /no/such/file"),
        (("query", "wordcount", '["a", 1]'), "has 2 value(s)"),
        (("reset", "wordcount"), "add --yes"),
    ]:
        out = tf(*args)
        assert out.returncode != 0
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert needle in out.stderr
        assert "Traceback" not in out.stderr


def test_reset_then_query_shows_zero(tf):
    tf("produce", "wordcount", "-", input="a b\n")
    tf("run", "wordcount", "--engine", "local")
    assert tf("reset", "wordcount", "--yes", "--source").returncode == 0
    assert tf("query", "wordcount", "a").stdout == "a\t0\n"
