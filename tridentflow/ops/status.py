"""Status of a pipeline: ledger position, pending txids, source lag per partition."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from tridentflow.sources.base import NamesWaiting, Remembers
from tridentflow.steps.export import sink_status
from tridentflow.steps.recorded_settings import STATES
from tridentflow.steps.recorded_settings import disagreements as settings_disagreements
from tridentflow.steps.runtime import Runtime
from tridentflow_state.reshard import plan_under_way
from tridentflow_state.rewind import rewinding_to
from tridentflow_state.undo import retained

HISTORY_SHOWN = 20


def status(rt: Runtime, shown: int = HISTORY_SHOWN) -> dict[str, Any]:
    """The pipeline's status (reads only), with its last ``shown`` commits; the newest of
    them name what they took, where the log names its offsets."""
    ledger = rt.ledger
    committed = ledger.committed_txid()
    offsets = ledger.committed_offsets()
    scan = rt.log.scan(offsets) if rt.log.exists() else None
    heads = scan.heads if scan else {}
    unavailable = scan.unavailable if scan else {}
    now_ms = rt.redis_now_ms()
    pending = [pending_txid(rt, txid, now_ms) for txid in ledger.pending_txids()]
    history = ledger.history(shown)
    _name_what_they_took(rt, history)
    recorded = ledger.settings()
    shapes = json.loads(recorded.get(STATES, "{}"))
    partitions = _partitions(heads, offsets, unavailable)
    return {
        "pipeline": rt.pipeline.name,
        "guarantee": rt.pipeline.guarantee.value,
        "source_mode": rt.pipeline.source.mode.value,
        "states": {name: _state_status(rt, name, history, shapes) for name in rt.pipeline.states},
        "kept_states": sorted(set(shapes) - set(rt.pipeline.states)),
        "committed_txid": committed,
        "last_commit": history[0] if history else None,
        "history": history,
        "pending": pending,
        "quarantined": ledger.quarantined(),
        "partitions": partitions,
        "lag": sum(p["lag"] for p in partitions if p["lag"] is not None),
        "lag_unit": rt.log.offset_unit() if isinstance(rt.log, NamesWaiting) else "records",
        "waiting": rt.log.waiting(offsets) if isinstance(rt.log, NamesWaiting) else [],
        "remembered": rt.log.remembered() if isinstance(rt.log, Remembers) else None,
        "unavailable_partitions": [p["partition"] for p in partitions if p["unavailable"]],
        "sinks": sink_status(rt),
        "rewindable": rewindable(rt),
        "retain_txids": rt.retain_txids,
        "shards": rt.keyspace.shards,
        "resharding": _resharding(rt),
        "rewinding": rewinding_to(rt.client, rt.keyspace),
        "rewinds": ledger.rewinds(5),
        "settings": {
            "recorded": recorded,
            "disagreements": settings_disagreements(rt, recorded),
        },
    }


TOOK_SHOWN = 5
"""The newest commits whose files (versions, snapshots) ``status`` names."""
TOOK_NAMES = 10
"""Names per commit at most (the rest counted)."""


def _name_what_they_took(rt: Runtime, entries: list[dict[str, Any]]) -> None:
    """The newest TOOK_SHOWN history entries' ``took``: what their ranges held, named by a log
    that names its offsets (a FileSource's files, a table's versions; ``NamesWaiting``), at
    most TOOK_NAMES, and ``took_more``: the offsets not named. Other logs: nothing added."""
    log = rt.log
    if not isinstance(log, NamesWaiting):
        return
    for entry in entries[:TOOK_SHOWN]:
        ranges = sorted(
            (int(p), int(r[0]), int(r[1])) for p, r in (entry.get("ranges") or {}).items()
        )
        names: list[str] = []
        for partition, start, end in ranges:
            if len(names) < TOOK_NAMES and end > start:
                names += log.names(partition, start, end, TOOK_NAMES - len(names))
        entry["took"] = names
        entry["took_more"] = max(0, sum(end - start for _, start, end in ranges) - len(names))


def _resharding(rt: Runtime) -> dict[str, Any] | None:
    """A reshard under way (``tridentflow reshard``): from and to how many shards, and its
    phase; None if none is."""
    plan = plan_under_way(rt.client, rt.keyspace)
    if plan is None:
        return None
    return {"from": plan.from_shards, "to": plan.to_shards, "phase": plan.phase}


def rewindable(rt: Runtime) -> dict[str, Any] | None:
    """What the undo logs retain: ``{oldest, newest, retain_txids}`` (state can be read as of,
    and rewound to, any txid in between), None if nothing is kept."""
    kept = retained(rt.client, rt.keyspace)
    if kept is None:
        return None
    return {"oldest": kept.oldest, "newest": kept.newest, "retain_txids": rt.retain_txids}


def _clock(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000))


def step_seconds(info: dict[str, Any]) -> float | None:
    """How long a step took: the sum of its orchestrator task's tries (each try's start to its
    end, as Airflow's try durations) where recorded, else the step's own span (first attempt
    to last end); never negative."""
    if info.get("task_ms") is not None:
        return max(0.0, info["task_ms"] / 1000)
    if info.get("started_ms") and info.get("ended_ms"):
        return max(0.0, (info["ended_ms"] - info["started_ms"]) / 1000)
    return None


def step_tries(info: dict[str, Any]) -> int:
    """A step's tries as the orchestrator counts them (Airflow's try number), else its
    attempts as the ledger counted them."""
    return int(info.get("tries") or info.get("attempts") or 0)


def describe_commit(entry: dict[str, Any], unit: str = "records") -> str:
    """One line of a history entry: txid, run, sizes, skipped partitions, step durations.
    ``unit``: what the source's offsets are (a FileSource's count is of files)."""
    steps = entry.get("steps", {})
    timing = []
    for step in ("coordinate", "emit", "commit"):
        info = steps.get(step, {})
        seconds = step_seconds(info)
        if seconds is not None:
            timing.append(f"{step} {seconds:.1f}s x{step_tries(info)}")
    skipped = f", skipped {entry['skipped']}" if entry.get("skipped") else ""
    return (
        f"txid {entry['txid']} by {entry.get('run_id') or '?'}: {entry.get('records', 0)} "
        f"{unit}, {entry.get('keys', 0)} keys{skipped}; " + ", ".join(timing)
    )


def pending_txid(rt: Runtime, txid: int, now_ms: int | None = None) -> dict[str, Any]:
    """A pending txid's owner run (None once its claim was released or expired: the next
    run adopts it), lease and attempts per step."""
    now_ms = rt.redis_now_ms() if now_ms is None else now_ms
    info = rt.ledger.tx_info(txid)
    lease_until = int(info.get("lease_until", 0) or 0)
    live = "owner" in info and lease_until > now_ms
    return {
        "txid": txid,
        "owner": info.get("owner") if live else None,
        "lease_expires_in_s": round((lease_until - now_ms) / 1000, 1) if live else None,
        "coordinate_attempts": int(info.get("coordinate_attempts", 0)),
        "emit_attempts": int(info.get("emit_attempts", 0)),
        "staged_attempt": int(info["staged_attempt"]) if "staged_attempt" in info else None,
        "commit_attempts": int(info.get("commit_token", 0)),
    }


def _state_status(
    rt: Runtime, name: str, history: list[dict[str, Any]], shapes: dict[str, Any]
) -> dict[str, Any]:
    """A state's kind, keys and the txid it was first committed in (``since``, from the
    recorded shapes; None: unknown, or not yet); for an expiring one, its rule
    (``expire_after_txids``, ``expire_after_seconds``: the ones set) and the keys expired by
    each commit of ``history`` (newest first)."""
    spec = rt.pipeline.states[name].state
    info: dict[str, Any] = {"kind": spec.kind.value, "keys": rt.backing(name).count()}
    info["since"] = shapes.get(name, {}).get("since")
    if spec.expiry is not None:
        if spec.expire_after_txids is not None:
            info["expire_after_txids"] = spec.expire_after_txids
        if spec.expire_after is not None:
            info["expire_after_seconds"] = spec.expire_after.total_seconds()
        info["expired_by_txid"] = {
            str(e["txid"]): (e.get("expired_by_state") or {}).get(name, 0) for e in history
        }
    return info


def _partitions(
    heads: dict[int, int], offsets: dict[int, int], unavailable: dict[int, str]
) -> list[dict[str, Any]]:
    """Each partition's committed offset, head and lag, or why it cannot be read."""
    partitions = []
    for p in sorted(set(heads) | set(offsets) | set(unavailable)):
        if p in heads:
            lag = heads[p] - offsets.get(p, 0)
            entry = {"partition": p, "committed": offsets.get(p, 0), "head": heads[p]}
            if lag < 0:  # the partition's head is behind what was committed from it
                entry.update(
                    lag=None,
                    unavailable=f"head {heads[p]} is behind the committed"
                    f" offset {offsets.get(p, 0)} (restored from an older copy?)",
                )
            else:
                entry.update(lag=lag, unavailable=None)
        else:
            entry = {
                "partition": p,
                "committed": offsets.get(p, 0),
                "head": None,
                "lag": None,
                "unavailable": unavailable.get(p, "missing from the source log"),
            }
        partitions.append(entry)
    return partitions


