"""What a schedule's seed draws apart from its faults: staging, shards, lakehouse, stream parts."""

from __future__ import annotations

import random

from tridentflow.devtools.chaos.config import SHARD_CHOICES


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


def schedule_compacting(seed: int) -> bool:
    """Whether an expiry schedule's indexes compact at every claim of a commit (half of them;
    by default an index waits until it holds twice its state), faults and all."""
    return random.Random(f"compacting-{seed}").random() < 0.5
