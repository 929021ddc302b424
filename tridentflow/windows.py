"""Windows over a stream (Trident's tumbling and sliding windows), kept exactly-once by the
map states they are persisted into.

A window is a numeric range ``[start, start + size)`` of one field: event time (a timestamp
field of the records) or, for count windows, the source's record position
(``LogSource.position_field``: unique, contiguous and stable across replays). ``Windows`` maps
a value to the start of every window that holds it, so that
``stream.sliding_window(size, slide, on=...)`` is an ``each`` emitting one tuple per window, and
``.group_by("window").persistent_aggregate(...)`` keeps each window's aggregate in a state
with the usual txid rules: replays, retries and dark partitions never count a record twice in
a window, whatever the batching.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from tridentflow.errors import PipelineError


def _number(value: Any, what: str) -> int | float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PipelineError(f"{what} must be a number, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise PipelineError(f"{what} must be finite, got {value!r}")
    return value


@dataclass(frozen=True)
class Windows:
    """The starts of the windows of ``size`` every ``slide`` (tumbling: slide == size) that
    hold a value, newest first: ``k * slide`` for every whole k with
    ``k * slide <= value < k * slide + size``. Ints stay ints. A value that is not a finite
    number fails its record (quarantined)."""

    size: int | float
    slide: int | float

    def __post_init__(self) -> None:
        size = _number(self.size, "a window's size")
        slide = _number(self.slide, "a window's slide")
        if size <= 0 or slide <= 0 or slide > size:
            raise PipelineError(
                f"windows need 0 < slide <= size, got size {size!r} and slide {slide!r}"
            )

    def __call__(self, value: Any) -> Iterator[tuple[int | float]]:
        value = _number(value, "the window field")
        if isinstance(value, int) and isinstance(self.slide, int):
            k = value // self.slide
        else:  # the float quotient can be off by one either way: settle it by multiplication
            k = math.floor(value / self.slide)
            while (k + 1) * self.slide <= value:
                k += 1
            while k * self.slide > value:
                k -= 1
        while k * self.slide + self.size > value:
            yield (k * self.slide,)
            k -= 1

    def __repr__(self) -> str:
        if self.size == self.slide:
            return f"tumbling_window({self.size!r})"
        return f"sliding_window({self.size!r}, {self.slide!r})"
