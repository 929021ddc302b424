"""Refuses a backfill that runs backwards on a tridentflow DAG where Airflow's UI and REST API
create it (``POST /api/v2/backfills`` and its ``/dry_run``), before any run exists: 422 with
one line, as Airflow refuses a backwards backfill of a DAG with ``depends_on_past``. A
tridentflow run binds the next txid, so runs started latest date first would bind txids
against the dates. (The CLI creates backfills in-process, past the API server: there the
coordinators refuse the runs, tridentflow_airflow.dated_order.)

An ASGI middleware of the API server (the plugin's ``fastapi_root_middlewares``): it reads
only these two routes' bodies, and answers only callers Airflow's auth manager accepts -
anyone else gets Airflow's own answer (401/403) unchanged.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

BACKFILL_ROUTES = ("/api/v2/backfills", "/api/v2/backfills/dry_run")
OPERATOR_MODULE = "tridentflow_airflow.operators"


def backwards_refusal(dag_id: str) -> str:
    """The one line a backwards backfill of ``dag_id`` is refused with."""
    return (
        f"{dag_id} is a tridentflow DAG: a backfill cannot run backwards - each run binds the "
        "next txid, so txids would run against the dates; create it without run_backwards "
        "(its runs then bind txids in date order, and completed runs replay as no-ops)"
    )


def is_tridentflow_dag(dag_id: str) -> bool:
    """Whether ``dag_id``'s latest serialized DAG runs tridentflow's operators."""
    from airflow.models.serialized_dag import SerializedDagModel
    from airflow.utils.session import create_session

    with create_session() as session:
        found = session.scalar(SerializedDagModel.latest_item_select_object(dag_id))
        if found is None:
            return False
        return any(getattr(task, "_task_module", "") == OPERATOR_MODULE for task in found.dag.tasks)


def runs_backwards(request: dict[str, Any]) -> bool:
    """Whether Airflow reads the backfill request as running backwards: its own field's
    parsing decides (``"true"``, ``1``, ``"yes"`` are true there, as JSON's ``true``); a
    value it refuses is left to Airflow, which answers 422 itself."""
    value = request.get("run_backwards", False)
    try:
        from pydantic import TypeAdapter, ValidationError
    except ImportError:  # pragma: no cover - Airflow's API server always has pydantic
        return value is True
    try:
        from airflow.api_fastapi.core_api.datamodels.backfills import BackfillPostBody

        field = BackfillPostBody.model_fields["run_backwards"]
        adapter: Any = TypeAdapter(field.annotation)
    except Exception:  # another Airflow: its field is a plain bool
        adapter = TypeAdapter(bool)
    try:
        return bool(adapter.validate_python(value))
    except ValidationError:
        return False


async def authenticated(scope: Scope) -> bool:
    """Whether Airflow's auth manager accepts the request's token (``Authorization: Bearer``
    or the UI's cookie), as its own routes check."""
    from airflow.api_fastapi.auth.managers.base_auth_manager import COOKIE_NAME_JWT_TOKEN
    from airflow.api_fastapi.core_api.security import resolve_user_from_token
    from starlette.requests import Request

    request = Request(scope)
    header = request.headers.get("authorization", "")
    token = header[7:] if header.lower().startswith("bearer ") else None
    token = token or request.cookies.get(COOKIE_NAME_JWT_TOKEN)
    try:
        await resolve_user_from_token(token)
    except Exception:
        return False
    return True


async def refusal(scope: Scope, body: bytes) -> str | None:
    """The refusal of this backfill request, or None to let Airflow handle it."""
    try:
        request = json.loads(body or b"{}")
    except ValueError:
        return None  # Airflow answers a malformed body itself
    if not isinstance(request, dict) or not runs_backwards(request):
        return None
    dag_id = request.get("dag_id")
    if not isinstance(dag_id, str) or not await authenticated(scope):
        return None
    import anyio.to_thread

    if not await anyio.to_thread.run_sync(is_tridentflow_dag, dag_id):
        return None
    return backwards_refusal(dag_id)


class BackfillGuard:
    """The middleware: see the module doc."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = str(scope.get("path", "")).rstrip("/")
        if (
            scope["type"] != "http"
            or scope.get("method") != "POST"
            or not path.endswith(BACKFILL_ROUTES)
        ):
            await self.app(scope, receive, send)
            return
        messages: list[Message] = []
        body = b""
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        refused = await refusal(scope, body)
        if refused is not None:
            log.warning("tridentflow: %s", refused)
            payload = json.dumps({"detail": refused}).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 422,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(payload)).encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": payload})
            return

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)
