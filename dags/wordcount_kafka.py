"""The word count of Kafka topic ``wordcount`` (brokers from the ``kafka_default`` connection:
its extra JSON holds the confluent-kafka settings, as the apache-kafka provider's): coordinate
-> emit -> commit. A txid is a fixed offset range per partition, replayed exactly on a retry."""

from __future__ import annotations

from tridentflow_airflow import pipeline_dag

dag = pipeline_dag("wordcount-kafka", schedule=None)
