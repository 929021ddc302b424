#!/usr/bin/env bash
# Create (or refresh) the project's virtualenv in .venv and install tridentflow into it.
# Idempotent: a stamp keyed on pyproject.toml, constraints/dev.txt and this script skips the
# install when they are unchanged.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${TRIDENTFLOW_VENV:-$ROOT/.venv}"
CONSTRAINTS="$ROOT/constraints/dev.txt"
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3

command -v java >/dev/null 2>&1 || { echo "bootstrap: Java 17 is required for Spark (java not on PATH)" >&2; exit 1; }

stamp_of() { cat "$ROOT/pyproject.toml" "$ROOT/scripts/bootstrap.sh" "$CONSTRAINTS" | sha256sum | cut -c1-16; }
want="$(stamp_of)"
have="$(cat "$VENV/.tridentflow-stamp" 2>/dev/null || true)"

if [ ! -x "$VENV/bin/python" ]; then
  echo "bootstrap: creating $VENV" >&2
  "$PYTHON" -m venv "$VENV"
fi
if [ "$want" != "$have" ]; then
  echo "bootstrap: installing dependencies into $VENV (a few minutes on a new machine)" >&2
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -U pip
  # The ranges of pyproject.toml, at the exact versions of constraints/dev.txt. Nothing is
  # reinstalled afterwards: no dependency brings a second copy of pyspark's files.
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -c "$CONSTRAINTS" -e "$ROOT[dev]"
  echo "$want" > "$VENV/.tridentflow-stamp"
else
  # Cheap: make sure this clone (not another one) is what the venv imports.
  if ! (cd / && "$VENV/bin/python" -c "import tridentflow,sys; sys.exit(0 if tridentflow.__file__.startswith('$ROOT/') else 1)") 2>/dev/null; then
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps -e "$ROOT"
  fi
fi

want_spark="$(sed -n 's/^pyspark==//p' "$CONSTRAINTS")"
got="$("$VENV/bin/python" -c 'import pyspark; print(pyspark.__version__)')"
if [ "$got" != "$want_spark" ]; then
  echo "bootstrap: pyspark.__version__ is $got, constraints/dev.txt says $want_spark" >&2
  exit 1
fi
if "$VENV/bin/python" -m pip show -q pyspark-client >/dev/null 2>&1; then
  echo "bootstrap: $VENV holds pyspark-client (an older set-up), whose files overwrite pyspark's:" \
       "remove $VENV and run this again" >&2
  exit 1
fi
[ -x "$VENV/bin/spark-submit" ] || { echo "bootstrap: spark-submit missing from $VENV/bin" >&2; exit 1; }
