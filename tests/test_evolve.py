"""Pipelines evolve (issue 54): the ledger records each state's shape - kind, aggregator, key
fields - with the pipeline's settings. A new state starts at the next txid, a state the code no
longer has is kept as it was, another expiry applies from the next txid; another kind,
aggregator or key fields on a state that holds values is refused in one line before anything
is written, and `settings --record` is the operator's way to say the values stay right."""

from __future__ import annotations

import json
import sys

import pytest

from tests.helpers import produce
from tridentflow import Count, LogSource, Pipeline, SourceMode, StateKind, StateSpec, Sum
from tridentflow.engines.local import LocalEngine
from tridentflow.ops.audit import audit
from tridentflow.ops.status import format_status, status
from tridentflow.steps.driver import run_batches
from tridentflow.steps.query import query
from tridentflow.steps.recorded_settings import STATES, StateShapeChangedError, record
from tridentflow.steps.runtime import Runtime


def evolving(
    *,
    kind: StateKind = StateKind.OPAQUE,
    aggregator=None,
    keys: tuple[str, ...] = ("word",),
    extra: bool = False,
    counts: bool = True,
    expire: int | None = None,
    extra_expire: int | None = None,
) -> Pipeline:
    """Versions of one pipeline (one name): words counted into ``counts``; ``extra`` adds a
    state ``lengths`` (the words' letters summed per word; expiring after ``extra_expire``
    txids)."""
    pipeline = Pipeline("evolving", LogSource(fields=("sentence",), mode=SourceMode.OPAQUE))
    words = pipeline.stream.each(
        "sentence", lambda s: [(w, len(w)) for w in s.split()], ("word", "length")
    )
    if counts:
        words.group_by(keys).persistent_aggregate(
            StateSpec("counts", kind, expire_after_txids=expire),
            aggregator or Count(),
            "length" if isinstance(aggregator, Sum) else (),
            out_field="n",
        )
    if extra:
        words.group_by("word").persistent_aggregate(
            StateSpec("lengths", StateKind.OPAQUE, expire_after_txids=extra_expire),
            Sum(),
            "length",
            out_field="letters",
        )
    return pipeline


def run(rt: Runtime, lines: list[str]) -> None:
    produce(rt, lines)
    run_batches(rt, LocalEngine(), batch_size=100)


def value(rt: Runtime, state: str, key: str):
    return query(rt, rt.pipeline.states[state], [(key,)])[1][0]


@pytest.fixture
def deployed(redis_url, home) -> Runtime:
    """The first version, two txids committed."""
    rt = Runtime.open(evolving(), redis_url, home)
    rt.ledger.reset(force=True)
    run(rt, ["a bb"])
    run(rt, ["bb"])
    return rt


def test_the_first_commit_records_every_states_shape(deployed):
    recorded = json.loads(deployed.ledger.settings()[STATES])
    assert recorded == {
        "counts": {
            "kind": "opaque",
            "aggregator": "tridentflow.aggregators.Count",
            "keys": ["word"],
            "in": [],
            "expire_after_txids": None,
            "expire_after_ms": None,
            "since": 1,
        }
    }


def test_a_new_state_counts_from_the_next_txid_and_status_says_since_when(
    deployed, redis_url, home
):
    grown = Runtime.open(evolving(extra=True), redis_url, home)
    run(grown, ["a bb"])
    assert value(grown, "lengths", "bb") == 2  # only txid 3's records
    assert value(grown, "counts", "bb") == 3
    info = status(grown)
    assert (info["states"]["counts"]["since"], info["states"]["lengths"]["since"]) == (1, 3)
    assert "lengths: opaque, 2 keys, since txid 3" in format_status(info)


