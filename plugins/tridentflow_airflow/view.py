"""The tridentflow view in Airflow: a FastAPI app the api-server mounts under ``/tridentflow``.

JSON endpoints over what the Redis ledger knows (never XCom, which a cleared task loses):

* ``GET  /tridentflow/api/pipelines``                       every pipeline: committed txid,
  pending txids, lag, unavailable partitions, last commit
* ``GET  /tridentflow/api/pipelines/{name}``                 status: pending txids (owner, lease,
  attempts), per-partition committed offset / head / lag, quarantine count, the last commits
  (run, records, keys, skipped partitions, attempts and start/end of every step)
* ``GET  /tridentflow/api/pipelines/{name}/txids/{txid}``    one txid: its commit, or its pending
  state
* ``GET  /tridentflow/api/pipelines/{name}/state/{state}?key=K``  committed values (Trident's
  stateQuery; ``key`` repeats; a JSON array for compound keys)
* ``GET  /tridentflow/api/pipelines/{name}/state/{state}/keys?limit=N&after=C&as_of=T``
  every key of a state, a page at a time (``as_of``: as of a retained txid, one page)
* ``GET  /tridentflow/api/pipelines/{name}/quarantine?limit=N``
* ``POST /tridentflow/api/pipelines/{name}/audit``           lost / doubled / mismatched
* ``GET  /tridentflow/api/runs/{dag_id}/{run_id}``           what an Airflow run bound and
  committed: its pipeline, txid, binding (or the run that adopted it) and commit
* ``POST /tridentflow/api/pipelines/{name}/txids/{txid}/release``  release a txid whose owner
  run has finished in Airflow (refused while it is alive); needs edit rights on the DAG's runs
  and leaves an entry in Airflow's audit log
* ``POST /tridentflow/api/pipelines/{name}/rewind?to=N&force=B``  rewind (as ``tridentflow
  rewind``); needs edit rights on the DAG's runs; an entry in Airflow's audit log
* ``POST /tridentflow/api/pipelines/{name}/reshard?shards=M``  move every state to M shards
  (as ``tridentflow reshard``); needs edit rights on the DAG's runs; an entry in Airflow's
  audit log
* ``GET  /tridentflow/openapi.json``, ``/tridentflow/docs``, ``/tridentflow/redoc``  the API's
  schema, Swagger UI and ReDoc (authenticated like the rest)
* ``GET  /tridentflow/metrics``                              every pipeline's figures in
  Prometheus text format (tridentflow.ops.metrics); a scraper may instead send
  ``Authorization: Bearer $TRIDENTFLOW_METRICS_TOKEN`` (this route only)

And pages (static HTML that reads those endpoints; the plugin registers two as
``external_views``, shown by the UI in a frame; ``/tridentflow/txid?pipeline=P&txid=N`` is one
txid's page, linked from both): ``/tridentflow/ui`` (the nav page: ledger,
lag per partition, records per txid and step durations, quarantine, a state browser, "Audit
now") and ``/tridentflow/run?dag_id=...&run_id=...`` (the tab on every DAG run).

Airflow does not authenticate plugin apps: every route here depends on the api-server's auth
manager (``authenticated``: a JWT or the UI's session, as ``requires_authenticated``): no or a
bad token is 401/403. Responses never hold the
Redis password. Pipelines are those the deployed DAGs run, as each DAG declares it
(tridentflow_airflow.catalog: never guessed from a DAG id), and ``TRIDENTFLOW_PIPELINES``
(comma-separated ``module:attribute`` refs, for pipelines no DAG runs); a DAG whose pipeline
does not load in the api-server is listed as not configured, with why. Errors are JSON
``{"detail": one line}``.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Annotated, Any

from airflow.api_fastapi.core_api.security import bearer_scheme, get_user
from fastapi import Depends, FastAPI, HTTPException, Query, Request, Response
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.openapi.utils import get_openapi
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse
from fastapi.security import HTTPAuthorizationCredentials

from tridentflow.errors import NotConfiguredError, TridentflowError, one_line
from tridentflow.ops import metrics
from tridentflow.ops.bounded import DEFAULT_DEADLINE_S, READER
from tridentflow.ops.status import (
    pending_txid,
    replays_after_commit,
    status,
)
from tridentflow.pipeline import Pipeline
from tridentflow.redisconn import REDIS_URL_ENV, redacted, scrubbed
from tridentflow.settings import env_seconds, explicit_setting
from tridentflow.steps.runs import blocked, release_finished_owner
from tridentflow.steps.runtime import Runtime
from tridentflow_airflow.catalog import PIPELINES_ENV, catalog, dags_of_runs
from tridentflow_airflow.dag_factory import default_dag_id
from tridentflow_airflow.hooks import airflow_connections, server_redis_url
from tridentflow_airflow.tries import TaskTry, airflow_tries, replays_after, step_figures
from tridentflow_state.errors import StateError

log = logging.getLogger(__name__)
__all__ = ["PIPELINES_ENV", "app"]
PAGE = Path(__file__).with_name("static") / "tridentflow.html"
METRICS_TOKEN_ENV = "TRIDENTFLOW_METRICS_TOKEN"
"""A scrape token: ``Authorization: Bearer <it>`` is accepted on ``/metrics`` (only there)
for a Prometheus that cannot log in to Airflow. Unset: ``/metrics`` needs Airflow's auth."""
METRICS_PATH = "/metrics"
READ_DEADLINE_ENV = "TRIDENTFLOW_READ_DEADLINE_S"


