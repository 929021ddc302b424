"""Reads that answer within a bound: each pipeline read concurrently, with a deadline.

The view's listing and the metrics scrape read every pipeline's ledger and source heads. One
source that does not answer (a Kafka broker refusing connections, a blackholed host) must not
hold the others, nor the answer, past the deadline: ``read_all`` runs each read in a worker
thread and, at the deadline, returns what finished; a read still running is reported as
``TimedOutError`` and keeps its thread (Python cannot stop it) - the next call for the same key
waits on that same read instead of starting another, so a hung source never holds more than
one worker.

Contract: ``read_all`` returns within ``deadline_s`` (plus scheduling noise); idempotent
reads only (they may run once more than asked, never concurrently for one key).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from tridentflow.errors import TimedOutError

DEFAULT_DEADLINE_S = 4.0
"""The listing's and the scrape's bound: under Prometheus' default 10 s scrape timeout, with
room for rendering and the network."""
WORKERS = 16


class BoundedReader:
    """Runs keyed reads on a shared pool; one read in flight per key at a time."""

    def __init__(self, workers: int = WORKERS) -> None:
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tf-read")
        self._in_flight: dict[str, Future[Any]] = {}
        self._lock = threading.Lock()

    def _submit(self, key: str, read: Callable[[], Any]) -> Future[Any]:
        with self._lock:
            running = self._in_flight.get(key)
            if running is not None and not running.done():
                return running  # a read of this key still runs (a hung source): wait on it
            future = self._pool.submit(read)
            self._in_flight[key] = future
        # outside the lock: a read done already runs its callback here, in this thread
        future.add_done_callback(lambda f, k=key: self._forget(k, f))
        return future

    def _forget(self, key: str, future: Future[Any]) -> None:
        with self._lock:
            if self._in_flight.get(key) is future:
                del self._in_flight[key]

    def read_all(
        self, reads: Mapping[str, Callable[[], Any]], deadline_s: float = DEFAULT_DEADLINE_S
    ) -> dict[str, Any]:
        """Each read's result, its exception, or ``TimedOutError`` (as the value) if it did not
        finish within ``deadline_s`` of this call. Keys keep the order of ``reads``."""
        started = time.monotonic()
        futures = {key: self._submit(key, read) for key, read in reads.items()}
        out: dict[str, Any] = {}
        for key, future in futures.items():
            left = max(0.0, deadline_s - (time.monotonic() - started))
            try:
                out[key] = future.result(timeout=left)
            except FutureTimeout:
                out[key] = TimedOutError(
                    f"not read within {deadline_s:g} s (its source or Redis does not answer); "
                    "its figures are left out until it answers"
                )
            except Exception as exc:  # the read's own failure, said by the caller
                out[key] = exc
        return out


READER = BoundedReader()
"""The process's reader (the api-server's view and scrape share it)."""