@pytest.mark.parametrize("expire", [None, 2], ids=["whole", "txid-by-txid"])
def test_audit_recounts_a_state_a_deploy_added_from_the_txid_it_began(redis_url, home, expire):
    """The family 'audit across a code change': a state added by a deploy holds only the
    txids since it began; audit recounted it from the whole source (lost=8 for a correct
    state) - as one batch, and txid by txid when the added state expires."""
    first = Runtime.open(evolving(expire=expire), redis_url, home)
    first.ledger.reset(force=True)
    run(first, ["a bb"])
    run(first, ["bb ccc"])
    grown = Runtime.open(evolving(extra=True, expire=expire, extra_expire=expire), redis_url, home)
    run(grown, ["a bb"])
    run(grown, ["bb"])
    assert value(grown, "lengths", "bb") == 4  # txids 3 and 4
    report = audit(grown)
    assert (report.ok, report.unaudited) == (True, []), report.line()
    assert audit(first).ok  # the first code, deployed back: lengths kept, not audited


def test_audit_recounts_an_added_state_whose_first_txid_skipped_a_dark_partition(redis_url, home):
    """The same, the added state's first txid committed without a dark partition (an opaque
    source goes on without it): that partition's records before the state began must not be
    counted - audit took the partition from the source's start (the deploys chaos family found
    it, mutating-opaque seed 6009: expected 14, stored 13)."""
    from tridentflow.faults import FaultPlan

    def two_partitions(extra: bool) -> Pipeline:
        pipeline = Pipeline(
            "evolving-dark", LogSource(fields=("sentence",), partitions=2, mode=SourceMode.OPAQUE)
        )
        words = pipeline.stream.each("sentence", lambda s: [(w,) for w in s.split()], "word")
        names = ("counts", "added") if extra else ("counts",)
        for name in names:
            spec = StateSpec(name, StateKind.OPAQUE)
            words.group_by("word").persistent_aggregate(spec, Count(), out_field="n")
        return pipeline

    first = Runtime.open(two_partitions(False), redis_url, home)
    first.ledger.reset(force=True)
    first.log.ensure(2)
    first.log.append(0, [{"sentence": "a b"}])
    first.log.append(1, [{"sentence": "a c"}])
    run_batches(first, LocalEngine(), batch_size=100)  # txid 1, before the deploy
    grown = Runtime.open(two_partitions(True), redis_url, home)
    grown.log.append(0, [{"sentence": "a"}])
    grown.log.append(1, [{"sentence": "a"}])
    dark = grown.with_(faults=FaultPlan.parse("dark:1@2"))
    run_batches(dark, LocalEngine(), batch_size=100)  # txid 2: partition 1 skipped
    run_batches(grown, LocalEngine(), batch_size=100)  # txid 3 reads it
    assert grown.ledger.committed_txid() == 3
    assert (value(grown, "counts", "a"), value(grown, "added", "a")) == (4, 2)
    report = audit(grown)
    assert (report.ok, report.unaudited) == (True, []), report.line()


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"aggregator": Sum()}, "aggregator tridentflow.aggregators.Count (since txid 1); this "
                                "code makes it with aggregator tridentflow.aggregators.Sum"),
        ({"keys": ("word", "length")}, "keys ['word'] (since txid 1); this code makes it with "
                                       "keys ['word', 'length']"),
    ],
)  # fmt: skip
def test_another_shape_on_a_state_with_values_is_refused_before_anything_is_written(
    deployed, redis_url, home, change, said
):
    before = dict(deployed.client.hgetall(deployed.keyspace.state("counts")))
    other = Runtime.open(evolving(**change), redis_url, home)
    with pytest.raises(StateShapeChangedError) as refused:
        run(other, ["a"])
    line = str(refused.value)
    assert "\n" not in line and said in line
    assert "another state name" in line and "settings evolving --record" in line
    assert deployed.ledger.committed_txid() == 2  # nothing moved
    assert dict(deployed.client.hgetall(deployed.keyspace.state("counts"))) == before
    assert not StateShapeChangedError.retry_helps  # an Airflow task fails at once


def test_another_kind_is_refused_too(redis_url, home):
    """(Over a transactional source, where both kinds are allowed.)"""

    def version(kind: StateKind) -> Pipeline:
        pipeline = Pipeline("evolving-kind", LogSource(fields=("w",)))
        counted = pipeline.stream.group_by("w")
        counted.persistent_aggregate(StateSpec("c", kind), Count(), out_field="n")
        return pipeline

    first = Runtime.open(version(StateKind.OPAQUE), redis_url, home)
    first.ledger.reset(force=True)
    first.source_heads()
    first.log.append_spread([["x"]])
    run_batches(first, LocalEngine(), batch_size=10)
    other = Runtime.open(version(StateKind.TRANSACTIONAL), redis_url, home)
    other.log.append_spread([["x"]])
    with pytest.raises(StateShapeChangedError, match=r"kind opaque .* with kind transactional"):
        run_batches(other, LocalEngine(), batch_size=10)


