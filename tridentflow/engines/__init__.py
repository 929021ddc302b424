"""Engines: the interface (``base``), the shared record stage (``tasks``), the batch-operation
graph (``graph``, ``batchops``), and two engines: ``local`` and ``spark`` (its graph on RDDs,
``rdds``, or DataFrames, ``frames``; executors staging in Redis, ``blocks``)."""
