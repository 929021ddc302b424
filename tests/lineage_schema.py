"""Validates OpenLineage events against OpenLineage's JSON schemas, offline: the event against
``OpenLineage.json`` (tests/openlineage_spec), and every facet whose schema is known - the
standard facets, the Airflow provider's, tridentflow's own - against its schema, found by the
file its ``_schemaURL`` names."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from referencing import Registry, Resource

from tridentflow_airflow.lineage import FACET_SCHEMAS

SPEC = Path(__file__).with_name("openlineage_spec")
EVENT_SCHEMA = "https://openlineage.io/spec/2-0-2/OpenLineage.json"


def _schema_files() -> dict[str, tuple[str, dict[str, Any]]]:
    """File name -> (the id it is registered under, the schema)."""
    import airflow.providers.openlineage.facets as airflow_facets

    found: dict[str, tuple[str, dict[str, Any]]] = {}
    folders = [SPEC / "facets", Path(airflow_facets.__file__).parent, FACET_SCHEMAS]
    for path in [SPEC / "OpenLineage.json", *(p for f in folders for p in f.glob("*.json"))]:
        schema = json.loads(path.read_text())
        found[path.name] = (schema.get("$id") or f"urn:facet-schema:{path.name}", schema)
    return found


SCHEMAS = _schema_files()
REGISTRY: Registry = Registry().with_resources(
    (uri, Resource.from_contents(schema)) for uri, schema in SCHEMAS.values()
)


def _check(instance: Any, ref: str) -> None:
    Draft202012Validator(
        {"$ref": ref}, registry=REGISTRY, format_checker=Draft202012Validator.FORMAT_CHECKER
    ).validate(instance)


def facets_of(event: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every facet of ``event``: (where/name, facet)."""
    for where, facets in (("run", event["run"].get("facets")), ("job", event["job"].get("facets"))):
        for name, facet in (facets or {}).items():
            yield f"{where}.{name}", facet
    for kind in ("inputs", "outputs"):
        for dataset in event.get(kind) or ():
            for group in ("facets", "inputFacets", "outputFacets"):
                for name, facet in (dataset.get(group) or {}).items():
                    yield f"{kind}[{dataset['name']}].{group}.{name}", facet


def validate_event(event: dict[str, Any]) -> dict[str, str]:
    """Raise jsonschema.ValidationError unless ``event`` is a valid RunEvent whose facets
    with a known schema are valid. Returns where/name -> the schema file each facet was
    validated against (facets whose schema is unknown are left out)."""
    _check(event, f"{EVENT_SCHEMA}#/$defs/RunEvent")
    checked: dict[str, str] = {}
    for name, facet in facets_of(event):
        url = str(facet.get("_schemaURL", ""))
        file_name = url.split("#")[0].rsplit("/", 1)[-1]
        if file_name not in SCHEMAS or "#" not in url or file_name == "OpenLineage.json":
            continue
        uri, _ = SCHEMAS[file_name]
        _check(facet, f"{uri}#{url.split('#', 1)[1]}")
        checked[name] = file_name
    return checked


def read_events(path: Path) -> list[dict[str, Any]]:
    """The events a file transport (``append``: one JSON event per line) wrote."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def task_events(events: list[dict[str, Any]], dag_id: str, task_id: str) -> list[dict[str, Any]]:
    """The events of one task (job name ``DAG.TASK``), in the order written."""
    return [e for e in events if e["job"]["name"] == f"{dag_id}.{task_id}"]
