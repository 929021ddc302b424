# Spark master/worker: the official apache/spark image plus what tridentflow's executors import.
ARG SPARK_IMAGE=apache/spark:4.3.0-scala2.13-java17-python3-ubuntu
FROM ${SPARK_IMAGE}
USER root
RUN python3 -m pip install --no-cache-dir "redis>=5,<9"
USER spark
ENV PYTHONPATH=/opt/tridentflow
