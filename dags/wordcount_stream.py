"""The word count over Redis Streams (``tridentflow:wordcount-stream:p0..p3``, field
``sentence``): an opaque source, so a missing stream is skipped and caught up later. Trigger it
from the UI, or schedule it to drain what producers XADDed meanwhile."""

from __future__ import annotations

from tridentflow_airflow import pipeline_dag

dag = pipeline_dag("wordcount-stream", schedule=None)
