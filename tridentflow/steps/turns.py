"""Taking turns: a step of a txid waits for the txid before it (Trident: a batch that finished
processing early waits for its turn to commit). One waiting loop for every step that waits."""

from __future__ import annotations

import time
from collections.abc import Callable

from tridentflow.steps.runtime import Runtime

RunState = Callable[[str], "str | None"]
"""The orchestrator's state of a run id ("queued", "running", "success", "failed"), None if
it cannot tell (the run is unknown, or the orchestrator cannot be asked)."""

TURN_WAIT_S = 300.0
"""How long an Airflow task of a txid waits in its try for the txid before it (see the module
doc) before it fails and is retried."""
TURN_POLL_S = 0.2
TURN_ASK_S = 2.0
"""How often a waiting step asks the orchestrator again whether the run it waits for runs
(Redis is read every TURN_POLL_S)."""


def wait_turn(
    rt: Runtime,
    ready: Callable[[], bool],
    awaited: Callable[[], int] | None = None,
    run_state: RunState | None = None,
    timeout: float = TURN_WAIT_S,
) -> bool:
    """Wait until ``ready()``, while the run holding the txid ``awaited()`` names is live:
    running (``run_state``) or, if the orchestrator cannot tell, within its lease (with no
    ``awaited``: whoever works on it). True once ready; False when no live run holds it or
    ``timeout`` passed (the caller's own check then says why, in one line). Reads only."""
    deadline = time.monotonic() + timeout
    asked: tuple[str, float, str | None] | None = None  # (owner, when, its state)
    while not ready():
        now = time.monotonic()
        if now >= deadline:
            return False
        if awaited is None:
            time.sleep(TURN_POLL_S)
            continue
        info = rt.ledger.tx_info(awaited())
        owner = info.get("owner")
        if not owner:
            return False
        if asked is None or asked[0] != owner or now - asked[1] >= TURN_ASK_S:
            asked = (owner, now, run_state(owner) if run_state is not None else None)
        state = asked[2]
        if state is None:
            if int(info.get("lease_until") or 0) <= rt.redis_now_ms():
                return False
        elif state != "running":
            return False
        time.sleep(TURN_POLL_S)
    return True