async def authenticated(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)],
) -> None:
    """Every route's guard: Airflow's auth manager decides (a JWT in ``Authorization``, or the
    UI's session cookie), as ``requires_authenticated`` does; on ``/metrics`` the scrape token
    (TRIDENTFLOW_METRICS_TOKEN) is accepted too. 401/403 otherwise."""
    token = explicit_setting(METRICS_TOKEN_ENV) or ""
    if (
        token
        and credentials is not None
        and is_metrics_route(request)
        and hmac.compare_digest(credentials.credentials.encode(), token.encode())
    ):
        return
    await get_user(request, None, credentials)


def is_metrics_route(request: Request) -> bool:
    """Whether the request was routed to ``get_metrics`` itself: the route the router
    matched, never the path's text (a state, a pipeline or a run named ``metrics`` ends its
    path with ``/metrics`` too)."""
    route = request.scope.get("route")
    return getattr(route, "endpoint", None) is get_metrics and route.path == METRICS_PATH


AUTHENTICATED = authenticated
"""The dependency every route has (tests override it to run the app without Airflow)."""

app = FastAPI(
    title="tridentflow",
    description="Exactly-once pipelines: ledger, states, quarantine, audit.",
    dependencies=[Depends(AUTHENTICATED)],
    # FastAPI adds these three without the app's dependencies: they are routes of ours below
    openapi_url=None,
    docs_url=None,
    redoc_url=None,
)


@app.get("/openapi.json", include_in_schema=False)
def openapi_schema() -> dict[str, Any]:
    """The API's OpenAPI schema (authenticated like every other route)."""
    if app.openapi_schema is None:
        app.openapi_schema = get_openapi(
            title=app.title, version=app.version, description=app.description, routes=app.routes
        )
    return app.openapi_schema


@app.get("/docs", include_in_schema=False)
def swagger_docs(request: Request) -> HTMLResponse:
    """Swagger UI over ``/openapi.json`` (authenticated like every other route)."""
    root = request.scope.get("root_path", "")
    return get_swagger_ui_html(openapi_url=f"{root}/openapi.json", title="tridentflow API")


@app.get("/redoc", include_in_schema=False)
def redoc_docs(request: Request) -> HTMLResponse:
    """ReDoc over ``/openapi.json`` (authenticated like every other route)."""
    root = request.scope.get("root_path", "")
    return get_redoc_html(openapi_url=f"{root}/openapi.json", title="tridentflow API")


def known_pipelines() -> dict[str, Pipeline]:
    """The pipelines the view shows, by name (tridentflow_airflow.catalog)."""
    return catalog().pipelines


def dags_of(pipeline: str) -> list[str]:
    """The DAGs that run ``pipeline``, as they declare it. Without Airflow's metadata DB (the
    view's unit tests), the DAG id ``pipeline_dag`` gives it by default."""
    cat = catalog()
    if not cat.from_airflow:
        return [default_dag_id(pipeline)]
    return cat.dags.get(pipeline, [])


