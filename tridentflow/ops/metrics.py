"""Operators' figures per pipeline, for alerting: Prometheus text, and Airflow's own metrics.

``figures(rt)`` reads them from the ledger and the source (what ``status`` reads): read-only,
safe at any rate (a few Redis calls per partition). ``prometheus_text`` renders them for a
scrape with prometheus-client's exposition format; ``send_to_airflow_stats`` hands them to
Airflow's ``Stats`` (StatsD or OpenTelemetry, whatever Airflow is configured with).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from tridentflow.errors import NotConfiguredError, one_line
from tridentflow.ops.bounded import DEFAULT_DEADLINE_S, READER, BoundedReader
from tridentflow.ops.status import status
from tridentflow.steps.runs import first_started_ms
from tridentflow.steps.runtime import Runtime

FIGURES: dict[str, str] = {
    "committed_txid": "The last committed txid (0: none yet).",
    "lag_records": "Records in the source not yet in a committed txid (readable partitions).",
    "pending_txids": "Txids bound or created but not committed.",
    "oldest_pending_seconds": "Seconds since the oldest pending txid's first step started "
    "(0: none pending).",
    "last_commit_seconds": "Seconds since the last commit ended (absent: never committed).",
    "quarantined_records": "Records set aside as unreadable (see `tridentflow quarantine`).",
    "unavailable_partitions": "Source partitions that cannot be read now.",
    "sink_lag_txids": "Committed txids the slowest sink has not applied yet (absent: no sink).",
    "last_commit_expired_keys": "Keys the last commit expired (expire_after_txids or "
    "expire_after; absent: no "
    "state expires keys).",
}
"""Every figure, by name without the ``tridentflow_`` prefix, with its help text."""
UP_HELP = "1 if the pipeline's ledger could be read, 0 if not (Redis unreachable, ...)."
CONFIGURED_HELP = (
    "1 if the pipeline has the settings it needs, 0 if not (e.g. a KafkaSource without brokers:"
    " no tridentflow_up is reported for it)."
)
SINK_HELP = "Committed txids this sink has not applied yet (its position as its export recorded)."
SINK_FAILING_HELP = "1 if this sink's last export failed (status and the view say why), else 0."


@dataclass(frozen=True)
class PipelineFigures:
    """One pipeline's figures, or why they could not be read (``error``, one line)."""

    pipeline: str
    values: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    sink_lags: dict[str, float] = field(default_factory=dict)
    """Lag in txids by sink (``tridentflow_sink_lag_txids_by_sink``)."""
    sinks_failing: dict[str, float] = field(default_factory=dict)
    """1/0 by sink: its last export failed (``tridentflow_sink_failing``)."""
    configured: bool = True
    """False: the pipeline lacks a setting (``error`` says which); it reports
    ``tridentflow_configured`` 0 and no ``tridentflow_up``, so an alert on up == 0 does not
    fire for a pipeline nobody set up."""


def figures(rt: Runtime, info: Mapping[str, Any] | None = None) -> dict[str, float]:
    """The pipeline's figures now (Redis's clock), from ``info`` (its ``status``, read if not
    given); read-only."""
    info = status(rt) if info is None else info
    now_ms = rt.redis_now_ms()
    out: dict[str, float] = {
        "committed_txid": info["committed_txid"],
        "lag_records": info["lag"],
        "pending_txids": len(info["pending"]),
        "oldest_pending_seconds": 0.0,
        "quarantined_records": info["quarantined"],
        "unavailable_partitions": len(info["unavailable_partitions"]),
    }
    started = [
        t for t in (first_started_ms(rt.ledger.tx_info(p["txid"])) for p in info["pending"]) if t
    ]
    if started:
        out["oldest_pending_seconds"] = max(0.0, (now_ms - min(started)) / 1000)
    last = info["last_commit"]
    ended = _commit_ended_ms(last) if last else None
    if ended is not None:
        out["last_commit_seconds"] = max(0.0, (now_ms - ended) / 1000)
    if last and any("expired_by_txid" in s for s in info["states"].values()):
        out["last_commit_expired_keys"] = float(last.get("expired", 0))
    lags = sink_lags(info)
    if lags:
        out["sink_lag_txids"] = max(lags.values())
    return out


def sink_lags(info: Mapping[str, Any]) -> dict[str, float]:
    """Each sink's lag in txids, from a ``status`` answer."""
    return {s["sink"]: float(s["lag"]) for s in info.get("sinks", [])}


