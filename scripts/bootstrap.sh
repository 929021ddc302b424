#!/usr/bin/env bash
# Create (or refresh) the project's virtualenv in .venv and install tridentflow into it.
# Idempotent: a stamp keyed on pyproject.toml and this script skips the install when unchanged.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${TRIDENTFLOW_VENV:-$ROOT/.venv}"
PYSPARK_PIN="4.3.0"
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3

command -v java >/dev/null 2>&1 || { echo "bootstrap: Java 17 is required for Spark (java not on PATH)" >&2; exit 1; }

stamp_of() { cat "$ROOT/pyproject.toml" "$ROOT/scripts/bootstrap.sh" | sha256sum | cut -c1-16; }
want="$(stamp_of)"
have="$(cat "$VENV/.tridentflow-stamp" 2>/dev/null || true)"

if [ ! -x "$VENV/bin/python" ]; then
  echo "bootstrap: creating $VENV" >&2
  "$PYTHON" -m venv "$VENV"
fi
if [ "$want" != "$have" ]; then
  echo "bootstrap: installing dependencies into $VENV (a few minutes on a new machine)" >&2
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -U pip
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e "$ROOT[dev]"
  # apache-airflow-providers-apache-spark[pyspark] drags in pyspark-client, which overwrites
  # pyspark's Python files with 4.2.0 ones. Put the pinned pyspark back (never uninstall the client).
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps "pyspark==$PYSPARK_PIN"
  echo "$want" > "$VENV/.tridentflow-stamp"
else
  # Cheap: make sure this clone (not another one) is what the venv imports.
  if ! (cd / && "$VENV/bin/python" -c "import tridentflow,sys; sys.exit(0 if tridentflow.__file__.startswith('$ROOT/') else 1)") 2>/dev/null; then
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps -e "$ROOT"
  fi
fi

got="$("$VENV/bin/python" -c 'import pyspark; print(pyspark.__version__)')"
if [ "$got" != "$PYSPARK_PIN" ]; then
  echo "bootstrap: pyspark.__version__ is $got, expected $PYSPARK_PIN" >&2
  exit 1
fi
[ -x "$VENV/bin/spark-submit" ] || { echo "bootstrap: spark-submit missing from $VENV/bin" >&2; exit 1; }