def single_dag(pipeline: str) -> str | None:
    """The one DAG that runs ``pipeline`` (None: none, or several - then each run names its
    own)."""
    found = dags_of(pipeline)
    return found[0] if len(found) == 1 else None


class NotConfiguredHTTPError(HTTPException):
    """A pipeline that lacks a setting (tridentflow.errors.NotConfiguredError): listed apart, as
    not configured, with what to set - not as a failure."""


@contextmanager
def runtime(name: str | Pipeline) -> Iterator[Runtime]:
    """A runtime of a pipeline (or of the one named ``name``: 404 if unknown); tridentflow and
    Redis errors become one-line JSON."""
    pipeline = name if isinstance(name, Pipeline) else known_pipelines().get(name)
    if pipeline is None:
        raise HTTPException(status_code=404, detail=f"no pipeline named {name!r}")
    try:
        rt = Runtime.open(  # Airflow's connections: it reads a KafkaSource's heads as tasks do
            pipeline, redis_url=view_redis_url(), connections=airflow_connections()
        )
    except TridentflowError as exc:
        raise HTTPException(status_code=503, detail=_safe(one_line(exc))) from None
    try:
        yield rt
    except NotConfiguredError as exc:
        raise NotConfiguredHTTPError(status_code=409, detail=_safe(one_line(exc))) from None
    except (TridentflowError, StateError) as exc:
        raise HTTPException(status_code=409, detail=_safe(one_line(exc))) from None
    finally:
        rt.client.close()


REDIS_LOOKUP_TTL_S = 10.0
"""How long the view keeps the Redis URL it looked up (a changed connection shows after)."""
_redis_lookup: dict[tuple[str | None, str | None], tuple[float, str]] = {}


def view_redis_url() -> str:
    """The Redis the view reads: the ``redis_default`` Airflow connection, the one the tasks
    write through (docs/install.md), else ``TRIDENTFLOW_REDIS_URL``; neither is a one-line
    503. Looked up at most every ``REDIS_LOOKUP_TTL_S`` seconds (the lookup may read the
    metadata DB), afresh when either setting in the environment changes."""
    key = (os.environ.get("AIRFLOW_CONN_REDIS_DEFAULT"), os.environ.get(REDIS_URL_ENV))
    known = _redis_lookup.get(key)
    if known is not None and time.monotonic() - known[0] < REDIS_LOOKUP_TTL_S:
        return known[1]
    try:
        url = server_redis_url() or key[1]
    except TridentflowError as exc:
        raise HTTPException(status_code=503, detail=one_line(exc)) from None
    if url is None:
        raise HTTPException(
            status_code=503,
            detail="no Redis to read: define the Airflow connection 'redis_default' (the one "
            f"the tasks use) or set {REDIS_URL_ENV} in the api-server's environment",
        )
    _redis_lookup.clear()
    _redis_lookup[key] = (time.monotonic(), url)
    return url


def _safe(text: str) -> str:
    """``text`` without the Redis URL's password."""
    try:
        url = view_redis_url()
    except HTTPException:
        return scrubbed(text, "")
    return scrubbed(text.replace(url, redacted(url)), url)


def airflow_run_state(dag_ids: list[str], run_id: str) -> str | None:
    """A DAG run's state from Airflow's metadata DB (the api-server's own session), the run
    of any of ``dag_ids``; None if unknown or unreadable."""
    if not dag_ids:
        return None
    try:
        from airflow.models.dagrun import DagRun
        from airflow.utils.session import create_session
        from sqlalchemy import select

        with create_session() as session:
            found = session.scalar(
                select(DagRun.state).where(DagRun.dag_id.in_(dag_ids), DagRun.run_id == run_id)
            )
    except Exception:  # no metadata DB here: do not guess
        return None
    return None if found is None else str(getattr(found, "value", found)).lower()


def run_states(pipeline: Pipeline) -> Callable[[str], str | None]:
    """``run_id`` -> its Airflow state, among the runs of the DAGs that run the pipeline."""
    return partial(airflow_run_state, dags_of(pipeline.name))


def with_dags(pipeline: str, run_ids: list[str]) -> dict[str, str | None]:
    """run id -> the DAG it is a run of (None where Airflow cannot tell)."""
    dags = dags_of(pipeline)
    found = dags_of_runs(dags, run_ids)
    return {run: found.get(run, single_dag(pipeline)) for run in run_ids}


