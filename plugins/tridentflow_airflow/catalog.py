"""Which DAGs run which tridentflow pipeline, as the DAGs declare it - never guessed from a
pipeline's name (``pipeline_dag(..., dag_id=...)`` and a user's own DAG ids are as good as the
default ``tridentflow_<pipeline>``).

A tridentflow DAG's ``coordinate`` task names its pipeline (a templated field, so Airflow's
serialized DAG keeps it); the api-server reads the serialized DAGs of the DAGs tagged
``tridentflow`` that are not stale and loads each pipeline as the DAG's tasks do - with the
DAG's folder and the dags folder importable, where a user's pipeline module lives next to its
DAG file. A DAG whose pipeline does not load here is listed as not configured, with the one
line why; never dropped. ``TRIDENTFLOW_PIPELINES`` adds pipelines no DAG runs (one that the
CLI runs, say). Without Airflow's metadata DB (the view's unit tests) the catalog is the
bundled examples and ``TRIDENTFLOW_PIPELINES``.

Read-only; cached for ``CATALOG_TTL_S`` (a deployed or removed DAG shows after that).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tridentflow.errors import TridentflowError, one_line
from tridentflow.pipeline import Pipeline
from tridentflow.registry import EXAMPLES, load_pipeline
from tridentflow.settings import explicit_setting

PIPELINES_ENV = "TRIDENTFLOW_PIPELINES"
TAG = "tridentflow"
OPERATOR_MODULE = "tridentflow_airflow.operators"
COORDINATE = "CoordinateOperator"
CATALOG_TTL_S = 10.0


@dataclass(frozen=True)
class DeclaredDag:
    """A DAG that runs a tridentflow pipeline: its id, the pipeline it names (a bundled name
    or module:attribute) and its file."""

    dag_id: str
    pipeline_ref: str
    fileloc: str | None = None


@dataclass
class Catalog:
    """The pipelines the view shows and the DAGs that run them."""

    pipelines: dict[str, Pipeline] = field(default_factory=dict)
    """By pipeline name."""
    dags: dict[str, list[str]] = field(default_factory=dict)
    """Pipeline name -> the DAGs that run it, sorted."""
    pipeline_of: dict[str, str] = field(default_factory=dict)
    """DAG id -> the name of the pipeline it runs."""
    not_configured: dict[str, str] = field(default_factory=dict)
    """DAG id -> why its pipeline does not load here (one line)."""
    from_airflow: bool = False
    """Whether Airflow's metadata DB answered (False: examples and TRIDENTFLOW_PIPELINES)."""

    def dag_of(self, pipeline: str) -> str | None:
        """The one DAG that runs ``pipeline``; None if none or several do."""
        found = self.dags.get(pipeline, [])
        return found[0] if len(found) == 1 else None


def declared_dags() -> list[DeclaredDag] | None:
    """Every DAG tagged ``tridentflow`` and not stale whose serialized ``coordinate`` task
    names a pipeline; None if Airflow's metadata DB cannot be read here."""
    try:
        from airflow.models.dag import DagModel, DagTag
        from airflow.models.serialized_dag import SerializedDagModel
        from airflow.utils.session import create_session
        from sqlalchemy import select

        with create_session() as session:
            rows = session.execute(
                select(DagModel.dag_id, DagModel.fileloc)
                .join(DagTag, DagTag.dag_id == DagModel.dag_id)
                .where(DagTag.name == TAG, DagModel.is_stale.is_(False))
            ).all()
            files = {dag_id: fileloc for dag_id, fileloc in rows}
            serialized = SerializedDagModel.get_latest_serialized_dags(
                dag_ids=sorted(files), session=session
            )
            found = []
            for row in serialized:
                ref = _pipeline_ref(row.data or {})
                if ref is not None:
                    found.append(DeclaredDag(row.dag_id, ref, files.get(row.dag_id)))
    except Exception:  # no metadata DB here, or not Airflow's: do not guess
        return None
    return sorted(found, key=lambda d: d.dag_id)


