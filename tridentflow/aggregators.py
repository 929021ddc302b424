"""Aggregator kinds (Trident's CombinerAggregator / ReducerAggregator) and built-ins.

* ``Combiner``: ``init(*values)`` makes a partial from one tuple, ``combine(a, b)`` merges two
  partials, ``zero()`` is the partial of an empty partition. Partial results are computed per
  partition, then combined; the stored value is updated with ``combine(stored, partial)``.
* ``Reducer``: ``init()`` and ``reduce(acc, *values)``: a fold with no partial step.

Aggregators must be deterministic and picklable (they are shipped to Spark executors).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any


class Combiner(ABC):
    @abstractmethod
    def init(self, *values: Any) -> Any: ...

    @abstractmethod
    def combine(self, a: Any, b: Any) -> Any: ...

    @abstractmethod
    def zero(self) -> Any: ...

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class Reducer(ABC):
    @abstractmethod
    def init(self) -> Any: ...

    @abstractmethod
    def reduce(self, acc: Any, *values: Any) -> Any: ...

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class Count(Combiner):
    """Number of tuples."""

    def init(self, *values: Any) -> int:
        return 1

    def combine(self, a: int, b: int) -> int:
        return a + b

    def zero(self) -> int:
        return 0


class Sum(Combiner):
    """Sum of one numeric field (int stays int, float stays float)."""

    def init(self, *values: Any) -> Any:
        if len(values) != 1:
            raise TypeError(f"Sum takes exactly one input field, got {len(values)}")
        value = values[0]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"Sum: {value!r} is not a number")
        return value

    def combine(self, a: Any, b: Any) -> Any:
        return a + b

    def zero(self) -> int:
        return 0