def sinks_failing(info: Mapping[str, Any]) -> dict[str, float]:
    """1.0 for each sink whose last export failed, 0.0 for the others (a ``status`` answer)."""
    return {s["sink"]: 1.0 if s.get("error") else 0.0 for s in info.get("sinks", [])}


def _commit_ended_ms(entry: Mapping[str, Any]) -> int | None:
    commit = (entry.get("steps") or {}).get("commit") or {}
    ended = commit.get("ended_ms")
    return int(ended) if ended is not None else None


def collect(
    runtimes: Iterable[tuple[str, Callable[[], Runtime]]],
    deadline_s: float = DEFAULT_DEADLINE_S,
    reader: BoundedReader | None = None,
) -> list[PipelineFigures]:
    """Figures of each (name, opener) pair, read concurrently; a pipeline that cannot be
    read - or not within ``deadline_s`` (a source that does not answer) - gets its one-line
    error instead, and the others are still collected. Returns within the deadline."""
    pairs = list(runtimes)
    reads = {f"metrics:{name}": partial(_figures_of, name, opener) for name, opener in pairs}
    results = (reader or READER).read_all(reads, deadline_s)
    out = []
    for name, _opener in pairs:
        result = results[f"metrics:{name}"]
        if isinstance(result, PipelineFigures):
            out.append(result)
        elif isinstance(result, NotConfiguredError):  # nobody set it up: not a failure
            out.append(PipelineFigures(name, error=one_line(result), configured=False))
        else:  # Redis down, an ACL refusal, a broken pipeline, a hung source: say so
            out.append(PipelineFigures(name, error=one_line(result)))
    return out


def _figures_of(name: str, open_runtime: Callable[[], Runtime]) -> PipelineFigures:
    rt = open_runtime()
    try:
        info = status(rt)
        return PipelineFigures(
            name,
            figures(rt, info),
            sink_lags=sink_lags(info),
            sinks_failing=sinks_failing(info),
        )
    finally:
        rt.client.close()


def prometheus_text(collected: list[PipelineFigures]) -> bytes:
    """The figures in Prometheus's text exposition format (prometheus-client renders it):
    ``tridentflow_<figure>{pipeline="..."}`` gauges and ``tridentflow_up``."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import GaugeMetricFamily

    class Collector:
        def collect(self) -> Iterator[GaugeMetricFamily]:
            up = GaugeMetricFamily("tridentflow_up", UP_HELP, labels=["pipeline"])
            configured = GaugeMetricFamily(
                "tridentflow_configured", CONFIGURED_HELP, labels=["pipeline"]
            )
            for entry in collected:
                configured.add_metric([entry.pipeline], 1.0 if entry.configured else 0.0)
                if entry.configured:
                    up.add_metric([entry.pipeline], 0.0 if entry.error else 1.0)
            yield up
            yield configured
            for name, help_text in FIGURES.items():
                family = GaugeMetricFamily(f"tridentflow_{name}", help_text, labels=["pipeline"])
                for entry in collected:
                    if name in entry.values:
                        family.add_metric([entry.pipeline], float(entry.values[name]))
                yield family
            per_sink = (
                ("tridentflow_sink_lag_txids_by_sink", SINK_HELP, "sink_lags"),
                ("tridentflow_sink_failing", SINK_FAILING_HELP, "sinks_failing"),
            )
            for metric, help_text, attribute in per_sink:
                family = GaugeMetricFamily(metric, help_text, labels=["pipeline", "sink"])
                for entry in collected:
                    for sink, value in sorted(getattr(entry, attribute).items()):
                        family.add_metric([entry.pipeline, sink], value)
                yield family

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Collector())  # type: ignore[arg-type]
    return generate_latest(registry)


PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def send_to_airflow_stats(pipeline: str, values: Mapping[str, float], stats: Any) -> int:
    """Each figure as an Airflow gauge ``tridentflow.<pipeline>.<figure>``, also tagged
    ``pipeline`` (plain StatsD has no tags; Airflow names its own per-DAG metrics the same way):
    a StatsD or OpenTelemetry setup in Airflow gets them with no extra wiring. The count sent."""
    for name, value in values.items():
        stats.gauge(f"tridentflow.{pipeline}.{name}", float(value), tags={"pipeline": pipeline})
    return len(values)