def test_the_operator_records_a_shape_change_on_purpose_and_it_goes_on(deployed, redis_url, home):
    summed = Runtime.open(evolving(aggregator=Sum()), redis_url, home)
    record(summed, force=True)  # `tridentflow settings evolving --record`: the values stay right
    recorded = json.loads(summed.ledger.settings()[STATES])
    assert recorded["counts"]["aggregator"] == "tridentflow.aggregators.Sum"
    assert recorded["counts"]["since"] == 1  # the state's history is its own
    run(summed, ["a"])  # goes on: a's count 1 plus its letters 1
    assert value(summed, "counts", "a") == 2


def test_a_removed_state_is_kept_as_it_was_and_comes_back_with_its_values(
    deployed, redis_url, home
):
    grown = Runtime.open(evolving(extra=True), redis_url, home)
    run(grown, ["a"])
    shrunk = Runtime.open(evolving(extra=True, counts=False), redis_url, home)
    run(shrunk, ["a a"])
    info = status(shrunk)
    assert info["kept_states"] == ["counts"]
    assert "counts: not in this code; its values are kept as they were" in format_status(info)
    back = Runtime.open(evolving(extra=True), redis_url, home)
    assert value(back, "counts", "a") == 2  # txids 1 and 3; txid 4 ran without the state


def test_another_expiry_is_a_compatible_change(deployed, redis_url, home):
    expiring = Runtime.open(evolving(expire=1), redis_url, home)
    run(expiring, ["a"])
    recorded = json.loads(expiring.ledger.settings()[STATES])
    assert recorded["counts"]["expire_after_txids"] == 1


def everything(*, lengths: bool = True, name: str = "lengths", aggregator=None) -> Pipeline:
    """A pipeline whose ``lengths`` state has every kind of key a state can leave: 3 shards,
    undo logs (retain_txids), an expiry index, change logs a sink reads."""
    from tridentflow.sinks import RedisStreamSink

    pipeline = Pipeline(
        "evolving",
        LogSource(fields=("sentence",), mode=SourceMode.OPAQUE),
        state_shards=3,
        retain_txids=5,
    )
    words = pipeline.stream.each(
        "sentence", lambda s: [(w, len(w)) for w in s.split()], ("word", "length")
    )
    words.group_by("word").persistent_aggregate(
        StateSpec("counts", StateKind.OPAQUE), Count(), out_field="n"
    )
    if lengths:
        letters = words.group_by("word").persistent_aggregate(
            StateSpec(name, StateKind.OPAQUE, expire_after_txids=50), aggregator or Sum(),
            "length", out_field="letters",
        )  # fmt: skip
        letters.new_values_stream().sink(RedisStreamSink("evolving-letters", name="letters"))
    return pipeline


@pytest.fixture
def with_lengths(redis_url, home) -> tuple[Runtime, Runtime]:
    """(the code with ``lengths``, three txids run, its change logs not yet exported; the
    code without it, one more txid)."""
    old = Runtime.open(everything(), redis_url, home)
    old.ledger.reset(force=True)
    for lines in (["a bb"], ["bb ccc"], ["dddd a"]):
        run(old, lines)
    new = Runtime.open(everything(lengths=False), redis_url, home)
    record(new, force=True)  # the sink of lengths is gone on purpose
    run(new, ["a"])
    return old, new


def _lengths_keys(rt: Runtime) -> list[str]:
    from tridentflow_state.evolve import state_keys

    return sorted(state_keys(rt.client, rt.keyspace, "lengths"))


