# Airflow 3.3.2 + Java 17 + the pinned tridentflow dependencies (see pyproject.toml).
# PYTHON_VERSION must match the python3 of the Spark image (PySpark needs the same minor
# version on the driver and the executors).
ARG PYTHON_VERSION=3.11
FROM apache/airflow:3.3.2-python${PYTHON_VERSION}

USER root
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
 && rm -rf /var/lib/apt/lists/*
ENV JAVA_HOME=/usr/lib/jvm/java-17-openjdk-amd64

USER airflow
COPY --chown=airflow:root pyproject.toml README.md /opt/tridentflow/
COPY --chown=airflow:root constraints /opt/tridentflow/constraints
COPY --chown=airflow:root state /opt/tridentflow/state
COPY --chown=airflow:root tridentflow /opt/tridentflow/tridentflow
COPY --chown=airflow:root spark_jobs /opt/tridentflow/spark_jobs
COPY --chown=airflow:root plugins /opt/tridentflow/plugins
# Same recipe as scripts/bootstrap.sh: the distribution with its Airflow extra, at the exact
# versions of constraints/dev.txt (apache-airflow==3.3.2, pyspark==4.3.0); nothing reinstalled.
RUN pip install --no-cache-dir -c /opt/tridentflow/constraints/dev.txt \
      "/opt/tridentflow[airflow,postgres,kafka]" \
 && python -c "import pyspark; assert pyspark.__version__ == '4.3.0', pyspark.__version__"
# The mounted sources (docker-compose.yaml: state/ as tridentflow_state, spark_jobs/ as
# tridentflow_spark_jobs, the import names the distribution installs) win over the installed copy.
ENV PYTHONPATH=/opt/tridentflow:/opt/airflow/plugins
