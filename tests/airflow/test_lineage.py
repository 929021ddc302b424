"""The operators' OpenLineage (tridentflow_airflow.lineage): what they hand Airflow's
OpenLineage provider, made into RunEvents by OpenLineage's own client and validated against
OpenLineage's JSON schemas and tridentflow's facet schemas (tests/lineage_schema.py). The
events the provider really emits under Airflow are validated in tests/airflow/
test_airflow_runs.py (a run, a failure, a replay)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import jsonschema
import pytest
from openlineage.client.event_v2 import Job, Run, RunEvent, RunState
from openlineage.client.serde import Serde

from tests.helpers import produce, runtime, sentences
from tests.lineage_schema import validate_event
from tridentflow.steps.lineage import step_lineage
from tridentflow.steps.runs import commit_run, coordinate_run
from tridentflow_airflow.lineage import TridentflowRunFacet, operator_lineage

pytestmark = pytest.mark.airflow


def as_event(lineage, state: RunState = RunState.COMPLETE) -> dict:
    event = RunEvent(
        eventType=state,
        eventTime=datetime.now(UTC).isoformat(),
        run=Run(runId=str(uuid.uuid4()), facets=lineage.run_facets),
        job=Job(namespace="tridentflow-test", name="tridentflow_wordcount.commit"),
        inputs=lineage.inputs,
        outputs=lineage.outputs,
        producer="https://github.com/apache/airflow/tree/providers-openlineage/2.20.3",
    )
    return Serde.to_dict(event)


def test_every_steps_lineage_makes_a_valid_event_with_tridentflows_facets(
    redis_url, redis_client, home
):
    from tridentflow.engines.local import LocalEngine
    from tridentflow.steps.runs import emit_run, emit_summary

    rt = runtime("wordcount", redis_url, home)
    produce(rt, sentences(30, seed=1))
    results = {"coordinate": coordinate_run(rt, "run-1")}
    results["emit"] = emit_summary(rt, 1, emit_run(rt, "run-1", LocalEngine()))
    results["commit"] = commit_run(rt, "run-1")
    for step, result in results.items():
        event = as_event(operator_lineage(step_lineage(rt, step, "run-1", result), attempt=2))
        checked = validate_event(event)
        assert checked["run.tridentflow"] == "TridentflowRunFacet.json", step
        facet = event["run"]["facets"]["tridentflow"]
        assert facet["_schemaURL"].endswith("TridentflowRunFacet.json#/$defs/TridentflowRunFacet")
        assert (facet["step"], facet["txid"], facet["attempt"], facet["replayed"]) == (
            step, 1, 2, False,
        )  # fmt: skip
        (source,) = event["inputs"]
        offsets = source["inputFacets"]["tridentflowOffsets"]
        assert checked[f"inputs[{source['name']}].inputFacets.tridentflowOffsets"]
        assert sum(r["end"] - r["start"] for r in offsets["ranges"]) == 30
    assert event["outputs"] == [
        {"namespace": redis_url.removesuffix("/0"), "name": rt.keyspace.state("counts"),
         "facets": {}, "outputFacets": {}}
    ]  # fmt: skip
    replay = as_event(
        operator_lineage(step_lineage(rt, "commit", "run-1", commit_run(rt, "run-1")), 1)
    )
    validate_event(replay)
    assert replay["run"]["facets"]["tridentflow"]["replayed"] is True


def test_the_validator_refuses_a_facet_that_breaks_its_schema(redis_url, redis_client, home):
    """The schema check can fail: a facet without replayed, a txid or an attempt of 0, an
    unknown step, a range without its end, a run id that is no UUID are each refused."""
    rt = runtime("wordcount", redis_url, home)
    produce(rt, sentences(5, seed=2))
    event = as_event(
        operator_lineage(step_lineage(rt, "coordinate", "r", coordinate_run(rt, "r")), 1)
    )
    validate_event(event)
    breakages = [
        lambda e: e["run"]["facets"]["tridentflow"].pop("replayed"),
        lambda e: e["run"]["facets"]["tridentflow"].update(txid=0),
        lambda e: e["run"]["facets"]["tridentflow"].update(attempt=0),
        lambda e: e["run"]["facets"]["tridentflow"].update(step="publish"),
        lambda e: e["inputs"][0]["inputFacets"]["tridentflowOffsets"]["ranges"][0].pop("end"),
        lambda e: e["run"].update(runId="not-a-uuid"),
    ]
    for breakage in breakages:
        broken = as_event(
            operator_lineage(step_lineage(rt, "coordinate", "r", coordinate_run(rt, "r")), 1)
        )
        breakage(broken)
        with pytest.raises(jsonschema.ValidationError):
            validate_event(broken)


def test_the_run_facet_names_its_schema_which_ships_with_the_distribution():
    facet = TridentflowRunFacet(
        pipeline="p", step="commit", txid=None, attempt=1, replayed=False, guarantee="refused"
    )
    assert facet._schemaURL.split("#")[0].endswith("/TridentflowRunFacet.json")


def test_the_spark_jobs_parent_never_fails_an_emit():
    """Without a task instance to name (the provider cannot tell), the emit's Spark conf is
    left as it was: lineage never fails an emit."""
    from tridentflow_airflow.operators import lineage_parent_conf

    conf = {"spark.ui.enabled": "false"}
    assert lineage_parent_conf(conf, {}) == conf
    assert lineage_parent_conf(None, {}) == {}
