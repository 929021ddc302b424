# Source me: puts the project's venv first on PATH and sets what Spark and Airflow need here.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${TRIDENTFLOW_VENV:-$ROOT/.venv}"
export PATH="$VENV/bin:$PATH"
export SPARK_LOCAL_IP="${SPARK_LOCAL_IP:-127.0.0.1}"
export PYSPARK_PYTHON="${PYSPARK_PYTHON:-$VENV/bin/python}"
export PYSPARK_DRIVER_PYTHON="${PYSPARK_DRIVER_PYTHON:-$VENV/bin/python}"
export TRIDENTFLOW_HOME="${TRIDENTFLOW_HOME:-$ROOT/.tridentflow}"
