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


@pytest.mark.parametrize(
    "name", ["wordcount", "wordcount-opaque", "wordcount-stream", "wordcount-stream-tx"]
)
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
        (("run", "wordcount", "--remote", "sc://127.0.0.1:1"), "cannot reach Spark Connect at"),
        (("run", "wordcount", "--remote", "http://h:1"), "not a Spark Connect URL"),
        (("chaos", "--schedules", "1", "--remote", "sc://127.0.0.1:1"), "cannot reach Spark"),
    ]:
        out = tf(*args)
        assert out.returncode != 0
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert needle in out.stderr
        assert "Traceback" not in out.stderr


def test_chaos_adds_the_families_asked_for(tf):
    out = tf("chaos", "--schedules", "2", "--seed", "2003", "--family", "reshards", "--verbose")
    assert out.returncode == 0, out.stderr
    assert "reshard:1->2@step7:before-commit" in out.stdout
    assert out.stdout.strip().endswith("lost=0 doubled=0")
    bad = tf("chaos", "--schedules", "1", "--family", "floods")
    assert bad.returncode != 0 and "invalid choice: 'floods'" in bad.stderr


def test_reset_then_query_shows_zero(tf):
    tf("produce", "wordcount", "-", input="a b\n")
    tf("run", "wordcount", "--engine", "local")
    assert tf("reset", "wordcount", "--yes", "--source").returncode == 0
    assert tf("query", "wordcount", "a").stdout == "a\t0\n"


def test_a_lone_surrogate_record_is_quarantined_not_fatal(tf, home, redis_url):
    """`"bad \\ud800 word"` is valid JSON (a cut emoji from JavaScript) but not valid Unicode:
    it used to crash every emit attempt with a raw UnicodeEncodeError."""
    assert tf("produce", "wordcount-opaque", "-", input="good words\n").returncode == 0
    from tridentflow.sources.filelog import FileLog

    log = FileLog(home / "sources" / "wordcount-opaque")
    log.append_lines(0, ['"bad \\ud800 word"'])  # an external producer wrote it
    run = tf("run", "wordcount-opaque", "--engine", "local")
    assert run.returncode == 0, run.stderr
    listed = tf("quarantine", "wordcount-opaque", "--json")
    (entry,) = json.loads(listed.stdout)["entries"]
    assert "lone surrogate" in entry["error"] and entry["partition"] == 0
    assert query_all(tf, "wordcount-opaque", ["good", "words", "bad", "word"]) == {
        "good": 1,
        "words": 1,
        "bad": 0,
        "word": 0,
    }
    assert tf("audit", "wordcount-opaque").stdout.strip() == "lost=0 doubled=0"


@pytest.mark.parametrize(
    ("bad_line", "needle"),
    [('"ok"\n{"not json\n', "in.txt:2: not JSON"), ('"ok"\n"a \\ud800 b"\n', "in.txt:2")],
)
def test_produce_checks_every_record_before_appending_any(tf, tmp_path, home, bad_line, needle):
    assert tf("produce", "wordcount", "-", input="first\n").returncode == 0
    src = tmp_path / "in.txt"
    src.write_text(bad_line)
    out = tf("produce", "wordcount", str(src), "--json")
    assert out.returncode == 1 and out.stderr.count("\n") == 1
    assert needle in out.stderr
    status = json.loads(tf("status", "wordcount", "--json").stdout)
    assert sum(p["head"] for p in status["partitions"]) == 1  # nothing of in.txt appended


def test_produce_refuses_a_file_that_is_not_utf8(tf, tmp_path):
    src = tmp_path / "latin1.txt"
    src.write_bytes(b"fine\ncaf\xe9\n")
    out = tf("produce", "wordcount", str(src))
    assert out.returncode == 1 and "latin1.txt:2: not UTF-8" in out.stderr