def test_dropping_a_kept_state_deletes_every_key_of_it_and_nothing_else(with_lengths):
    from tridentflow.ops.evolve import drop_state

    _old, new = with_lengths
    kinds = {key.split(":")[2] for key in _lengths_keys(new)}
    assert {"state", "undo", "changes", "changelog", "expiry", "expiry-built"} <= kinds, kinds
    assert sum(key.split(":")[2] == "state" for key in _lengths_keys(new)) == 3  # a shard each
    counts_before = {w: value(new, "counts", w) for w in ("a", "bb", "ccc", "dddd")}
    result = drop_state(new, "lengths")
    assert result.keys_deleted >= 5 and _lengths_keys(new) == []
    assert {w: value(new, "counts", w) for w in counts_before} == counts_before
    assert "lengths" not in json.loads(new.ledger.settings()[STATES])
    assert status(new)["kept_states"] == []
    with pytest.raises(Exception, match="has no state lengths to drop"):
        drop_state(new, "lengths")
    run(new, ["bb"])  # the pipeline goes on
    assert value(new, "counts", "bb") == 3
    back = Runtime.open(everything(), new.redis_url, new.home)
    run(back, ["bb"])  # a code with it again starts it afresh
    assert value(back, "lengths", "bb") == 2


def test_a_drop_is_refused_while_the_code_has_the_state(with_lengths):
    from tridentflow.ops.evolve import EvolveRefusedError, drop_state

    old, _new = with_lengths
    keys = _lengths_keys(old)
    with pytest.raises(EvolveRefusedError) as refused:
        drop_state(old, "lengths")
    line = str(refused.value)
    assert "still in the code of pipeline evolving" in line and "\n" not in line
    assert _lengths_keys(old) == keys


def test_a_drop_killed_part_way_finishes_when_run_again_and_fences_the_old_code(
    with_lengths, monkeypatch
):
    import tridentflow_state.evolve as evolve_keys
    from tridentflow.ops.evolve import drop_state

    old, new = with_lengths
    original = evolve_keys._unlink
    calls = []

    def killed_after_one_chunk(client, keys):
        if calls:
            raise ConnectionError("killed")
        calls.append(keys)
        return original(client, keys)

    monkeypatch.setattr(evolve_keys, "DELETE_CHUNK", 2)
    monkeypatch.setattr(evolve_keys, "_unlink", killed_after_one_chunk)
    with pytest.raises(ConnectionError):
        drop_state(new, "lengths")
    left = _lengths_keys(new)
    assert left and len(calls) == 1
    with pytest.raises(StateShapeChangedError, match="state lengths of evolving is being dropped"):
        run(old, ["a"])  # a straggler of the old code writes nothing
    assert _lengths_keys(new) == left
    monkeypatch.setattr(evolve_keys, "_unlink", original)
    assert drop_state(new, "lengths").keys_deleted == len(left)
    assert _lengths_keys(new) == []


def test_the_cli_drops_with_yes_only(with_lengths, redis_url, home, monkeypatch, capsys):
    from tridentflow.ops.cli import main

    _old, new = with_lengths
    monkeypatch.setenv("TRIDENTFLOW_REDIS_URL", redis_url)
    monkeypatch.setenv("TRIDENTFLOW_HOME", str(home))
    target = "tests.test_evolve:without_lengths"
    assert main(["evolve", target, "--drop-state", "lengths"]) == 1
    assert "add --yes" in capsys.readouterr().err
    assert _lengths_keys(new)
    assert main(["evolve", target, "--drop-state", "lengths", "--yes"]) == 0
    assert "drop state lengths of pipeline evolving for good" in capsys.readouterr().out
    assert _lengths_keys(new) == []


def without_lengths() -> Pipeline:
    return everything(lengths=False)


def renamed() -> Pipeline:
    return everything(name="letters")


def _letters(rt: Runtime, state: str, as_of: int | None = None) -> dict:
    from tridentflow.steps.query import list_state, list_state_as_of

    persist = rt.pipeline.states[state]
    page = list_state(rt, persist, 1000) if as_of is None else list_state_as_of(rt, persist, as_of)
    return {key[0]: v for key, v in page.items}


