"""Generated data that tests, benchmarks and demos share: sentences of a small vocabulary,
fully determined by a seed, and their reference word counts."""

from __future__ import annotations

import random
from collections import Counter

WORDS = ["man", "dog", "apple", "how", "are", "you", "nice", "day", "good", "a"]


def sentences(n: int, seed: int = 7) -> list[str]:
    """``n`` sentences of 1-6 words of WORDS, the same for the same seed."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6))) for _ in range(n)]


def word_counts(lines: list[str]) -> dict[str, int]:
    """How often each word occurs in ``lines`` (what a word count must hold)."""
    return dict(Counter(w for line in lines for w in line.split()))