def test_a_foreign_stored_value_is_one_line_naming_state_and_key(tf, redis_client):
    assert tf("produce", "wordcount", "-", input="a b\n").returncode == 0
    assert tf("run", "wordcount", "--engine", "local").returncode == 0
    redis_client.hset("tf:{wordcount}:state:counts", '["a"]', "not json at all")
    redis_client.hset("tf:{wordcount}:state:counts", '["b"]', '{"x": 1}')
    for args in (("query", "wordcount", "a"), ("query", "wordcount", "b")):
        out = tf(*args)
        assert out.returncode == 1 and out.stderr.count("\n") == 1, out.stderr
        assert "state counts, key [" in out.stderr and "found" in out.stderr
    assert tf("produce", "wordcount", "-", input="a b\n").returncode == 0
    run = tf("run", "wordcount", "--engine", "local")
    assert run.returncode == 1 and run.stderr.count("\n") == 1, run.stderr
    assert "state counts, key" in run.stderr and "Traceback" not in run.stderr


def test_wordcount_postgres_exports_after_each_commit_and_catches_up(tf, pg_dsn):
    """`run` exports after each commit; with PostgreSQL unreachable the commits go on, `run`
    exits 1 naming the sink behind (no password shown), and `export` catches it up."""
    from tests.postgres import table_rows

    assert (
        tf("produce", "wordcount-postgres", "-", input="\n".join(SEED_SENTENCES) + "\n").returncode
        == 0
    )
    down = {"TRIDENTFLOW_POSTGRES_DSN": "postgresql://postgres:pw-secret@127.0.0.1:1/nowhere"}
    run = tf("run", "wordcount-postgres", "--engine", "local", "--batch-size", "1", env=down)
    assert run.returncode == 1
    assert (
        "committed txids 1..1" in run.stdout
        and "sink postgres-wordcount_counts is behind" in run.stdout
    )
    assert "pw-secret" not in run.stdout + run.stderr
    status = json.loads(tf("status", "wordcount-postgres", "--json", env=down).stdout)
    assert [(s["sink"], s["position"], s["lag"]) for s in status["sinks"]] == [
        ("postgres-wordcount_counts", 0, 1)
    ]
    up = {"TRIDENTFLOW_POSTGRES_DSN": pg_dsn}
    exported = tf("export", "wordcount-postgres", env=up)
    assert exported.returncode == 0, exported.stderr
    assert (
        exported.stdout.strip()
        == "sink postgres-wordcount_counts: txids 1..1 applied, 10 rows; at txid 1"
    )
    assert table_rows(pg_dsn, "wordcount_counts", "word") == {
        w: (n,) for w, n in SEED_COUNTS.items()
    }
    tf("produce", "wordcount-postgres", "-", input="how are you\n")
    assert tf("run", "wordcount-postgres", "--engine", "local", env=up).returncode == 0
    assert table_rows(pg_dsn, "wordcount_counts", "word")["you"] == (3,)
    no_sink = tf("export", "wordcount")
    assert no_sink.returncode != 0 and "has no sink" in no_sink.stderr


USER_SUMS = """
from tridentflow import Count, LogSource, Pipeline, SourceMode, StateKind, StateSpec


def split(line):
    return ((word,) for word in line.split())


def build():
    pipeline = Pipeline("user-sums", LogSource(fields=("line",), mode=SourceMode.TRANSACTIONAL))
    pipeline.stream.each("line", split, "word").group_by("word").persistent_aggregate(
        StateSpec("counts", StateKind.TRANSACTIONAL), Count(), out_field="count"
    )
    return pipeline
"""


def test_a_pipeline_a_commit_ran_is_found_by_its_name_from_any_folder(tf, tmp_path):
    """Run as `module:attribute` from its dags folder, the pipeline's commits record where its
    code lives; the CLI then takes its name from any folder (no PYTHONPATH) and loads it from
    there. A name no commit recorded is the one line of an unknown pipeline."""
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "user_sums.py").write_text(USER_SUMS)
    lines = tmp_path / "lines.txt"
    lines.write_text("a b\nb c\n")
    beside = {"PYTHONPATH": str(dags)}
    for args in (["reset", "user_sums:build", "--yes", "--source"],
                 ["produce", "user_sums:build", str(lines)],
                 ["run", "user_sums:build", "--engine", "local", "--no-progress"]):  # fmt: skip
        done = tf(*args, env=beside)
        assert done.returncode == 0, done.stderr
    by_name = tf("query", "user-sums", "b", "--json")
    assert by_name.returncode == 0, by_name.stderr
    assert json.loads(by_name.stdout)["values"] == [{"key": ["b"], "value": 2}]
    unknown = tf("status", "user-summs")
    assert unknown.returncode == 1 and "unknown pipeline 'user-summs'" in unknown.stderr
