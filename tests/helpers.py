"""Helpers for the integration tests: sentences, runtimes, reference counts."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

from tridentflow.faults import FaultPlan
from tridentflow.registry import load_pipeline
from tridentflow.runtime import Runtime

WORDS = ["man", "dog", "apple", "how", "are", "you", "nice", "day", "good", "a"]


def sentences(n: int, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6))) for _ in range(n)]


def word_counts(lines: list[str]) -> dict[str, int]:
    return dict(Counter(w for line in lines for w in line.split()))


def runtime(name: str, redis_url: str, home: Path, faults: str = "") -> Runtime:
    return Runtime.open(load_pipeline(name), redis_url, home, FaultPlan.parse(faults))


def produce(rt: Runtime, lines: list[str]) -> None:
    rt.source_heads()
    rt.log.append_spread(lines)
