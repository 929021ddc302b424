"""The paused-Redis family (``run_chaos(paused=True)``): Redis stopped (SIGSTOP) in the middle
of a step for longer than the runs' leases and the clients' socket timeout, then continued
(SIGCONT) - what a stop-the-world pause, a VM migration or a saturated host does to it.

While it is stopped, a step's command times out (redis-py raises; tridentflow's client does
not send it again: tridentflow.redisconn.NO_RESEND) yet stays in Redis's socket buffer: when
Redis goes on it runs it anyway - a write its client reported failed lands late (Jepsen's
indeterminate write), and what other connections queued meanwhile (the step's cleanup after
the failure, another process's steps) runs in any order with it. Its clock has moved past
every lease. Two ways in:

* **at a fault point** (a ``pause`` fault: ``after-coordinate``, ``in-emit``, ``mid-commit``,
  ``before-ledger``, ``after-mark``, ``mid-export``): Redis stops there and the step goes on,
  so the command right after the point is the one sent again;
* **mid-step, raced** (``Chaos._maybe_paused``): Redis stops a few ms into a step; half of the
  time an *adopter* - another run, as Airflow's next run - binds the txid the paused step
  holds and runs it to the end once Redis goes on, while the stale holder carries on.

Neither may double or lose a record. And a third, the other side of a pause:

* **a stalled holder** (a ``stall`` fault at ``after-coordinate``, ``in-emit``, ``mid-commit``
  or ``before-ledger``): the step itself stops there - its process paused by a long GC pause
  or a stopped VM - past its lease, while an adopter run binds its txid and commits it, and a
  next run commits the txid after it over the same keys; then the stale holder goes on, with
  the commit token, the staged attempt and the values it read before it stopped. Redis must
  refuse every write it still makes (Kleppmann's fencing-token case): none may land. Now and
  then it goes on into a paused Redis, and its run's retries are spent: what it staged must go
  with its failure.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress

from tridentflow.faults import Fault

PAUSE_CHANCE = 0.15
"""The chance that a step of a paused-family schedule runs through a mid-step pause."""

POINT_PAUSE_CHANCE = 0.3
"""The chance that a txid of a paused-family schedule gets a pause at a fault point."""

PAUSE_POINTS = ("after-coordinate", "in-emit", "mid-commit", "before-ledger", "after-mark",
                "mid-export")  # fmt: skip
"""Where a ``pause`` fault may stop Redis."""

STALL_CHANCE = 0.2
"""The chance that a txid of a paused-family schedule stalls its holder at a fault point."""

STALL_POINTS = ("after-coordinate", "in-emit", "mid-commit", "before-ledger")
"""Where a ``stall`` fault may stop a step (each before its txid is marked committed)."""

STALL_ADOPTERS = 3
"""Runs that commit while a holder is stalled: its txid T, then T+1 and T+2."""

STALL_INTO_PAUSE_CHANCE = 0.5
"""The chance that a stalled holder goes on into a paused Redis: its next command (after
``in-emit``, the record of its staged attempt) goes unanswered - with its run's retries spent
now and then (``Schedule.retries_spent``), nothing but the failed step itself can delete what
it staged for the committed txid (the every-family soak's seed 8421)."""

PAUSE_S = 1.5
"""How long Redis stays stopped: past PAUSED_LEASE_MS and several socket timeouts."""

PAUSED_LEASE_MS = 1_000
"""The runs' leases in the family (60 s elsewhere): a pause outlasts them."""

PAUSED_SOCKET_TIMEOUT_S = 0.3
"""The clients' socket timeout in the family (60 s by default): a pause outlasts it."""


class Pauser:
    """Stops the process ``pid()`` names for PAUSE_S, in a thread of its own; ``wait`` until
    every pause it started is over (Redis never stays stopped)."""

    def __init__(self, pid: Callable[[], int]) -> None:
        self.pid = pid
        self._threads: list[threading.Thread] = []
        self.resumed_ms: list[int] = []
        """When each pause ended (this host's clock, ms: Redis's, on loopback) - taken by
        ``recoveries``."""

    def pause(self, delay: float = 0.0) -> threading.Event:
        """Stop it ``delay`` seconds from now (0: before this returns, so the caller's next
        command finds it stopped), for PAUSE_S; the event is set once it goes on."""
        pid, resumed = self.pid(), threading.Event()
        if delay <= 0:
            os.kill(pid, signal.SIGSTOP)

        def run() -> None:
            try:
                if delay > 0:
                    time.sleep(delay)
                    os.kill(pid, signal.SIGSTOP)
                time.sleep(PAUSE_S)
            except ProcessLookupError:  # killed meanwhile (a restart): nothing to continue
                pass
            finally:
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
                self.resumed_ms.append(int(time.time() * 1000))
                resumed.set()

        thread = threading.Thread(target=run, name="tf-chaos-pause", daemon=True)
        thread.start()
        self._threads.append(thread)
        return resumed

    def wait(self) -> None:
        while self._threads:
            self._threads.pop().join()

    def recoveries(self, committed_ms: list[int]) -> list[int]:
        """For each pause ended since the last call: ms from its end to the next commit
        (``committed_ms``: the commits' times, from the ledger's history) - the recovery
        without a human; a pause no commit followed is left out. Forgets those pauses."""
        ends, self.resumed_ms = self.resumed_ms, []
        return recoveries(ends, committed_ms)


def recoveries(ends_ms: list[int], committed_ms: list[int]) -> list[int]:
    """For each fault that ended at ``ends_ms`` (ms): ms from its end to the first commit at
    or after it (``committed_ms``: the commits' times, from the ledger's history) - the
    recovery without a human; a fault no commit followed is left out."""
    after = sorted(committed_ms)
    return [
        next(c for c in after if c >= end) - end for end in ends_ms if after and after[-1] >= end
    ]


@contextmanager
def paused_redis(pauser: Pauser, rng: random.Random) -> Iterator[threading.Event]:
    """Within the block: Redis stopped after a few ms drawn from ``rng``, for PAUSE_S. Yields
    an event set once it goes on; on leaving, waits for that."""
    resumed = pauser.pause(rng.uniform(0, 0.04))
    try:
        yield resumed
    finally:
        resumed.wait()


def point_pauses(rng: random.Random, runs: int, events: list[str]) -> tuple[Fault, ...]:
    """``pause`` faults for txids 1..``runs`` (POINT_PAUSE_CHANCE each, at a point of
    PAUSE_POINTS, the first attempt), noted in ``events``."""
    faults = []
    for txid in range(1, runs + 1):
        if rng.random() < POINT_PAUSE_CHANCE:
            fault = Fault(rng.choice(PAUSE_POINTS), txid, 1, "pause")
            faults.append(fault)
            events.append(str(fault))
    return tuple(faults)


def point_stalls(
    rng: random.Random, runs: int, events: list[str], taken: tuple[Fault, ...]
) -> tuple[Fault, ...]:
    """``stall`` faults for txids 1..``runs`` (STALL_CHANCE each, at a point of STALL_POINTS,
    the first attempt, where ``taken`` has no fault), noted in ``events``."""
    busy = {(f.point, f.txid, f.attempt) for f in taken}
    faults = []
    for txid in range(1, runs + 1):
        if rng.random() < STALL_CHANCE:
            fault = Fault(rng.choice(STALL_POINTS), txid, 1, "stall")
            if (fault.point, fault.txid, fault.attempt) not in busy:
                faults.append(fault)
                events.append(str(fault))
    return tuple(faults)


def adopter(resumed: threading.Event, run: Callable[[], None]) -> threading.Thread:
    """A thread that runs ``run`` (another run's steps) once Redis goes on."""

    def go() -> None:
        resumed.wait()
        run()

    thread = threading.Thread(target=go, name="tf-chaos-adopter", daemon=True)
    thread.start()
    return thread