def _pipeline_ref(data: dict[str, Any]) -> str | None:
    """The pipeline a serialized DAG's tridentflow coordinate task names."""
    for raw in data.get("dag", {}).get("tasks", []):
        task = raw.get("__var", raw) if isinstance(raw, dict) else {}
        kind = task.get("task_type") or task.get("_task_type")
        if task.get("_task_module") == OPERATOR_MODULE and kind == COORDINATE:
            ref = task.get("pipeline")
            return ref if isinstance(ref, str) and ref else None
    return None


_IMPORT_LOCK = threading.Lock()


@contextlib.contextmanager
def _importable(fileloc: str | None) -> Iterator[None]:
    """The DAG's folder and the dags folder on sys.path while a pipeline loads, as Airflow
    puts its dag bundle there for the DAG's tasks."""
    extra = []
    if fileloc:
        extra.append(str(Path(fileloc).parent))
    with contextlib.suppress(Exception):
        from airflow.configuration import conf

        extra.append(conf.get("core", "dags_folder"))
    added = [p for p in dict.fromkeys(extra) if p and p not in sys.path]
    with _IMPORT_LOCK:
        sys.path.extend(added)
        try:
            yield
        finally:
            for p in added:
                with contextlib.suppress(ValueError):
                    sys.path.remove(p)


def load_declared(dag: DeclaredDag) -> Pipeline:
    """The pipeline ``dag`` runs, loaded as its tasks load it (TridentflowError if it
    cannot be)."""
    with _importable(dag.fileloc):
        return load_pipeline(dag.pipeline_ref)


def build_catalog(declared: list[DeclaredDag] | None, extra_refs: list[str]) -> Catalog:
    """The catalog of ``declared`` DAGs (None: no Airflow - the bundled examples) and the
    pipelines ``extra_refs`` name."""
    catalog = Catalog(from_airflow=declared is not None)
    refs = list(extra_refs) if declared is not None else [*EXAMPLES, *extra_refs]
    for dag in declared or []:
        try:
            pipeline = load_declared(dag)
        except TridentflowError as exc:
            catalog.not_configured[dag.dag_id] = one_line(exc)
            continue
        catalog.pipelines.setdefault(pipeline.name, pipeline)
        catalog.pipeline_of[dag.dag_id] = pipeline.name
        catalog.dags.setdefault(pipeline.name, []).append(dag.dag_id)
    for ref in refs:
        try:
            pipeline = load_pipeline(ref)
        except TridentflowError:
            continue
        catalog.pipelines.setdefault(pipeline.name, pipeline)
    for dags in catalog.dags.values():
        dags.sort()
    return catalog


_cache: dict[str, tuple[float, Catalog]] = {}


def catalog() -> Catalog:
    """The current catalog (rebuilt at most every CATALOG_TTL_S, and at once when
    TRIDENTFLOW_PIPELINES changes)."""
    raw = explicit_setting(PIPELINES_ENV) or ""
    known = _cache.get(raw)
    if known is not None and time.monotonic() - known[0] < CATALOG_TTL_S:
        return known[1]
    extra = [r.strip() for r in raw.split(",") if r.strip()]
    built = build_catalog(declared_dags(), extra)
    _cache.clear()
    _cache[raw] = (time.monotonic(), built)
    return built


def forget() -> None:
    """Drop the cached catalog (tests; a deployment that just changed)."""
    _cache.clear()


def dags_of_runs(dag_ids: list[str], run_ids: list[str]) -> dict[str, str]:
    """run id -> the DAG (of ``dag_ids``) that has a run with that id, from Airflow's
    metadata DB; {} where it cannot be read."""
    runs = sorted(set(run_ids))
    if not runs or not dag_ids:
        return {}
    if len(dag_ids) == 1:
        return dict.fromkeys(runs, dag_ids[0])
    try:
        from airflow.models.dagrun import DagRun
        from airflow.utils.session import create_session
        from sqlalchemy import select

        with create_session() as session:
            rows = session.execute(
                select(DagRun.run_id, DagRun.dag_id).where(
                    DagRun.dag_id.in_(dag_ids), DagRun.run_id.in_(runs)
                )
            ).all()
    except Exception:
        return {}
    return {run_id: dag_id for run_id, dag_id in rows}