@pytest.fixture
def before_rename(redis_url, home) -> tuple[Runtime, Runtime, dict, dict]:
    """(the code with ``lengths``, three txids run; the code naming it ``letters``, nothing
    run yet; lengths' values now; as of txid 2)."""
    old = Runtime.open(everything(), redis_url, home)
    old.ledger.reset(force=True)
    for lines in (["a bb"], ["bb ccc"], ["dddd a"]):
        run(old, lines)
    new = Runtime.open(renamed(), redis_url, home)
    return old, new, _letters(old, "lengths"), _letters(old, "lengths", 2)


def test_a_rename_moves_every_key_and_the_pipeline_goes_on_from_the_values(before_rename):
    from tridentflow.ops.evolve import rename_state

    _old, new, values, as_of_2 = before_rename
    keys = _lengths_keys(new)
    result = rename_state(new, "lengths", "letters")
    assert result.keys_moved == len(keys) and _lengths_keys(new) == []
    assert _letters(new, "letters") == values == {"a": 2, "bb": 4, "ccc": 3, "dddd": 4}
    assert _letters(new, "letters", 2) == as_of_2  # the undo logs moved with it
    recorded = json.loads(new.ledger.settings()[STATES])
    assert "lengths" not in recorded and recorded["letters"]["since"] == 1
    assert json.loads(new.ledger.settings()["change_logs"]) == ["letters"]
    run(new, ["bb"])
    assert value(new, "letters", "bb") == 6
    assert rename_state  # run again: nothing to rename, one line
    with pytest.raises(Exception, match="has no state lengths to rename"):
        rename_state(new, "lengths", "letters")


def test_a_rename_is_refused_in_one_line_when_it_cannot_keep_the_values(
    before_rename, redis_url, home
):
    from tridentflow.aggregators import Max
    from tridentflow.ops.evolve import EvolveRefusedError, rename_state

    old, new, values, _ = before_rename
    recorded = new.ledger.settings()
    other = Runtime.open(everything(name="letters", aggregator=Max()), redis_url, home)
    cases = [
        (other, "aggregator tridentflow.aggregators.Sum; the code makes letters with "
                "aggregator tridentflow.aggregators.Max"),
        (old, "still in the code of pipeline evolving"),
    ]  # fmt: skip
    for rt, words in cases:
        with pytest.raises(EvolveRefusedError) as refused:
            rename_state(rt, "lengths", "letters")
        assert words in str(refused.value) and "\n" not in str(refused.value)
    record(new, force=True)  # the new code counted into letters first: it holds values now
    run(new, ["a"])
    with pytest.raises(EvolveRefusedError, match="letters of evolving already holds values"):
        rename_state(new, "lengths", "letters")
    assert _letters(old, "lengths") == values
    assert (
        json.loads(new.ledger.settings()[STATES])["lengths"]
        == json.loads(recorded[STATES])["lengths"]
    )


def test_a_rename_killed_part_way_fences_both_codes_and_finishes_when_run_again(
    before_rename, monkeypatch
):
    import tridentflow_state.evolve as evolve_keys
    from tridentflow.ops.evolve import rename_state
    from tridentflow.steps.recorded_settings import StateEvolvingError

    old, new, values, _ = before_rename
    moves = []

    def killed(client, keyspace, old_name, new_name):
        for key, target in evolve_keys._keys_of(client, keyspace, old_name, new_name):
            if moves:
                raise ConnectionError("killed")
            client.rename(key, target)
            moves.append(key)
        return len(moves)

    monkeypatch.setattr("tridentflow.ops.evolve.rename_state_keys", killed)
    with pytest.raises(ConnectionError):
        rename_state(new, "lengths", "letters")
    for rt in (old, new):
        with pytest.raises(StateEvolvingError, match="lengths of evolving is being renamed"):
            run(rt, ["a"])
    monkeypatch.undo()
    committed = new.ledger.committed_txid()
    assert rename_state(new, "lengths", "letters").keys_moved >= 1
    assert _letters(new, "letters") == values and new.ledger.committed_txid() == committed
    run(new, ["a"])  # the refused runs' two records and this one, each counted once
    assert value(new, "letters", "a") == 2 + 3


