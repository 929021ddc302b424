"""Development and test infrastructure: what brings up the parts a pipeline talks to on one
machine, and what attacks them - never what an operator of a real deployment runs.

``devredis`` (a redis-server), ``devcluster`` (a Redis Cluster whose replication can lag),
``devkafka`` (Tansu, a Kafka-protocol broker), ``devpostgres`` (a PostgreSQL server),
``connect_server`` (a Spark Connect server), ``sample_data`` (sentences for demos and
benchmarks) and ``chaos`` (the fault-schedule harness). The CLI keeps its ``dev-*``,
``spark-connect`` and ``chaos`` commands over them.
"""