def format_status(info: dict[str, Any]) -> str:
    """``status``'s answer as the CLI prints it."""
    lines = [
        f"pipeline       {info['pipeline']}  ({info['source_mode']} source, "
        f"{info['guarantee'].upper()})",
        f"committed txid {info['committed_txid']}",
        f"state shards   {info['shards']}",
    ]
    moving = info.get("resharding")
    if moving:
        lines.append(
            f"resharding     from {moving['from']} to {moving['to']} shards ({moving['phase']}):"
            " commits wait; run the same `tridentflow reshard` to finish it"
        )
    lines += _state_lines(info)
    lines += _pending_lines(info)
    lines.append(f"quarantined    {info['quarantined']} bad records")
    lines += _rewind_lines(info)
    lines += _sink_lines(info)
    for entry in info["history"][:5]:
        unit = info.get("lag_unit", "records")
        lines.append(f"committed      {describe_commit(entry, unit)}")
        if entry.get("took"):
            more = f" (+{entry['took_more']} more)" if entry.get("took_more") else ""
            lines.append(f"  took: {', '.join(entry['took'])}{more}")
    lines += _partition_lines(info)
    return "\n".join(lines)


def _state_lines(info: dict[str, Any]) -> list[str]:
    lines = []
    for name, s in info["states"].items():
        line = f"state          {name}: {s['kind']}, {s['keys']} keys"
        if s.get("since") is not None:
            line += f", since txid {s['since']}"
        if "expired_by_txid" in s:
            rules = []
            if "expire_after_txids" in s:
                rules.append(f"{s['expire_after_txids']} txids")
            if "expire_after_seconds" in s:
                rules.append(f"{timedelta(seconds=s['expire_after_seconds'])} of batch time")
            expired = ", ".join(f"{t}: {n}" for t, n in list(s["expired_by_txid"].items())[:5])
            line += f"; expire after {' or '.join(rules)} (expired by txid {expired})"
        lines.append(line)
    for name in info.get("kept_states", []):
        lines.append(
            f"state          {name}: not in this code; its values are kept as they were "
            f"(a code that has it again goes on from them; `tridentflow evolve "
            f"{info['pipeline']} --drop-state {name}` deletes them, `--rename-state "
            f"{name}=NEW` moves them to the code's new name)"
        )
    return lines


