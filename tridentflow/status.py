"""Status of a pipeline: ledger position, pending txids, source lag per partition."""

from __future__ import annotations

import json
from typing import Any

from tridentflow.runtime import Runtime


def status(rt: Runtime) -> dict[str, Any]:
    ledger = rt.ledger
    committed = ledger.committed_txid()
    offsets = ledger.committed_offsets()
    heads = rt.log.heads() if rt.log.exists() else {}
    pending = []
    for txid in ledger.pending_txids():
        info = ledger.tx_info(txid)
        pending.append(
            {
                "txid": txid,
                "owner": info.get("owner"),
                "coordinate_attempts": int(info.get("coordinate_attempts", 0)),
                "emit_attempts": int(info.get("emit_attempts", 0)),
                "staged_attempt": int(info["staged_attempt"]) if "staged_attempt" in info else None,
                "commit_attempts": int(info.get("commit_token", 0)),
            }
        )
    last = ledger.tx_info(committed) if committed else {}
    partitions = [
        {
            "partition": p,
            "committed": offsets.get(p, 0),
            "head": heads.get(p, 0),
            "lag": heads.get(p, 0) - offsets.get(p, 0),
        }
        for p in sorted(set(heads) | set(offsets))
    ]
    return {
        "pipeline": rt.pipeline.name,
        "guarantee": rt.pipeline.guarantee.value,
        "source_mode": rt.pipeline.source.mode.value,
        "states": {
            name: {"kind": p.state.kind.value, "keys": rt.backing(name).count()}
            for name, p in rt.pipeline.states.items()
        },
        "committed_txid": committed,
        "last_commit": json.loads(last["stats"]) if "stats" in last else None,
        "pending": pending,
        "quarantined": ledger.quarantined(),
        "partitions": partitions,
        "lag": sum(p["lag"] for p in partitions),
    }


def format_status(info: dict[str, Any]) -> str:
    lines = [
        f"pipeline       {info['pipeline']}  ({info['source_mode']} source, "
        f"{info['guarantee'].upper()})",
        f"committed txid {info['committed_txid']}",
    ]
    for name, s in info["states"].items():
        lines.append(f"state          {name}: {s['kind']}, {s['keys']} keys")
    if info["pending"]:
        for p in info["pending"]:
            lines.append(
                f"pending txid   {p['txid']}: coordinate x{p['coordinate_attempts']}, emit "
                f"x{p['emit_attempts']} (staged: {p['staged_attempt']}), commit "
                f"x{p['commit_attempts']}, owner {p['owner']}"
            )
    else:
        lines.append("pending txid   none")
    lines.append(f"quarantined    {info['quarantined']} bad records")
    lines.append("partition  committed       head        lag")
    for p in info["partitions"]:
        lines.append(f"{p['partition']:>9}  {p['committed']:>9}  {p['head']:>9}  {p['lag']:>9}")
    lines.append(f"total lag      {info['lag']}")
    return "\n".join(lines)
