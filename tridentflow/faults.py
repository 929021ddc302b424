"""Fault injection for tests and demos.

Syntax (``TRIDENTFLOW_FAULTS`` or ``--faults``), a comma-separated list of:

* ``POINT@TXID[#ATTEMPT][=raise|kill]`` - POINT is one of ``after-coordinate`` (metadata
  stored), ``in-emit`` (inside the emit job, half of the staged output written), ``mid-commit``
  (about half the keys written), ``before-ledger`` (all keys written, txid not yet marked
  committed), ``after-mark`` (txid marked committed, its staging not yet deleted),
  ``mid-export`` (a sink part-way through applying the txid: PostgreSQL inside its
  transaction, a stream after its first chunk). The fault fires only on that step's attempt
  ATTEMPT (default 1) of txid TXID, so resuming gets past it. ``raise`` (default) fails the
  step with InjectedFaultError; ``kill`` ends the process at once with SIGKILL (exit code 137).
  (The chaos harness also builds ``crash`` faults - SimulatedCrash -, ``pause`` ones -
  PAUSE_HOOK, its paused-Redis family - and ``stall`` ones - STALL_HOOK, the same family's
  stalled holder -, which no spec names.)
  ``lose-tuple`` is a data fault instead: in that emit attempt the first exchange between
  stages loses one tuple in transit, and the completeness check must fail the batch.
* ``dark:P@TXID`` or ``dark:P@FIRST-LAST`` - partition P is unreadable while those txids emit
  (every attempt).
"""

from __future__ import annotations

import os
import re
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from tridentflow.errors import FaultSpecError

POINTS = (
    "after-coordinate",
    "in-emit",
    "mid-commit",
    "before-ledger",
    "after-mark",
    "mid-export",
    "lose-tuple",
    "mid-rewind",
    "mid-reshard",
)
STEP_POINTS = tuple(p for p in POINTS if p not in ("mid-export", "mid-rewind", "mid-reshard"))
"""The points inside the run's steps (coordinate, emit, commit); ``mid-export`` is in the
export, which only a pipeline with sinks has, ``mid-rewind`` in a rewind (state.rewind: after
each chunk of restored keys; its txid is the one being rewound), ``mid-reshard`` in a
reshard (tridentflow.ops.reshard: its txid the next to commit, its attempt K the K-th point:
1 part-way through the copy, 2 copied, 3 switched, 4 part-way through the deletion)."""
ENV = "TRIDENTFLOW_FAULTS"

_FAULT = re.compile(
    r"^(?P<point>[a-z-]+)@(?P<txid>\d+)(?:#(?P<attempt>\d+))?(?:=(?P<action>raise|kill))?$"
)
_DARK = re.compile(r"^dark:(?P<partition>\d+)@(?P<first>\d+)(?:-(?P<last>\d+))?$")


class InjectedFaultError(RuntimeError):
    """Raised by a ``raise`` fault."""


PAUSE_HOOK: Callable[[], None] | None = None
"""What a ``pause`` fault calls (chaos harness only: its paused-Redis family stops Redis
there and lets the step go on into it); None: a ``pause`` fault does nothing."""

STALL_HOOK: Callable[[Fault], None] | None = None
"""What a ``stall`` fault calls, in the step's own thread (chaos harness only: the step stops
there - a process paused, as a long GC pause or a stopped VM stops it - until the hook returns,
past its lease, while other runs go on); None: a ``stall`` fault does nothing."""


class SimulatedCrash(BaseException):
    """Raised by a ``crash`` fault (chaos harness only): like ``kill``, nothing after the fault
    point runs - no ``except Exception`` handler sees it - but the process survives."""


@dataclass(frozen=True)
class Fault:
    point: str
    txid: int
    attempt: int = 1
    action: str = "raise"

    def __str__(self) -> str:
        return f"{self.point}@{self.txid}#{self.attempt}={self.action}"


@dataclass(frozen=True)
class Dark:
    partition: int
    first: int
    last: int


@dataclass(frozen=True)
class FaultPlan:
    faults: tuple[Fault, ...] = ()
    darks: tuple[Dark, ...] = field(default=())

    @classmethod
    def parse(cls, spec: str | None) -> FaultPlan:
        faults: list[Fault] = []
        darks: list[Dark] = []
        for raw in (spec or "").split(","):
            item = raw.strip()
            if not item:
                continue
            if m := _DARK.match(item):
                first = int(m["first"])
                last = int(m["last"]) if m["last"] else first
                if last < first:
                    raise FaultSpecError(f"fault {item!r}: txid range {first}-{last} is empty")
                darks.append(Dark(int(m["partition"]), first, last))
                continue
            m = _FAULT.match(item)
            if not m:
                raise FaultSpecError(
                    f"fault {item!r} is not POINT@TXID[#ATTEMPT][=raise|kill] or dark:P@TXID"
                )
            if m["point"] not in POINTS:
                raise FaultSpecError(
                    f"fault {item!r}: unknown point {m['point']!r}; expected one of "
                    + ", ".join(POINTS)
                )
            txid, attempt = int(m["txid"]), int(m["attempt"] or 1)
            if txid < 1 or attempt < 1:
                raise FaultSpecError(f"fault {item!r}: txid and attempt start at 1")
            faults.append(Fault(m["point"], txid, attempt, m["action"] or "raise"))
        return cls(tuple(faults), tuple(darks))

    @classmethod
    def from_env(cls, extra: str | None = None) -> FaultPlan:
        return cls.parse(",".join(s for s in (os.environ.get(ENV), extra) if s))

    def __str__(self) -> str:
        parts = [str(f) for f in self.faults]
        parts += [f"dark:{d.partition}@{d.first}-{d.last}" for d in self.darks]
        return ",".join(parts)

    def armed(self, point: str, txid: int, attempt: int) -> Fault | None:
        for fault in self.faults:
            if (fault.point, fault.txid, fault.attempt) == (point, txid, attempt):
                return fault
        return None

    def fire(self, point: str, txid: int, attempt: int) -> None:
        """Fail here if a fault is armed for (point, txid, attempt)."""
        fault = self.armed(point, txid, attempt)
        if fault is None:
            return
        if fault.action == "pause":  # the step goes on, into a stopped Redis
            if PAUSE_HOOK is not None:
                PAUSE_HOOK()
            return
        if fault.action == "stall":  # the step itself stops here, then goes on
            if STALL_HOOK is not None:
                STALL_HOOK(fault)
            return
        if fault.action == "crash":
            raise SimulatedCrash(f"simulated crash at {fault}")
        if fault.action == "kill":
            sys.stdout.flush()
            sys.stderr.write(f"tridentflow: injected fault {fault}: killing process\n")
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        raise InjectedFaultError(f"injected fault {fault}")

    def dark_partitions(self, txid: int) -> frozenset[int]:
        return frozenset(d.partition for d in self.darks if d.first <= txid <= d.last)