def blocked_with_owner_state(rt: Runtime) -> dict[str, Any] | None:
    """``runs.blocked``, the owner run's state asked of Airflow's DB; read-only."""
    return blocked(rt, run_states(rt.pipeline))


def summary(rt: Runtime) -> dict[str, Any]:
    info = status(rt)
    return {
        "pipeline": info["pipeline"],
        "guarantee": info["guarantee"],
        "source_mode": info["source_mode"],
        "committed_txid": info["committed_txid"],
        "pending_txids": [p["txid"] for p in info["pending"]],
        "lag": info["lag"],
        "unavailable_partitions": info["unavailable_partitions"],
        "quarantined": info["quarantined"],
        "last_commit": info["last_commit"],
        "blocked": blocked_with_owner_state(rt),
    }


def read_deadline_s() -> float:
    """The bound on the listing and the scrape (TRIDENTFLOW_READ_DEADLINE_S, default 4 s):
    a pipeline not read within it is shown as unreadable, saying so, and the rest answer."""
    try:
        return env_seconds(READ_DEADLINE_ENV, DEFAULT_DEADLINE_S)
    except TridentflowError as exc:
        log.warning("%s: using %s s", one_line(exc), DEFAULT_DEADLINE_S)
        return DEFAULT_DEADLINE_S


def _summary_of(pipeline: Pipeline) -> dict[str, Any]:
    with runtime(pipeline) as rt:
        return summary(rt)


@app.get("/api/pipelines")
def list_pipelines() -> dict[str, Any]:
    """Every pipeline's summary; those that cannot be read are listed with the one-line
    reason. 503 (JSON, the same fields and a ``detail``) when none can be read: Redis is
    unreachable or refuses this view."""
    out, unreadable, not_configured = [], [], []
    for dag_id, why in sorted(catalog().not_configured.items()):  # its pipeline did not load
        not_configured.append({"pipeline": None, "dag_id": dag_id, "needs": why})
    pipelines = list(known_pipelines().values())
    reads = {f"summary:{p.name}": partial(_summary_of, p) for p in pipelines}
    results = READER.read_all(reads, read_deadline_s())  # concurrently, within the bound
    for pipeline in pipelines:
        result = results[f"summary:{pipeline.name}"]
        if isinstance(result, NotConfiguredHTTPError):  # nobody set it up: not a failure
            not_configured.append({"pipeline": pipeline.name, "needs": result.detail})
        elif isinstance(result, HTTPException):  # e.g. a Redis ACL user limited to others
            unreadable.append({"pipeline": pipeline.name, "error": result.detail})
        elif isinstance(result, Exception):  # not within the bound, or a failure of its own
            unreadable.append({"pipeline": pipeline.name, "error": _safe(one_line(result))})
        else:
            out.append(result)
    body = {
        "pipelines": out,
        "unreadable": unreadable,
        "not_configured": not_configured,
        "redis": redacted(view_redis_url()),
    }
    if unreadable and not out:
        reason = unreadable[0]["error"]
        detail = f"no pipeline can be read from Redis {body['redis']}: {reason}"
        return JSONResponse(status_code=503, content={"detail": detail, **body})
    return body


def tries_by_txid(rt: Runtime, txids: list[int]) -> dict[int, list[TaskTry]]:
    """Airflow's tries of the steps of every run bound to each of ``txids`` (runs the ledger
    remembers); {} where Airflow's DB cannot be read (tridentflow_airflow.tries)."""
    runs = rt.ledger.runs_by_txid()
    wanted = {txid: runs.get(txid, []) for txid in txids}
    run_ids = [run for runs_of in wanted.values() for run in runs_of]
    every = airflow_tries(dags_of(rt.pipeline.name), run_ids)
    if not every:
        return {}
    return {txid: [t for t in every if t.run_id in set(of)] for txid, of in wanted.items()}


def tries_per_step(tries: list[TaskTry], now_ms: int) -> dict[str, int]:
    """A pending txid's tries so far, step by step, as Airflow counts them."""
    return {step: counted["tries"] for step, counted in step_figures(tries, now_ms).items()}


