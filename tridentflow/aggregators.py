"""Aggregator kinds (Trident's CombinerAggregator / ReducerAggregator / Aggregator), state
updaters, and the built-ins.

* ``Combiner``: ``init(*values)`` makes a partial from one tuple, ``combine(a, b)`` merges two
  partials, ``zero()`` is the partial of an empty partition. Partial results are computed per
  partition, then combined; the stored value is updated with ``combine(stored, partial)``.
* ``Reducer``: ``init()`` and ``reduce(acc, *values)``: a fold with no partial step; a stored
  value is updated by folding the batch's tuples into it (``init()`` when there is none).
* ``Aggregator`` (Trident's full Aggregator): ``init(batch)``, ``aggregate(acc, *values)``,
  ``complete(acc)`` -> 0..n output tuples. Batch operations only: it cannot be persisted.
* ``StateUpdater`` (Trident's StateUpdater for partition_persist): ``update(current, tuples)``
  gives a key's new value from its current one (None if absent) and the batch's tuples.

**Mutating arguments is allowed.** Ordinary Python such as ``a["n"] += b["n"]; return a`` or
``acc.append(x); return acc`` is safe: ``guard`` wraps every user aggregator so that each
accumulator it is given belongs to that fold alone (stored ``curr``/``prev``, staged partials,
partials merged in tasks and exchanges, tuples shared by branches are never aliased). Only
containers are copied; aggregators that never mutate (the built-ins) set ``pure = True`` and
are not wrapped.

Every fold sees its tuples in the batch's deterministic order (source order, and across a
repartition, sender by sender; see tridentflow.engines.batchops), so a replay reproduces it exactly.
Aggregators must be deterministic and picklable (they are shipped to Spark executors).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from tridentflow_state.codec import encode_key, private, private_args


@dataclass(frozen=True)
class BatchInfo:
    """What a full Aggregator's ``init`` is told: the txid and the partition it aggregates."""

    txid: int
    partition: int


class Combiner(ABC):
    pure: bool = False
    """True if init/combine/zero never mutate their arguments nor return shared objects:
    the engine then skips its defensive copies (the built-ins)."""

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
    pure: bool = False

    @abstractmethod
    def init(self) -> Any: ...

    @abstractmethod
    def reduce(self, acc: Any, *values: Any) -> Any: ...

    def present(self, value: Any) -> Any:
        return value

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class Aggregator(ABC):
    """Trident's full Aggregator. ``complete`` returns the output tuples (a tuple/list per
    output, or a bare value for a one-field output); None means no output."""

    pure: bool = False

    @abstractmethod
    def init(self, batch: BatchInfo) -> Any: ...

    @abstractmethod
    def aggregate(self, acc: Any, *values: Any) -> Any:
        """The new accumulator after one tuple (may mutate and return ``acc``)."""

    @abstractmethod
    def complete(self, acc: Any) -> Iterable[Any] | None: ...

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class StateUpdater(ABC):
    """A custom state update for ``partition_persist``: called once per key per txid. Return
    the key's new value, or ``tridentflow.REMOVE`` to remove the key (replay-safe; see
    tridentflow_state.maps.REMOVE).

    With ``reads_state = True`` it is called as ``update(current, tuples, state)``, ``state``
    a ``StateView`` of the same state during the commit (Trident's ``multiGet`` from a
    StateUpdater): ``state.get(*key)`` / ``state.multi_get(keys)`` read other keys - one Redis
    round trip per call - as this commit attempt has left them so far, every key it has not
    reached yet as of before the txid, so a replay reads what the first attempt read."""

    reads_state: bool = False

    @abstractmethod
    def update(self, current: Any, tuples: list[tuple[Any, ...]]) -> Any: ...

    def present(self, value: Any) -> Any:
        return value

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class StateView:
    """What a StateUpdater with ``reads_state`` may read during a commit: other keys of the
    state it updates (see StateUpdater). Keys are tuples of the group fields' values."""

    def __init__(self, state: Any) -> None:
        self._state = state  # a tridentflow_state.maps.MapState in its commit

    def multi_get(self, keys: Sequence[Sequence[Any]]) -> list[Any]:
        """The values of ``keys`` (None where absent), in one round trip."""
        return self._state.multi_get([encode_key(tuple(k)) for k in keys])

    def get(self, *key: Any) -> Any:
        return self.multi_get([key])[0]


@dataclass(frozen=True)
class FunctionUpdater(StateUpdater):
    """A plain ``function(current, tuples) -> new value`` as a StateUpdater."""

    function: Callable[[Any, list[tuple[Any, ...]]], Any]

    def update(self, current: Any, tuples: list[tuple[Any, ...]]) -> Any:
        return self.function(current, tuples)

    def __repr__(self) -> str:
        return getattr(self.function, "__name__", repr(self.function))


