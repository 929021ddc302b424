"""NaN and infinities never reach a state: the family of every way they arrive - refused by
``produce`` and the Python API (one line naming the record), quarantined when an external
producer writes them into the log, and a float aggregate that overflows fails its txid in one
line instead of storing ``inf``. Every ``query --json`` output stays strict JSON."""

from __future__ import annotations

import io
import json

import pytest

from tests.helpers import runtime
from tridentflow.engines.local import LocalEngine
from tridentflow.errors import SourceError, StagingValueError
from tridentflow.ops.cli import main
from tridentflow.steps.driver import run_batches

PIPELINE = "tests.pipelines:scores"  # fields user, day, score: Sum by (user, day), Count by user
TOKENS = ("NaN", "Infinity", "-Infinity", "1e400", "-1e999", "1.5E+309")


def records_holding(token: str) -> list[str]:
    """The same non-finite number placed where a record can hold it."""
    return [
        f'["ann", 1, {token}]',
        f'{{"user": "ann", "day": 1, "score": {token}}}',
        f'["ann", 1, [1, {{"deep": {token}}}]]',
    ]


def strict_json(text: str):
    def refuse(name: str):
        raise AssertionError(f"{name} in JSON output: {text[:200]}")

    return json.loads(text, parse_constant=refuse)


def test_produce_refuses_them_in_one_line_and_appends_nothing(
    tf, redis_url, tmp_path, monkeypatch, capsys
):
    """The console script once; every other token and place through the same ``main`` in
    this process (a process each would cost ~0.4 s of imports, 18 times)."""
    env = {"TRIDENTFLOW_REDIS_URL": redis_url, "TRIDENTFLOW_HOME": str(tmp_path / "h")}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    first = True
    for token in TOKENS:
        for line in records_holding(token):
            given = f'["bob", 2, 5]\n{line}\n'
            if first:
                done = tf("produce", PIPELINE, "-", "--json", input=given, env=env)
                code, err, first = done.returncode, done.stderr, False
            else:
                stdin = io.TextIOWrapper(io.BytesIO(given.encode()), encoding="utf-8")
                monkeypatch.setattr("sys.stdin", stdin)
                code = main(["produce", PIPELINE, "-", "--json"], io.StringIO())
                err = capsys.readouterr().err
            lines = err.strip().splitlines()
            assert code == 1 and len(lines) == 1, (line, err)
            assert "-:2" in lines[0] and "not finite" in lines[0], lines[0]
    assert not (tmp_path / "h" / "sources").exists() or not any(
        (tmp_path / "h" / "sources").rglob("seg-*")
    )


def test_the_python_api_refuses_them(redis_url, redis_client, home):
    rt = runtime(PIPELINE, redis_url, home)
    rt.source_heads()
    for value in (float("nan"), float("inf"), -float("inf")):
        with pytest.raises(SourceError, match="not finite"):
            rt.log.append_spread([["ann", 1, value]])


def test_written_by_another_producer_they_are_quarantined(tf, redis_url, redis_client, tmp_path):
    env = {"TRIDENTFLOW_REDIS_URL": redis_url, "TRIDENTFLOW_HOME": str(tmp_path / "h")}
    assert tf("produce", PIPELINE, "-", "--json", input='["ann", 1, 2]\n', env=env).returncode == 0
    rt = runtime(PIPELINE, redis_url, tmp_path / "h")
    planted = [line for token in TOKENS for line in records_holding(token)]
    rt.log.append_lines(0, [*planted, '["ann", 1, 3]'])  # as raw lines: no check on the way in
    ran = tf("run", PIPELINE, "--engine", "local", env=env)
    assert ran.returncode == 0, ran.stderr
    quarantined = strict_json(tf("quarantine", PIPELINE, "--json", env=env).stdout)
    assert quarantined["total"] == len(planted)
    assert all("not finite" in e["error"] for e in quarantined["entries"])
    for state, key in (("by_day", '["ann", 1]'), ("events", "ann")):
        out = tf("query", PIPELINE, "--state", state, key, "--json", env=env)
        value = strict_json(out.stdout)["values"][0]["value"]
        assert value == (5 if state == "by_day" else 2)
    listing = tf("query", PIPELINE, "--state", "by_day", "--all", "--json", env=env)
    strict_json(listing.stdout)
    assert tf("audit", PIPELINE, env=env).stdout.strip() == "lost=0 doubled=0"


def test_a_float_aggregate_that_overflows_fails_its_txid_and_stores_nothing(
    redis_url, redis_client, home
):
    rt = runtime(PIPELINE, redis_url, home)
    rt.source_heads()
    rt.log.append_spread([["ann", 1, 1e308], ["ann", 1, 1e308]])
    with pytest.raises(StagingValueError, match="not finite"):
        run_batches(rt, LocalEngine())
    assert rt.ledger.committed_txid() == 0
    assert not redis_client.hgetall(rt.keyspace.state("by_day"))


def test_an_overflow_at_commit_fails_the_txid_in_redis_and_in_python(redis_url, redis_client, home):
    """Each txid's partial is finite; their sum is not: the in-Redis combine hands the key to
    the Python path, which refuses to store it. The txid stays pending, nothing is stored."""
    from tridentflow.errors import StateUpdateError

    rt = runtime(PIPELINE, redis_url, home)
    rt.source_heads()
    rt.log.append_lines(0, ['["ann",1,1e308]', '["ann",1,1e308]'])  # one txid each
    run_batches(rt, LocalEngine(), max_batches=1, batch_size=1)
    before = redis_client.hgetall(rt.keyspace.state("by_day"))
    with pytest.raises(StateUpdateError, match="NaN or an infinity"):
        run_batches(rt, LocalEngine(), batch_size=1)
    assert rt.ledger.committed_txid() == 1
    assert redis_client.hgetall(rt.keyspace.state("by_day")) == before