def as_airflow_counts(entry: dict[str, Any], tries: list[TaskTry], now_ms: int) -> None:
    """A commit's step figures replaced, step by step, by Airflow's for the tries that started
    by its commit (tries summed over its runs; seconds the tries' durations summed)."""
    figures = step_figures(tries, now_ms, until_ms=entry.get("committed_ms"))
    for step, counted in figures.items():
        entry.setdefault("steps", {}).setdefault(step, {}).update(counted)


@app.get("/api/pipelines/{name}")
def get_pipeline(name: str, history: Annotated[int, Query(ge=0, le=1000)] = 20) -> dict[str, Any]:
    """The pipeline's status and its last commits; each commit's and each pending txid's step
    tries and seconds as Airflow counts them wherever its DB answers."""
    with runtime(name) as rt:
        info = status(rt, shown=history)
        info["blocked"] = blocked_with_owner_state(rt)
        info["dag_id"] = single_dag(rt.pipeline.name)
        info["dag_ids"] = dags_of(rt.pipeline.name)
        owners = [e.get("run_id") for e in info["history"]] + [
            p.get("owner") for p in info["pending"]
        ]
        run_dags = with_dags(rt.pipeline.name, [r for r in owners if r])
        for row in (*info["history"], *info["pending"]):
            run = row.get("run_id") or row.get("owner")
            row["dag_id"] = run_dags.get(run) if run else info["dag_id"]
        pending = [p["txid"] for p in info["pending"]]
        tries = tries_by_txid(rt, [e["txid"] for e in info["history"]] + pending)
        now_ms = int(time.time() * 1000)
        for entry in info["history"]:
            as_airflow_counts(entry, tries.get(entry["txid"], []), now_ms)
        for row in info["pending"]:
            row["tries"] = tries_per_step(tries.get(row["txid"], []), now_ms)
        return info


@app.get("/api/pipelines/{name}/txids/{txid}")
def get_txid(name: str, txid: int) -> dict[str, Any]:
    """One txid's page: committed or pending; each partition's offset range and records; its
    commit (records, keys, quarantined, each step's tries and times); every run bound to it
    with its Airflow state, and the runs it was adopted from."""
    with runtime(name) as rt:
        if txid < 1 or txid > rt.ledger.last_txid():
            raise HTTPException(status_code=404, detail=f"txid {txid} is not known yet")
        states = run_states(rt.pipeline)
        bound = sorted(rt.ledger.runs_of_txid(txid).items())
        run_dags = with_dags(rt.pipeline.name, [run for run, _ in bound])
        dag_id = single_dag(rt.pipeline.name)
        if dag_id is None and len(set(run_dags.values()) - {None}) == 1:
            dag_id = next(iter(set(run_dags.values()) - {None}))
        out: dict[str, Any] = {"txid": txid, "pipeline": rt.pipeline.name, "dag_id": dag_id}
        metadata = rt.ledger.metadata(txid)
        out["partitions"] = _partitions((metadata or {}).get("ranges") or {})
        out["runs"] = [
            {
                "run_id": run,
                "dag_id": run_dags.get(run),
                "state": states(run),
                "adopted_by": adopter,
            }
            for run, adopter in bound
        ]
        tries = tries_by_txid(rt, [txid]).get(txid)
        now_ms = int(time.time() * 1000)
        if txid <= rt.ledger.committed_txid():
            entry = commit_entry(rt, txid)
            replays = replays_after_commit(rt, txid, entry) if entry else []
            if entry and tries:  # Airflow's count of every try, the failed ones included
                as_airflow_counts(entry, tries, now_ms)
                replays = replays_after(tries, entry["committed_ms"])
            if not out["partitions"] and entry and entry.get("ranges"):  # from its commit
                out["partitions"] = _partitions(entry["ranges"])
            if not out["partitions"]:
                out["partitions_note"] = (
                    "the ledger no longer holds this txid's offset ranges (a txid committed "
                    "before they were kept with its commit, or older than the history keeps)"
                )
            return {**out, "status": "committed", "commit": entry, "replays": replays}
        return {
            **out,
            "status": "pending",
            **pending_txid(rt, txid),
            "metadata": metadata,
            "steps": step_figures(tries or [], now_ms),  # Airflow's tries so far
        }


