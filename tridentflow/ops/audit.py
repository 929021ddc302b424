"""Audit: recompute every state from the source up to the committed offsets, compare.

The recomputation runs the pipeline's plan on the LocalEngine (plain Python), independent of
the engine that produced the state. For numeric values the difference is reported as ``lost``
(expected more than stored) and ``doubled`` (stored more than expected); any other differing
value counts as ``mismatched``. Run it while no commit is in progress.

Only states that do not depend on how records were batched can be recomputed this way: those
fed by per-record operations alone, with a Combiner or a Reducer (a Reducer folds in source
order here and in batch order in the state, so it must not care about order). States behind
batch operations (aggregate, partition_aggregate, join, ...) or with a custom updater are
listed as ``unaudited``. A state whose keys expire (``expire_after_txids``, ``expire_after``)
depends on how the records were batched into txids: it is recomputed txid by txid, from the
ranges each txid's history entry kept, with the expiry that txid's commit applied after each
(recorded in the entry: a rule a deploy added, changed or dropped since is not applied to the
txids before it) - or listed as unaudited once the history no longer holds every committed
txid (it keeps the last 1000).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from tridentflow.aggregators import absent_value, apply_staged
from tridentflow.engines.base import ComputeResult
from tridentflow.engines.local import LocalEngine
from tridentflow.errors import PartitionUnavailableError, SourceError
from tridentflow.plan import compile_pipeline
from tridentflow.steps.recorded_settings import STATES
from tridentflow.steps.runtime import Runtime
from tridentflow_state.batch_times import THIN_MS, ExpiryRule, horizon_by_time
from tridentflow_state.ledger import HISTORY_LENGTH
from tridentflow_state.maps import REMOVE, StoredValue


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass
class AuditReport:
    committed_txid: int
    records: int = 0
    keys: int = 0
    lost: int | float = 0
    doubled: int | float = 0
    mismatched: list[tuple[str, str, Any, Any]] = field(default_factory=list)
    unaudited: list[str] = field(default_factory=list)
    unreadable: dict[int, str] = field(default_factory=dict)
    """Partitions holding committed records that cannot be read now: nothing was compared."""

    @property
    def ok(self) -> bool:
        return self.lost == 0 and self.doubled == 0 and not self.mismatched and not self.unreadable

    def line(self) -> str:
        if self.unreadable:
            where = "; ".join(f"partition {p} {r}" for p, r in sorted(self.unreadable.items()))
            return f"cannot audit: {where}; lost/doubled unknown until it is readable"
        text = f"lost={self.lost} doubled={self.doubled}"
        if self.mismatched:
            text += f" mismatched={len(self.mismatched)}"
        if self.unaudited:
            text += f" unaudited={','.join(self.unaudited)}"
        return text


def audit(rt: Runtime) -> AuditReport:
    """Recompute every auditable state from the source and compare (see the module doc)."""
    committed = rt.ledger.committed_txid()
    offsets = rt.ledger.committed_offsets()
    base = rt.ledger.base_offsets()  # where this generation started reading (a reset reader)
    report = AuditReport(committed)
    report.unreadable = _unreadable(rt, offsets, base)
    if report.unreadable:
        report.unaudited = list(rt.pipeline.states)
        return report
    ranges = {p: (base.get(p, 0), end) for p, end in offsets.items()}
    auditable = [n for n, p in rt.pipeline.states.items() if p.batch_invariant]
    plan = compile_pipeline(rt.pipeline, auditable)  # no batch operations, no state queries
    result = LocalEngine().compute(plan, str(rt.log.root), ranges) if ranges else None
    report.records = sum(c.n for c in result.counts.values()) if result else 0
    entries = {e["txid"]: e for e in rt.ledger.history(HISTORY_LENGTH)}  # read once
    since = first_txids(rt)
    by_txid = expected_txid_by_txid(rt, committed, entries, since)
    for name, persist in rt.pipeline.states.items():
        expected = None
        if by_txid is not None and name in by_txid:  # expiring now, or at a txid recorded
            expected = by_txid[name]
        elif persist.batch_invariant:
            first = since.get(name, 1)
            expected = _recounted_whole(rt, name, first, committed, offsets, result, entries)
        if expected is None:
            report.unaudited.append(name)
            continue
        actual = _stored(rt, name, committed)
        _compare(report, name, absent_value(persist.aggregator), expected, actual)
    return report


def first_txids(rt: Runtime) -> dict[str, int]:
    """State -> the txid it was first committed in, as the ledger's settings recorded it (a
    state a deploy added starts empty there: tridentflow.steps.recorded_settings); a state
    without a record, from txid 1."""
    shapes = json.loads(rt.ledger.settings().get(STATES, "{}"))
    return {name: int(shape.get("since") or 1) for name, shape in shapes.items()}


def _recounted_whole(
    rt: Runtime,
    name: str,
    first: int,
    committed: int,
    offsets: dict[int, int],
    result: ComputeResult | None,
    entries: dict[int, dict[str, Any]],
) -> dict[str, Any] | None:
    """Batch-invariant state ``name`` recomputed as one batch (encoded key -> value): from the
    whole source (``result``), or - a state first committed at txid ``first`` > 1 - over what
    the txids ``first``..``committed`` read (their ``entries``' ranges: each partition
    from where the first of them that read it started; a partition a txid skipped, dark, is
    read from where a later one started). None when the history no longer holds them all."""
    if first <= 1:
        staged = result.partials[name] if result else []
    else:
        since = [entries.get(t, {}).get("ranges") for t in range(first, committed + 1)]
        if any(r is None for r in since):
            return None
        starts: dict[int, int] = {}  # where the txids since ``first`` read from, each partition
        for taken in since:
            for p, (start, end) in taken.items():
                if end > start:
                    starts[int(p)] = min(starts.get(int(p), start), start)
        ranges = {p: (starts[p], end) for p, end in offsets.items() if p in starts}
        plan = compile_pipeline(rt.pipeline, [name])
        found = LocalEngine().compute(plan, str(rt.log.root), ranges) if ranges else None
        staged = found.partials[name] if found else []
    aggregator = rt.pipeline.states[name].aggregator
    expected = {key: apply_staged(aggregator, None, v) for key, v in staged}
    return {k: v for k, v in expected.items() if v is not REMOVE}  # removed: absent


def _unreadable(rt: Runtime, offsets: dict[int, int], base: dict[int, int]) -> dict[int, str]:
    """Partitions holding committed records that cannot be read now -> why."""
    unreadable: dict[int, str] = {}
    scan = rt.log.scan(offsets) if rt.log.exists() else None
    for partition, end in sorted(offsets.items()):
        if end <= base.get(partition, 0):
            continue
        if scan is None or partition in scan.unavailable:
            unreadable[partition] = (
                scan.unavailable[partition] if scan else "unavailable: the source log is missing"
            )
        elif scan.heads[partition] < end:
            unreadable[partition] = (
                f"unavailable: its head {scan.heads[partition]} is behind the committed offset "
                f"{end}"
            )
        else:
            try:  # everything from the start still there (a trimmed stream is not)
                rt.log.probe(partition, base.get(partition, 0), end)
            except PartitionUnavailableError as exc:
                unreadable[partition] = exc.reason
            except SourceError as exc:  # gone for good (retention, rows deleted): say what
                unreadable[partition] = f"cannot be read: {exc}"
    return unreadable


def _stored(rt: Runtime, name: str, committed: int) -> dict[str, Any]:
    """State ``name``'s values as of txid ``committed``, by encoded key (absent and removed
    keys left out)."""
    actual: dict[str, Any] = {}
    for key, raw in rt.backing(name).scan_items():
        value = StoredValue.from_json(raw, key, name).committed_view(committed)
        if value is not None:
            actual[key] = value
    return actual


def _compare(
    report: AuditReport, name: str, zero: Any, expected: dict[str, Any], actual: dict[str, Any]
) -> None:
    """Add state ``name``'s differences to ``report``: numbers as lost/doubled, anything else
    as mismatched (``zero``: what an absent key reads as)."""
    for key in expected.keys() | actual.keys():
        report.keys += 1
        exp, act = expected.get(key), actual.get(key)
        if exp == act and type(exp) is type(act):
            continue
        exp_n = zero if exp is None else exp
        act_n = zero if act is None else act
        if _number(exp_n) and _number(act_n):
            if exp_n > act_n:
                report.lost += exp_n - act_n
            elif act_n > exp_n:
                report.doubled += act_n - exp_n
            elif type(exp_n) is not type(act_n):
                report.mismatched.append((name, key, exp, act))
        else:
            report.mismatched.append((name, key, exp, act))


def expected_txid_by_txid(
    rt: Runtime,
    committed: int,
    entries: dict[int, dict[str, Any]],
    since: dict[str, int] | None = None,
) -> dict[str, dict[str, Any]] | None:
    """The states whose keys expire - now, or at a txid the history ``entries`` recorded - as
    they should be, recomputed txid by txid (state -> key -> value): each committed txid's
    records - the ranges its history entry kept - applied, then the expiry that txid's commit
    applied (``since``: first_txids, read if not given). None when there is no such state to
    recount, or the history no longer holds every committed txid."""
    if committed == 0:
        return None
    recorded = {name for e in entries.values() for name in e.get("expiry") or {}}
    names = [n for n, p in rt.pipeline.states.items()
             if p.recountable and (p.state.expiry is not None or n in recorded)]  # fmt: skip
    if not names:
        return None
    recounts = recount_txid_by_txid(rt, names, entries, committed, since)
    return next((values for txid, values in recounts if txid == committed), None)


def recount_txid_by_txid(
    rt: Runtime,
    names: list[str],
    entries: dict[int, dict[str, Any]],
    through: int,
    since: dict[str, int] | None = None,
) -> Iterator[tuple[int, dict[str, dict[str, Any]]]]:
    """States ``names`` (recountable) as they should be right after each txid 1..``through``
    (state -> encoded key -> value; the same dicts, updated in place), recomputed from the
    ranges the history ``entries`` (txid -> entry) kept, each state's expiry rule applied
    after each txid as that txid's commit applied it (``applied_horizon``), a state a deploy
    added only from its first txid (``since``: first_txids, read if not given). Yields nothing
    if ``entries`` lack one of those txids."""
    if any("ranges" not in entries.get(t, {}) for t in range(1, through + 1)):
        return
    plan = compile_pipeline(rt.pipeline, names)
    values: dict[str, dict[str, Any]] = {name: {} for name in names}
    last: dict[str, dict[str, int]] = {name: {} for name in names}
    times: dict[int, int] = {}  # txid -> its batch time, for the txids that had one
    thinned_below = 0  # the claims so far may have thinned the batch times of txids below it
    since = first_txids(rt) if since is None else since
    for txid in range(1, through + 1):
        at = entries[txid].get("at_ms")
        ranges = {int(p): (start, end) for p, (start, end) in entries[txid]["ranges"].items()}
        ranges = {p: r for p, r in ranges.items() if r[1] > r[0]}
        result = LocalEngine().compute(plan, str(rt.log.root), ranges) if ranges else None
        for name in names:
            persist, state, stamps = rt.pipeline.states[name], values[name], last[name]
            touched = set()
            if txid < since.get(name, 1):  # a state a deploy added: empty until then
                continue
            for key, partial in result.partials[name] if result else ():
                touched.add(key)
                value = apply_staged(persist.aggregator, state.get(key), partial)
                if value is REMOVE:
                    state.pop(key, None)
                    stamps.pop(key, None)
                else:
                    state[key], stamps[key] = value, txid
            rule = persist.state.expiry
            due = applied_horizon(entries[txid], name, rule, times, at, thinned_below)
            if due is None:
                continue
            for key in [k for k, t in stamps.items() if t <= due and k not in touched]:
                del state[key], stamps[key]
        thinned_below = max(thinned_below, thinned_by(entries[txid], times, at))
        if at is not None:
            times[txid] = at
        yield txid, values


def applied_horizon(
    entry: dict[str, Any],
    name: str,
    rule: ExpiryRule | None,
    times: dict[int, int],
    at: int | None,
    thinned_below: int = 0,
) -> int | None:
    """The horizon the commit of ``entry``'s txid should have applied to state ``name`` (None:
    nothing expires), judged by the rule its history entry recorded - the rule of the code that
    committed it, so a rule added, changed or dropped since is not applied to the txids before
    it; a state the entry does not name had none then - over the batch times the entries kept
    (``times``: txid -> ms). The commit's own horizon stands where it is that one, or, where
    the claims before may have thinned the times of the txids below ``thinned_below``, earlier
    by no more than the thinning's slack (an hour of batch time); any other is replaced by the
    rule's, so the recount differs where the commit did. An entry written before commits
    recorded their rules: today's ``rule``."""
    txid, recorded = entry["txid"], entry.get("expiry")
    if recorded is None:
        return None if rule is None else rule.horizon_among(times, txid, at)
    if name not in recorded:
        return None
    after_txids, after_ms, applied = recorded[name]
    if applied is None:  # the txid that built the state's index: nothing expired
        return None
    due = ExpiryRule(after_txids, after_ms).horizon_among(times, txid, at)
    if applied == due or (due < thinned_below and within_thinning(times, applied, due)):
        return applied
    return due


def thinned_by(entry: dict[str, Any], times: dict[int, int], at: int | None) -> int:
    """The txid below which the claim of ``entry``'s txid may have thinned the batch times
    (as far as the longest period of the rules it recorded reaches back from its own time,
    as with no undo logs: the most a claim thins; 0: none)."""
    periods = [r[1] for r in (entry.get("expiry") or {}).values() if r[1] is not None]
    if at is None or not periods:
        return 0
    return horizon_by_time(times, entry["txid"], at, max(periods))


def within_thinning(times: dict[int, int], applied: int, due: int) -> bool:
    """Whether horizon ``applied`` is ``due`` as thinned batch times can answer it: earlier,
    every txid in between in ``due``'s hour of batch time (tridentflow_state.batch_times)."""
    if not 0 <= applied < due or due not in times:
        return False
    hour = times[due] // THIN_MS
    return all(t in times and times[t] // THIN_MS == hour for t in range(applied + 1, due))
