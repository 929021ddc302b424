"""OpenLineage for tridentflow's tasks: what each step of a txid read and wrote
(tridentflow.steps.lineage) as the OperatorLineage Airflow's OpenLineage provider asks the
operators for (``get_openlineage_facets_on_start/complete/failure``).

Imported only from those methods, which only that provider calls: an Airflow without it
never imports OpenLineage. Every event carries the run facet ``tridentflow`` (pipeline, step,
txid, Airflow try, replayed, guarantee); each source dataset the input facets
``tridentflowOffsets`` (the txid's [start, end) per partition) and ``inputStatistics``
(records, where the step counted them). The facets' JSON schemas ship beside this module
(``facets/``); their ``_schemaURL`` is the schema's ``$id``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attr
from airflow.providers.openlineage.extractors import OperatorLineage
from openlineage.client.event_v2 import InputDataset, OutputDataset
from openlineage.client.generated.base import InputDatasetFacet, RunFacet
from openlineage.client.generated.input_statistics_input_dataset import (
    InputStatisticsInputDatasetFacet,
)

from tridentflow.steps.lineage import StepLineage

FACET_SCHEMAS = Path(__file__).with_name("facets")
"""The JSON schemas of tridentflow's facets (shipped with the distribution)."""
SCHEMA_BASE = "https://tridentflow.github.io/spec/facets/1-0-0/"
RUN_FACET = "tridentflow"
OFFSETS_FACET = "tridentflowOffsets"


@attr.define
class TridentflowRunFacet(RunFacet):
    """The txid behind an Airflow task's run: schema ``facets/TridentflowRunFacet.json``."""

    pipeline: str
    step: str
    txid: int | None
    attempt: int
    replayed: bool
    guarantee: str

    @staticmethod
    def _get_schema() -> str:
        return SCHEMA_BASE + "TridentflowRunFacet.json#/$defs/TridentflowRunFacet"


@attr.define
class TridentflowOffsetsInputDatasetFacet(InputDatasetFacet):
    """A txid's records of one source dataset, [start, end) per partition: schema
    ``facets/TridentflowOffsetsInputDatasetFacet.json``."""

    txid: int
    ranges: list[dict[str, int]]

    @staticmethod
    def _get_schema() -> str:
        return (
            SCHEMA_BASE
            + "TridentflowOffsetsInputDatasetFacet.json#/$defs/TridentflowOffsetsInputDatasetFacet"
        )


def operator_lineage(lineage: StepLineage, attempt: int) -> OperatorLineage:
    """OpenLineage's inputs, outputs and run facet for one step of a txid."""
    inputs = [_input(lineage, d) for d in lineage.inputs]
    outputs = [OutputDataset(namespace=d.namespace, name=d.name) for d in lineage.outputs]
    facet = TridentflowRunFacet(
        pipeline=lineage.pipeline,
        step=lineage.step,
        txid=lineage.txid,
        attempt=max(1, int(attempt)),
        replayed=lineage.replayed,
        guarantee=lineage.guarantee,
    )
    return OperatorLineage(inputs=inputs, outputs=outputs, run_facets={RUN_FACET: facet})


def _input(lineage: StepLineage, dataset: Any) -> InputDataset:
    facets: dict[str, InputDatasetFacet] = {}
    ranges = lineage.ranges_of(dataset)
    if lineage.txid is not None and ranges:
        facets[OFFSETS_FACET] = TridentflowOffsetsInputDatasetFacet(
            txid=lineage.txid,
            ranges=[
                {"partition": p, "start": start, "end": end}
                for p, (start, end) in sorted(ranges.items())
            ],
        )
    if lineage.records is not None and len(lineage.inputs) == 1:
        facets["inputStatistics"] = InputStatisticsInputDatasetFacet(rowCount=lineage.records)
    return InputDataset(namespace=dataset.namespace, name=dataset.name, inputFacets=facets)