def _partitions(ranges: dict[str, list[int]]) -> list[dict[str, int]]:
    """A txid's offset ranges as the page's Partitions rows, partition by partition."""
    return [
        {"partition": int(p), "from": r[0], "to": r[1], "records": r[1] - r[0]}
        for p, r in sorted(ranges.items(), key=lambda i: int(i[0]))
    ]


async def current_user(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)],
) -> Any:
    """The Airflow user of the request (tests override it)."""
    return await get_user(request, None, credentials)


def may_edit_runs(user: Any, dag_id: str | None) -> bool:
    """Whether Airflow's auth manager lets ``user`` edit ``dag_id``'s runs - or, for None
    (a pipeline no DAG declares), every DAG's runs. None user: tests."""
    if user is None:
        return True
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import (
        DagAccessEntity,
        DagDetails,
    )

    details = DagDetails(id=dag_id) if dag_id is not None else None
    return get_auth_manager().is_authorized_dag(
        method="PUT", access_entity=DagAccessEntity.RUN, details=details, user=user
    )


def audit_log(
    dag_id: str | None,
    run_id: str | None,
    user: Any,
    extra: dict[str, Any],
    event: str = "tridentflow.release_txid",
) -> None:
    """An entry in Airflow's audit log (Browse -> Audit Log); best effort without a DB."""
    try:
        from airflow.models.log import Log
        from airflow.utils.session import create_session

        name = getattr(user, "get_name", lambda: None)() if user is not None else None
        with create_session() as session:
            session.add(
                Log(event=event, dag_id=dag_id, run_id=run_id,
                    owner=name, extra=json.dumps(extra))
            )  # fmt: skip
    except Exception as exc:  # the release stands; say the audit entry is missing
        log.warning("tridentflow: no audit-log entry for %s: %s", extra, one_line(exc))


def editable(name: str, user: Any, action: str) -> tuple[Pipeline, str | None]:
    """(the pipeline, its one DAG id or None) if ``user`` may edit the runs of every DAG that
    runs it (of every DAG, for a pipeline no DAG declares): 404 for an unknown pipeline, 403
    (naming ``action`` and the DAG) without the rights."""
    pipeline = known_pipelines().get(name)
    if pipeline is None:
        raise HTTPException(status_code=404, detail=f"no pipeline named {name!r}")
    dags = dags_of(pipeline.name)
    for dag_id in dags or [None]:
        if not may_edit_runs(user, dag_id):
            whose = f"{dag_id}'s runs" if dag_id else "every DAG's runs (no DAG runs it)"
            raise HTTPException(status_code=403, detail=f"{action} needs edit rights on {whose}")
    return pipeline, dags[0] if len(dags) == 1 else None


@app.post("/api/pipelines/{name}/txids/{txid}/release")
async def post_release(
    name: str, txid: int, user: Annotated[Any, Depends(current_user)]
) -> dict[str, Any]:
    """Release ``txid`` from its owner run when that run has finished in Airflow (409, one
    line, while it is alive or when nothing holds it), so the next run adopts it at once.
    Needs edit rights on the DAG's runs (403 otherwise); each release is an entry in Airflow's
    audit log (event ``tridentflow.release_txid``)."""
    pipeline, dag_id = editable(name, user, "releasing a txid")
    with runtime(pipeline) as rt:
        result = release_finished_owner(rt, txid, run_states(pipeline))
    owner = result["owner"]
    dag_id = (with_dags(name, [owner]).get(owner) if owner else None) or dag_id
    audit_log(dag_id, owner, user, {"pipeline": name, **result})
    return {**result, "dag_id": dag_id}


@app.post("/api/pipelines/{name}/rewind")
async def post_rewind(
    name: str,
    to: Annotated[int, Query(ge=0)],
    user: Annotated[Any, Depends(current_user)],
    force: bool = False,
) -> dict[str, Any]:
    """Rewind the pipeline to txid ``to`` (tridentflow.ops.rewind: the same checks and result
    as ``tridentflow rewind``; 409 with one line when refused, nothing changed). Needs edit
    rights on the DAG's runs (403 otherwise); each rewind is an entry in Airflow's audit log
    (event ``tridentflow.rewind``)."""
    from starlette.concurrency import run_in_threadpool

    from tridentflow.ops.rewind import rewind_pipeline

    pipeline, dag_id = editable(name, user, "rewinding a pipeline")
    with runtime(pipeline) as rt:
        report = await run_in_threadpool(rewind_pipeline, rt, to, force)
    result = report.to_json(name)
    audit_log(dag_id, None, user, result, event="tridentflow.rewind")
    return {**result, "dag_id": dag_id}


