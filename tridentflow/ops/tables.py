"""Lakehouse table maintenance (``tridentflow tables compact|vacuum``): each DeltaSink's and
IcebergSink's table compacted or vacuumed, by the CLI and by the chaos harness's operator.

Neither moves a txid stamp: a compaction writes the same rows into fewer files as a new
version; a vacuum deletes files no version the sink may still need references - the versions
of the txids a ``rewind`` may reach are kept whatever the retention (``table_versions``). Any
failure is one line naming the sink; the table is as it was, but for files nothing
referenced, and the same command may run again (idempotent).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tridentflow.errors import TridentflowError, one_line
from tridentflow.pipeline import Feed
from tridentflow.sinks.base import MaintainsTable
from tridentflow.sinks.lakehouse import check_retention
from tridentflow.steps.export import close_sink, pick_feeds, table_versions
from tridentflow.steps.runtime import Runtime


def lakehouse_feeds(rt: Runtime, names: Sequence[str] | None = None) -> list[Feed]:
    """The pipeline's feeds into a lakehouse table (``names``: only those); TridentflowError
    (one line) when there is none."""
    feeds = [f for f in pick_feeds(rt, names) if isinstance(f.sink, MaintainsTable)]
    if not feeds:
        raise TridentflowError(
            f"pipeline {rt.pipeline.name} has no lakehouse sink (DeltaSink, IcebergSink)"
        )
    return feeds


def _table(feed: Feed) -> MaintainsTable:
    """``feed``'s sink as a table to maintain; TridentflowError (one line) if it is none."""
    if not isinstance(feed.sink, MaintainsTable):
        raise TridentflowError(
            f"sink {feed.name} ({feed.sink.describe()}) is not a lakehouse table (DeltaSink, "
            "IcebergSink): name one that is"
        )
    return feed.sink


def compact_table(feed: Feed) -> dict[str, Any]:
    """``feed``'s table compacted (a new version of the same rows); the table library's
    metrics. Idempotent."""
    return _one_line(feed, "compact", _table(feed).compact)


def vacuum_table(rt: Runtime, feed: Feed, retention_hours: float, apply: bool) -> list[str]:
    """The files of ``feed``'s table that no version of the last ``retention_hours`` and no
    version a rewind may reach references; deleted when ``apply``. Idempotent."""
    check_retention(retention_hours)
    keep = [int(v) for v in table_versions(rt, feed).values() if v.isdigit()]
    return _one_line(
        feed,
        "vacuum",
        lambda: _table(feed).vacuum(retention_hours, dry_run=not apply, keep_versions=keep),
    )


def _one_line(feed: Feed, action: str, work: Any) -> Any:
    """``work()``, a table library's error as one line naming the sink; the sink closed."""
    try:
        return work()
    except TridentflowError:
        raise
    except Exception as exc:  # the table library's (a racing export, a store's error)
        raise TridentflowError(
            f"sink {feed.name} ({feed.sink.describe()}): tables {action} failed: "
            f"{one_line(exc)} (the table is as it was, but for files nothing referenced; "
            "run it again)"
        ) from None
    finally:
        close_sink(feed)
