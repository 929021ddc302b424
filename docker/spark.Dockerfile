# Spark master, worker and Spark Connect server: the pinned pyspark (its jars and bin/) on the
# same Python as the Airflow image, so the driver (spark-submit in Airflow, or the Connect
# client) and the executors run one Python minor version - PySpark refuses a mismatch.
# PYTHON_VERSION and the pyspark pin must match docker/airflow.Dockerfile (tests/test_compose.py).
ARG PYTHON_VERSION=3.11
FROM python:${PYTHON_VERSION}-slim-bookworm
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
 && rm -rf /var/lib/apt/lists/*
ENV JAVA_HOME=/usr/lib/jvm/java-17-openjdk-amd64
# what tridentflow's executors import besides tridentflow itself (mounted at /opt/tridentflow);
# confluent-kafka: read tasks of a KafkaSource consume on the executors
RUN pip install --no-cache-dir "pyspark==4.3.0" "redis>=5,<9" "pyarrow>=15" "pandas<3" "confluent-kafka>=2.16,<3" \
 && python -c "import pyspark; assert pyspark.__version__ == '4.3.0', pyspark.__version__"
ENV SPARK_HOME=/usr/local/lib/python${PYTHON_VERSION}/site-packages/pyspark
ENV PATH=${SPARK_HOME}/bin:${SPARK_HOME}/sbin:${PATH}
ENV PYTHONPATH=/opt/tridentflow
# Executors only read the shared home (the log; staging is the Airflow tasks'); they run as the
# Airflow image's uid and group 0 all the same, so nothing they might create there is foreign.
# Spark's own scratch (worker dirs, logs, pids) goes to the user's home: site-packages is root's.
RUN useradd --uid 50000 --gid 0 --create-home spark
ENV SPARK_WORKER_DIR=/home/spark/work SPARK_LOG_DIR=/home/spark/logs SPARK_PID_DIR=/home/spark
USER 50000:0
WORKDIR /home/spark
