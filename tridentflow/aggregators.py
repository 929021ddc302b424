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

    def present(self, value: Any) -> Any:
        """How a stored value is shown to queries (identity unless overridden, e.g. Mean)."""
        return value

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


def _pick(a: Any, b: Any, better) -> Any:
    if a is None:
        return b
    if b is None:
        return a
    return a if better(a, b) else b


class Min(Combiner):
    """Smallest value of one field (None for no tuples)."""

    def init(self, *values: Any) -> Any:
        return values[0]

    def combine(self, a: Any, b: Any) -> Any:
        return _pick(a, b, lambda x, y: x <= y)

    def zero(self) -> Any:
        return None


class Max(Combiner):
    """Largest value of one field (None for no tuples)."""

    def init(self, *values: Any) -> Any:
        return values[0]

    def combine(self, a: Any, b: Any) -> Any:
        return _pick(a, b, lambda x, y: x >= y)

    def zero(self) -> Any:
        return None


class Mean(Combiner):
    """Arithmetic mean of one numeric field, as a combiner: the partial (and the stored value)
    is ``[sum, count]``; ``present`` turns it into the mean."""

    def init(self, *values: Any) -> list[Any]:
        return [Sum().init(*values), 1]

    def combine(self, a: list[Any], b: list[Any]) -> list[Any]:
        return [a[0] + b[0], a[1] + b[1]]

    def zero(self) -> list[Any]:
        return [0, 0]

    def present(self, value: Any) -> Any:
        if not value or not value[1]:
            return None
        return value[0] / value[1]