def _pending_lines(info: dict[str, Any]) -> list[str]:
    if not info["pending"]:
        return ["pending txid   none"]
    return [
        f"pending txid   {p['txid']}: coordinate x{p['coordinate_attempts']}, emit "
        f"x{p['emit_attempts']} (staged: {p['staged_attempt']}), commit "
        f"x{p['commit_attempts']}, "
        + (
            f"owner {p['owner']} (lease {p['lease_expires_in_s']:.0f}s)"
            if p["owner"]
            else "no live owner (the next run adopts it)"
        )
        for p in info["pending"]
    ]


def _rewind_lines(info: dict[str, Any]) -> list[str]:
    """What can be rewound, the settings that disagree, a rewind under way, the last ones."""
    kept = info.get("rewindable")
    lines = [
        f"rewindable     txids {kept['oldest']}..{kept['newest']} (query --as-of, rewind --to)"
        if kept
        else f"rewindable     none (retain_txids is {info.get('retain_txids', 0)})"
    ]
    for line in info.get("settings", {}).get("disagreements", []):
        lines.append(f"SETTINGS       {line}")
    if info.get("rewinding") is not None:
        target = info["rewinding"]
        lines.append(
            f"REWINDING      to txid {target}, under way or cut short: no step runs until it "
            f"is done (finish it: tridentflow rewind {info['pipeline']} --to {target} --yes)"
        )
    for r in info.get("rewinds", [])[:3]:
        lines.append(
            f"rewound        to txid {r['to']} at {_clock(r['at_ms'])}: txids {r['to'] + 1}.."
            f"{r['last']} taken back ({r['committed'] - r['to']} committed)"
        )
    return lines