@app.post("/api/pipelines/{name}/reshard")
async def post_reshard(
    name: str,
    shards: Annotated[int, Query(ge=1)],
    user: Annotated[Any, Depends(current_user)],
) -> dict[str, Any]:
    """Move every state of the pipeline to ``shards`` shards (tridentflow.ops.reshard: the
    same checks, result and resumability as ``tridentflow reshard``; commits wait meanwhile;
    409 with one line when refused, nothing changed). Needs edit rights on the DAG's runs
    (403 otherwise); each reshard is an entry in Airflow's audit log (event
    ``tridentflow.reshard``)."""
    from starlette.concurrency import run_in_threadpool

    from tridentflow.ops.reshard import reshard

    pipeline, dag_id = editable(name, user, "resharding a pipeline")
    with runtime(pipeline) as rt:
        done = await run_in_threadpool(reshard, rt, shards)
    result = done.to_json()
    audit_log(dag_id, None, user, result, event="tridentflow.reshard")
    return {**result, "dag_id": dag_id}


def commit_entry(rt: Runtime, txid: int) -> dict[str, Any] | None:
    """A committed txid's entry in the ledger's history (None once it is older than the
    history keeps)."""
    return next((e for e in rt.ledger.history(1000) if e["txid"] == txid), None)


@app.get("/api/pipelines/{name}/state/{state}")
def get_state(
    name: str,
    state: str,
    key: Annotated[list[str] | None, Query()] = None,
    as_of: Annotated[int | None, Query(ge=0)] = None,
) -> dict[str, Any]:
    """The committed values of ``key``s (``as_of``: right after that retained txid)."""
    from tridentflow.steps.query import parse_key, pick_state, query, query_as_of

    with runtime(name) as rt:
        persist = pick_state(rt, state)
        keys = [parse_key(k, persist) for k in key or ()]
        if persist.group_fields and not keys:
            raise HTTPException(status_code=400, detail="give ?key=... (one per key)")
        if as_of is None:
            committed, values = query(rt, persist, keys)
        else:
            committed, values = query_as_of(rt, persist, keys, as_of)
        return {
            "state": persist.state.name,
            "committed_txid": committed,
            "values": [
                {"key": list(k), "value": v} for k, v in zip(keys or [()], values, strict=True)
            ],
        }


@app.get("/api/pipelines/{name}/quarantine")
def get_quarantine(name: str, limit: Annotated[int, Query(ge=1, le=1000)] = 50) -> dict[str, Any]:
    with runtime(name) as rt:
        entries = []
        for _field, raw in rt.client.hscan_iter(rt.keyspace.quarantine, count=500):
            entries.append(json.loads(raw))
            if len(entries) >= limit:
                break
        entries.sort(key=lambda e: (e["partition"], e["offset"]))
        return {"total": rt.ledger.quarantined(), "entries": entries}


@app.post("/api/pipelines/{name}/audit")
def post_audit(name: str) -> dict[str, Any]:
    from tridentflow.ops.audit import audit

    with runtime(name) as rt:
        report = audit(rt)
        return {
            "committed_txid": report.committed_txid,
            "records": report.records,
            "keys": report.keys,
            "lost": report.lost,
            "doubled": report.doubled,
            "mismatched": [list(m) for m in report.mismatched[:100]],
            "unaudited": report.unaudited,
            "unreadable": {str(p): r for p, r in report.unreadable.items()},
            "ok": report.ok,
            "line": report.line(),
        }


def pipeline_of_dag(dag_id: str) -> Pipeline:
    """The pipeline ``dag_id`` runs, as it declares it: 409 (one line, not configured) if it
    does not load here, 404 if the DAG runs no tridentflow pipeline."""
    cat = catalog()
    if dag_id in cat.not_configured:
        raise NotConfiguredHTTPError(
            status_code=409,
            detail=f"DAG {dag_id} runs a tridentflow pipeline the api-server cannot load: "
            f"{cat.not_configured[dag_id]}",
        )
    name = cat.pipeline_of.get(dag_id)
    if name is None and not cat.from_airflow:  # no metadata DB: the default DAG ids
        name = next((n for n in cat.pipelines if default_dag_id(n) == dag_id), None)
    if name is None:
        raise HTTPException(status_code=404, detail=f"DAG {dag_id!r} runs no tridentflow pipeline")
    return cat.pipelines[name]


