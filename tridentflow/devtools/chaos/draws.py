"""What a schedule's seed draws apart from its faults: staging, shards, lakehouse, stream parts."""

from __future__ import annotations

import random
from collections.abc import Callable

from tridentflow.devtools.chaos.config import SHARD_CHOICES
from tridentflow.pipeline import Pipeline


def lakehouse_schedule(seed: int) -> bool:
    """Whether schedule ``seed`` exports its states to lakehouse tables too (three in ten:
    each table write costs)."""
    return random.Random(f"lakehouse-{seed}").random() < 0.3


def lakehouse_format(seed: int) -> str:
    """The table format of a lakehouse schedule: Delta or Iceberg, half of them each."""
    return random.Random(f"lakehouse-format-{seed}").choice(("delta", "iceberg"))


def sink_parts(seed: int) -> int:
    """How many streams each stream sink of schedule ``seed`` spreads its keys over."""
    return random.Random(f"sink-parts-{seed}").choice((1, 2, 3))


def schedule_staging(seed: int) -> str:
    """Where a schedule's emits stage: files or Redis, from a generator of its own (the faults
    and shards a seed draws stay what they were)."""
    return random.Random(f"staging-{seed}").choice(("files", "redis"))


def schedule_shards(seed: int) -> int:
    """The state shards a schedule runs with: 1, 2 or 3, drawn from the seed by a generator of
    its own (the faults a seed draws stay what they were before shards existed)."""
    return random.Random(f"state-shards-{seed}").choice(SHARD_CHOICES)


def schedule_expiry(seed: int) -> int:
    """``expire_after_txids`` for the states of an expiry schedule (those that can expire:
    stamped, and recountable txid by txid by audit): 1, 2 or 3, from a generator of its own
    (what else a seed draws stays what it was)."""
    return random.Random(f"expiry-{seed}").choice((1, 2, 3))


EXPIRY_PERIODS_MS = (None, 2_000, 4_000)
"""``expire_after`` of an expiry schedule, in ms of its batch clock (None: by txids only)."""

CLOCK_STEPS_MS = (0, 1_000, 2_000, 3_000, 5_000, -4_000)
"""How far an expiry schedule's batch clock moves from one txid to the next (-4 s: a clock
that went back, which the coordinator must not follow)."""


def schedule_expiry_time(seed: int) -> tuple[int | None, bool]:
    """(``expire_after`` in ms or None, whether ``expire_after_txids`` stays too) for the
    states of an expiry schedule: by txids only, by batch time only, or both; from a generator
    of its own."""
    rng = random.Random(f"expiry-time-{seed}")
    period = rng.choice(EXPIRY_PERIODS_MS)
    return period, period is None or rng.random() < 0.5


def schedule_clock(seed: int) -> Callable[[int], int]:
    """An expiry schedule's batch clock: txid -> ms, each txid a step of CLOCK_STEPS_MS
    after the one before, drawn from the seed and the txid (the same in every process)."""

    def at_ms(txid: int) -> int:
        steps = (random.Random(f"clock-{seed}-{t}").choice(CLOCK_STEPS_MS) for t in range(txid))
        return 1_700_000_000_000 + sum(steps)

    return at_ms


def expiry_events(pipeline: Pipeline) -> list[str]:
    """A schedule's events for its states' expiry rule (``expiry:N``, ``expiry-time:MS``)."""
    rules = set(pipeline.expiring.values())
    return sorted(
        {f"expiry:{r.after_txids}" for r in rules if r.after_txids is not None}
        | {f"expiry-time:{r.after_ms}" for r in rules if r.after_ms is not None}
    )


def schedule_compacting(seed: int) -> bool:
    """Whether an expiry schedule's indexes compact at every claim of a commit (half of them;
    by default an index waits until it holds twice its state), faults and all."""
    return random.Random(f"compacting-{seed}").random() < 0.5