def _sink_lines(info: dict[str, Any]) -> list[str]:
    lines = []
    for sink in info.get("sinks", []):
        lines.append(
            f"sink           {sink['sink']} ({sink['state']} -> {sink['target']}): at txid "
            f"{sink['position']}, {sink['lag']} behind; {sink['change_logs']} change log(s) kept"
        )
        if sink.get("error"):
            lines.append(f"  FAILING      {sink['error']}")
        if sink.get("stamp"):  # how a reader of the table finds its txid
            lines.append(f"  stamp        {sink['stamp']}")
        versions = sink.get("table_versions") or {}
        if versions:  # time travel: the table version / snapshot of each retained txid
            shown = list(versions.items())[-5:]
            lines.append(
                "  versions     "
                + ", ".join(f"txid {t} = {v}" for t, v in shown)
                + (f" (and {len(versions) - 5} older)" if len(versions) > 5 else "")
            )
    return lines


def _partition_lines(info: dict[str, Any]) -> list[str]:
    lines = ["partition  committed       head        lag"]
    for p in info["partitions"]:
        if p["unavailable"]:
            head = "?" if p["head"] is None else p["head"]
            lines.append(
                f"{p['partition']:>9}  {p['committed']:>9}  {head:>9}          ?  "
                f"UNAVAILABLE: {p['unavailable']}"
            )
        else:
            lines.append(f"{p['partition']:>9}  {p['committed']:>9}  {p['head']:>9}  {p['lag']:>9}")
    unavailable = info["unavailable_partitions"]
    suffix = f" (not counting unavailable partitions {unavailable})" if unavailable else ""
    unit = info.get("lag_unit", "records")
    lines.append(f"total lag      {info['lag']}{'' if unit == 'records' else ' ' + unit}{suffix}")
    lines += [f"  waiting: {name}" for name in info.get("waiting", [])]
    held = info.get("remembered")
    if held:
        lines.append(_remembered_line(held))
    return lines


def _remembered_line(held: dict[str, int]) -> str:
    """What a FileSource remembers: files compared, manifest entries, and with forget_after
    its watermark and what the last listing left below it."""
    line = f"remembers      {held['taken']} files taken, {held['manifest']} manifest entries"
    if held["watermark_ms"] >= 0:
        mark = datetime.fromtimestamp(held["watermark_ms"] / 1000, UTC).isoformat(
            timespec="seconds"
        )
        line += (
            f"; {held['forgotten']} forgotten: files modified before {mark} are not taken "
            f"({held['below_watermark']} listed last time)"
        )
    return line


def replays_after_commit(rt: Runtime, txid: int, entry: dict[str, Any]) -> list[dict[str, Any]]:
    """The steps of a committed txid that were tried again after its commit (a clear in
    Airflow: each found the txid committed and changed nothing), from the orchestrator's tries
    the ledger keeps counting: [{step, tries_at_commit, tries_now, last_ended_ms}]."""
    info = rt.ledger.tx_info(txid)
    replays = []
    for step, at_commit in (entry.get("steps") or {}).items():
        then = int(at_commit.get("tries") or 0)
        now = int(info.get(f"{step}_tries") or 0)
        if then and now > then:
            ended = info.get(f"{step}_task_ended_ms")
            replays.append(
                {
                    "step": step,
                    "tries_at_commit": then,
                    "tries_now": now,
                    "last_ended_ms": int(ended) if ended else None,
                }
            )
    return replays