def run_id_of(raw: str) -> str:
    """A run id as the tab's URL brought it: Airflow 3.1 puts it there unencoded, so the ``+``
    of ``+00:00`` arrives as a space - and a run id never holds a space (Airflow's
    ``allowed_run_id_pattern``)."""
    return raw.replace(" ", "+")


@app.get("/api/runs/{dag_id}/{run_id}")
def get_run(dag_id: str, run_id: str) -> dict[str, Any]:
    """What the run of ``dag_id`` bound and committed, from the ledger (a cleared task's
    XCom is gone; this is not)."""
    pipeline = pipeline_of_dag(dag_id)
    run_id = run_id_of(run_id)
    with runtime(pipeline) as rt:
        out: dict[str, Any] = {"dag_id": dag_id, "run_id": run_id, "pipeline": pipeline.name}
        lost = rt.ledger.lost_txid(run_id)
        txid = rt.ledger.txid_of_run(run_id)
        rewound = rt.ledger.rewound_txid(run_id)
        if rewound is not None:
            return {**out, "txid": rewound[0], "status": "rewound", "rewound_to": rewound[1]}
        if lost is not None:
            return {**out, "txid": lost[0], "status": "adopted", "adopted_by": lost[1]}
        if txid is None:
            return {**out, "txid": None, "status": "unbound"}
        tries = tries_by_txid(rt, [txid]).get(txid, [])
        now_ms = int(time.time() * 1000)
        if txid <= rt.ledger.committed_txid():
            entry = commit_entry(rt, txid)
            if entry:
                as_airflow_counts(entry, tries, now_ms)
            return {**out, "txid": txid, "status": "committed", "commit": entry}
        pending = {**pending_txid(rt, txid), "tries": tries_per_step(tries, now_ms)}
        return {**out, "txid": txid, "status": "pending", "pending": pending}


@app.get("/api/pipelines/{name}/state/{state}/keys")
def list_state_page(
    name: str,
    state: str,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    after: str | None = None,
    as_of: Annotated[int | None, Query(ge=0)] = None,
) -> dict[str, Any]:
    """A page of every key of a state with its committed value (``after``: the cursor the
    previous page returned as ``next``). ``as_of``: every key as of that retained txid, in
    one page (no ``after``)."""
    from tridentflow.steps.query import list_state, list_state_as_of, pick_state

    with runtime(name) as rt:
        persist = pick_state(rt, state)
        if as_of is not None:
            if after is not None:
                raise HTTPException(status_code=400, detail="as_of lists in one page: no after")
            return list_state_as_of(rt, persist, as_of).to_json(persist.state.name)
        return list_state(rt, persist, limit, after).to_json(persist.state.name)


@app.get(METRICS_PATH, response_class=Response)
def get_metrics() -> Response:
    """Every pipeline's figures in Prometheus text format (``tridentflow_up`` 0 with the
    reason left out for a pipeline that cannot be read: the others still report)."""
    try:
        opener = partial(
            Runtime.open, redis_url=view_redis_url(), connections=airflow_connections()
        )
    except HTTPException as exc:  # every pipeline down, for the one reason
        opener = partial(_unreadable, str(exc.detail))
    openers = [(p.name, partial(opener, p)) for p in known_pipelines().values()]
    text = metrics.prometheus_text(metrics.collect(openers, read_deadline_s()))
    return Response(content=text, media_type=metrics.PROMETHEUS_CONTENT_TYPE)


def _unreadable(reason: str, _pipeline: Pipeline) -> Runtime:
    raise TridentflowError(reason)


@app.get("/ui", include_in_schema=False)
@app.get("/run", include_in_schema=False)
@app.get("/txid", include_in_schema=False)
def page() -> FileResponse:
    """The one page (it shows a pipeline at /ui, a DAG run's txid at /run, one txid's page at
    /txid?pipeline=P&txid=N)."""
    return FileResponse(PAGE, media_type="text/html")