AnyAggregator = Combiner | Reducer | Aggregator
Persistable = Combiner | Reducer | StateUpdater


class _Guarded:
    """Shared part of the guards: delegates everything else (present, attributes, repr)."""

    inner: Any

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # during unpickling, before __init__ ran
            raise AttributeError(name)
        return getattr(self.inner, name)

    def present(self, value: Any) -> Any:
        return self.inner.present(value)

    def __repr__(self) -> str:
        return repr(self.inner)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Guarded) and self.inner == other.inner

    def __hash__(self) -> int:
        return hash(self.inner)


class GuardedCombiner(_Guarded, Combiner):
    """A user Combiner whose partials are never shared: ``init``/``zero`` results and the
    incoming ``b`` are private copies; ``a`` is always the fold's own accumulator."""

    def init(self, *values: Any) -> Any:
        return private(self.inner.init(*private_args(values)))

    def combine(self, a: Any, b: Any) -> Any:
        return self.inner.combine(a, private(b))

    def zero(self) -> Any:
        return private(self.inner.zero())


class GuardedReducer(_Guarded, Reducer):
    def init(self) -> Any:
        return private(self.inner.init())

    def reduce(self, acc: Any, *values: Any) -> Any:
        return self.inner.reduce(acc, *private_args(values))


class GuardedAggregator(_Guarded, Aggregator):
    def init(self, batch: BatchInfo) -> Any:
        return private(self.inner.init(batch))

    def aggregate(self, acc: Any, *values: Any) -> Any:
        return self.inner.aggregate(acc, *private_args(values))

    def complete(self, acc: Any) -> Iterable[Any] | None:
        return self.inner.complete(acc)


def guard(aggregator: Any) -> Any:
    """``aggregator`` made safe to mutate its arguments (see the module doc); pure ones, a
    StateUpdater (handed private values by the map state) and guards are returned as they are."""
    if isinstance(aggregator, _Guarded) or getattr(aggregator, "pure", False):
        return aggregator
    if isinstance(aggregator, Combiner):
        return GuardedCombiner(aggregator)
    if isinstance(aggregator, Reducer):
        return GuardedReducer(aggregator)
    if isinstance(aggregator, Aggregator):
        return GuardedAggregator(aggregator)
    return aggregator


def apply_staged(persisted: Persistable, current: Any, staged: Any, view: Any = None) -> Any:
    """A key's new stored value from its current one and what the batch staged for it: a
    Combiner's partial, or a Reducer's / StateUpdater's tuples in batch order (``view``: the
    StateView a StateUpdater with ``reads_state`` is handed)."""
    if isinstance(persisted, Combiner):
        return staged if current is None else persisted.combine(current, staged)
    tuples = [tuple(t) for t in staged]
    if isinstance(persisted, Reducer):
        acc = persisted.init() if current is None else current
        for values in tuples:
            acc = persisted.reduce(acc, *values)
        return acc
    if getattr(persisted, "reads_state", False):
        return persisted.update(current, tuples, view)
    return persisted.update(current, tuples)


def absent_value(persisted: Persistable) -> Any:
    """What a query shows for a key that was never written."""
    if isinstance(persisted, Combiner):
        return persisted.zero()
    if isinstance(persisted, Reducer):
        return persisted.init()
    return None


class Count(Combiner):
    """Number of tuples."""

    pure = True

    def init(self, *values: Any) -> int:
        return 1

    def combine(self, a: int, b: int) -> int:
        return a + b

    def zero(self) -> int:
        return 0


class Sum(Combiner):
    """Sum of one numeric field (int stays int, float stays float)."""

    pure = True

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

    pure = True

    def init(self, *values: Any) -> Any:
        return values[0]

    def combine(self, a: Any, b: Any) -> Any:
        return _pick(a, b, lambda x, y: x <= y)

    def zero(self) -> Any:
        return None


class Max(Combiner):
    """Largest value of one field (None for no tuples)."""

    pure = True

    def init(self, *values: Any) -> Any:
        return values[0]

    def combine(self, a: Any, b: Any) -> Any:
        return _pick(a, b, lambda x, y: x >= y)

    def zero(self) -> Any:
        return None


class Mean(Combiner):
    """Arithmetic mean of one numeric field, as a combiner: the partial (and the stored value)
    is ``[sum, count]``; ``present`` turns it into the mean."""

    pure = True

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


class First(Combiner):
    """The first non-None value of one field, in the batch's deterministic order (None for no
    tuples); persisted, the first value ever stored is kept."""

    pure = True

    def init(self, *values: Any) -> Any:
        return values[0]

    def combine(self, a: Any, b: Any) -> Any:
        return b if a is None else a

    def zero(self) -> Any:
        return None