def test_an_attempt_under_way_when_the_rename_starts_writes_nothing_after_it(before_rename):
    from tridentflow.ops.evolve import rename_state
    from tridentflow_state.backing import Fence
    from tridentflow_state.codec import encode_key
    from tridentflow_state.errors import FencedError
    from tridentflow_state.shards import claim_shards

    _old, new, values, _ = before_rename
    ticket = new.ledger.begin_commit(new.ledger.committed_txid() + 1)
    zombie = Fence(ticket.txid, ticket.token, ticket.generation)
    claim_shards(new.client, new.keyspace, ["letters"], zombie)
    field = encode_key(("zz",))
    new.backing("letters").multi_put([(field, f"[{ticket.txid},9,null]")], zombie)
    rename_state(new, "lengths", "letters")
    with pytest.raises(FencedError):
        new.backing("letters").multi_put([(field, f"[{ticket.txid},9,null]")], zombie)
    assert _letters(new, "letters") == values  # its write before the rename is gone too
    from tridentflow_state.evolve import state_keys

    leftovers = [k for k in state_keys(new.client, new.keyspace, "letters")
                 if k.endswith(f":{ticket.txid}")]  # fmt: skip
    assert leftovers == []  # nor its written-set: a retry would take its keys for its own


def test_the_cli_renames_with_yes_and_names_a_bad_pair(
    before_rename, redis_url, home, monkeypatch, capsys
):
    from tridentflow.ops.cli import main

    _old, new, values, _ = before_rename
    monkeypatch.setenv("TRIDENTFLOW_REDIS_URL", redis_url)
    monkeypatch.setenv("TRIDENTFLOW_HOME", str(home))
    target = "tests.test_evolve:renamed"
    assert main(["evolve", target, "--rename-state", "lengths", "--yes"]) == 1
    assert "--rename-state takes OLD=NEW" in capsys.readouterr().err
    assert main(["evolve", target, "--rename-state", "lengths=letters"]) == 1
    assert "add --yes" in capsys.readouterr().err
    assert main(["evolve", target, "--rename-state", "lengths=letters", "--yes", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["new"] == "letters"
    assert _letters(new, "letters") == values


class Letters(Sum.__base__):  # a Combiner storing {"letters": n} where Sum stored n
    pure = True

    def init(self, *values):
        return {"letters": values[0]}

    def combine(self, a, b):
        return {"letters": a["letters"] + b["letters"]}

    def zero(self):
        return {"letters": 0}

    def present(self, value):
        return value["letters"]


def as_letters(value):
    """The migration from Sum's stored form to Letters' (a second pass would fail loudly)."""
    if isinstance(value, dict):
        raise TypeError(f"already migrated: {value}")
    return {"letters": value}


def lettered() -> Pipeline:
    return everything(aggregator=Letters())


@pytest.fixture
def before_migration(redis_url, home) -> tuple[Runtime, dict, dict]:
    """(the code with Letters on ``lengths``, three txids run by the code with Sum; the
    values now; as of txid 2)."""
    old = Runtime.open(everything(), redis_url, home)
    old.ledger.reset(force=True)
    for lines in (["a bb"], ["bb ccc"], ["dddd a"]):
        run(old, lines)
    return (
        Runtime.open(lettered(), redis_url, home),
        _letters(old, "lengths"),
        _letters(old, "lengths", 2),
    )


MIGRATION = "tests.test_evolve:as_letters"


def test_a_migration_rewrites_the_state_its_undo_and_change_logs_then_the_code_goes_on(
    before_migration,
):
    from tridentflow.ops.evolve import migrate_state
    from tridentflow.steps.export import changes_of

    new, values, as_of_2 = before_migration
    with pytest.raises(StateShapeChangedError, match=r"aggregator tridentflow\.aggregators\.Sum"):
        run(new, ["a"])  # refused before it writes: the values are Sum's
    result = migrate_state(new, "lengths", MIGRATION)
    assert result.keys_migrated >= 3 + 2  # three shards' hashes, undo and change logs
    assert _letters(new, "lengths") == values == {"a": 2, "bb": 4, "ccc": 3, "dddd": 4}
    assert _letters(new, "lengths", 2) == as_of_2  # as of an older txid: the new form too
    feed = next(f for f in new.pipeline.feeds if f.state == "lengths")
    logged = changes_of(new, feed, new.ledger.committed_txid())
    assert logged and all(isinstance(v, int) for _, _, v in logged)  # presented by Letters
    recorded = json.loads(new.ledger.settings()[STATES])["lengths"]
    assert recorded["aggregator"] == "tests.test_evolve.Letters" and recorded["since"] == 1
    run(new, ["bb"])  # the produced "a" of the refused run and this one
    assert _letters(new, "lengths") == {**values, "a": 3, "bb": 6}


def test_a_migration_killed_part_way_transforms_no_value_twice(before_migration, monkeypatch):
    import tridentflow_state.evolve as evolve_keys
    from tridentflow.ops.evolve import migrate_state
    from tridentflow.steps.recorded_settings import StateEvolvingError

    new, values, as_of_2 = before_migration
    original, swaps = evolve_keys.SWAP_MIGRATED, []

    def killed(client, keys, args):
        if len(swaps) == 2:
            raise ConnectionError("killed")
        swaps.append(args[0])
        return original(client, keys, args)

    monkeypatch.setattr(evolve_keys, "SWAP_MIGRATED", killed)
    with pytest.raises(ConnectionError):
        migrate_state(new, "lengths", MIGRATION)
    with pytest.raises(StateEvolvingError, match="lengths of evolving is being migrated"):
        run(new, ["a"])
    monkeypatch.setattr(evolve_keys, "SWAP_MIGRATED", original)
    migrate_state(new, "lengths", MIGRATION)  # as_letters raises on a value done twice
    assert _letters(new, "lengths") == values and _letters(new, "lengths", 2) == as_of_2


@pytest.mark.parametrize("killed_at", ["before finish_migration", "after finish_migration"])
def test_a_finished_migration_run_again_is_a_no_op(
    before_migration, monkeypatch, capsys, redis_url, home, killed_at
):
    """Killed after its last write - before it cleared its notes, or after, before it said
    "done" - or simply run twice, the same migration is recorded as finished: the rerun
    transforms nothing (as_letters raises on a value done twice) and says so; commits go on."""
    import tridentflow.ops.evolve as evolve_ops
    from tridentflow.ops.cli import main

    new, values, _ = before_migration
    original = evolve_ops.finish_migration

    def killed(client, keyspace, name):
        if killed_at == "after finish_migration":
            original(client, keyspace, name)
        raise ConnectionError("killed")

    monkeypatch.setattr(evolve_ops, "finish_migration", killed)
    with pytest.raises(ConnectionError):
        evolve_ops.migrate_state(new, "lengths", MIGRATION)
    monkeypatch.setattr(evolve_ops, "finish_migration", original)
    again = evolve_ops.migrate_state(new, "lengths", MIGRATION)
    assert again.already and again.keys_migrated == 0
    assert _letters(new, "lengths") == values
    run(new, ["a"])
    assert _letters(new, "lengths") == {**values, "a": values["a"] + 1}
    monkeypatch.setenv("TRIDENTFLOW_REDIS_URL", redis_url)
    monkeypatch.setenv("TRIDENTFLOW_HOME", str(home))
    capsys.readouterr()
    assert main(["evolve", "tests.test_evolve:lettered", "--migrate", f"lengths={MIGRATION}",
                 "--yes"]) == 0  # fmt: skip
    assert "already: nothing to do" in capsys.readouterr().out
    assert _letters(new, "lengths") == {**values, "a": values["a"] + 1}


def test_a_migration_that_fails_on_a_value_is_one_line_and_finishes_once_fixed(
    before_migration, monkeypatch
):
    from tridentflow.ops.evolve import EvolveRefusedError, migrate_state
    from tridentflow_state.errors import StateError

    new, values, _ = before_migration
    original = as_letters

    def picky(value):
        if value == 4:
            raise ValueError("four is not a length")
        return original(value)

    monkeypatch.setattr(sys.modules[__name__], "as_letters", picky)
    with pytest.raises(StateError) as failed:
        migrate_state(new, "lengths", MIGRATION)
    line = str(failed.value)
    assert "state lengths, key" in line and "four is not a length" in line and "\n" not in line
    monkeypatch.undo()
    migrate_state(new, "lengths", MIGRATION)
    assert _letters(new, "lengths") == values
    for ref, words in (("tests.test_evolve:nothing", "cannot load the migration"),
                       ("no-colon", "NAME=module:function")):  # fmt: skip
        with pytest.raises(EvolveRefusedError, match=words):
            migrate_state(new, "lengths", ref)
    with pytest.raises(EvolveRefusedError, match="code of pipeline evolving has no state counted"):
        migrate_state(new, "counted", MIGRATION)


def _migrated(new: Runtime) -> None:
    from tridentflow.ops.evolve import migrate_state

    migrate_state(new, "lengths", MIGRATION)


def _renamed(new: Runtime) -> None:
    from tridentflow.ops.evolve import rename_state

    rename_state(new, "lengths", "letters")


@pytest.mark.parametrize(
    ("emitting_code", "deployed_code", "evolve"),
    [
        pytest.param(everything, lettered, _migrated, id="evolve-migrate"),
        pytest.param(everything, lambda: everything(name="letters"), _renamed, id="evolve-rename"),
        pytest.param(lambda: everything(lengths=False), everything, None, id="a-state-added"),
    ],
)
def test_a_txid_emitted_by_other_code_is_refused_at_commit_in_one_line(
    redis_url, home, emitting_code, deployed_code, evolve
):
    """A code deploy and its `evolve` between a txid's emit and its commit (its Airflow run in
    flight): the staged batch says which code shape made it, and the commit by code of another
    shape refuses it in one line before anything is written - never the old aggregator's
    partials combined into migrated values, never a bare KeyError; emitted again by the new
    code, the same txid (its offsets unchanged) commits, and the values equal a recount."""
    from tridentflow.errors import IncompleteBatchError
    from tridentflow.steps.committer import commit
    from tridentflow.steps.coordinator import coordinate
    from tridentflow.steps.emitter import emit

    old = Runtime.open(emitting_code(), redis_url, home)
    old.ledger.reset(force=True)
    run(old, ["a bb"])
    produce(old, ["ccc dddd"])
    txid = old.ledger.committed_txid() + 1
    coordinate(old, txid)
    emit(old, txid, LocalEngine())  # the old code's partials staged; the deploy comes now
    new = Runtime.open(deployed_code(), redis_url, home)
    if evolve is not None:
        evolve(new)
    before = new.ledger.committed_txid()
    with pytest.raises(IncompleteBatchError) as refused:
        commit(new, txid)
    line = str(refused.value)
    assert "\n" not in line and f"txid {txid} was emitted by code of another shape" in line
    assert "emit it again" in line and new.ledger.committed_txid() == before
    emit(new, txid, LocalEngine())
    commit(new, txid)
    assert new.ledger.committed_txid() == txid
    name = next(iter(n for n in ("letters", "lengths") if n in new.pipeline.states))
    if emitting_code is everything:  # the state held txid 1 before: both txids counted
        assert _letters(new, name) == {"a": 1, "bb": 2, "ccc": 3, "dddd": 4}


def test_a_rewind_takes_back_the_states_the_deployed_code_no_longer_has(with_lengths):
    """A rewind under code without ``lengths`` (kept, with its undo logs): the kept state goes
    back with the others, so when the previous code comes back its commits run and its values
    are those as of the target, then the replay's."""
    from tridentflow.ops.rewind import rewind_pipeline

    old, new = with_lengths
    as_of_1 = _letters(old, "lengths", 1)
    rewind_pipeline(new, 1, force=True)  # lengths holds values stamped 2 and 3
    back = Runtime.open(everything(), old.redis_url, old.home)
    record(back, force=True)  # its sink is back too
    assert _letters(back, "lengths") == as_of_1  # (without: a read that times out)
    run(back, ["zz"])  # the replay of txids 2-4 ("bb ccc", "dddd a", "a"), then "zz"
    assert _letters(back, "lengths") == {"a": 3, "bb": 4, "ccc": 3, "dddd": 4, "zz": 2}
