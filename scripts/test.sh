#!/usr/bin/env bash
# The test command: set everything up from a clean clone, lint, run the whole suite (what CI
# runs). Tests start their own redis-server on free ports; Spark runs in local mode.
#
#   scripts/test.sh            the whole suite, but the chaos soaks
#   scripts/test.sh --fast     the fast lane for every change: no JVM (a `java` that refuses
#                              to start is put first: a test that needs Spark and is not
#                              marked `spark` fails here), no Airflow, no browser, no wheel,
#                              no server topology of a test's own (`servers`: a Redis
#                              Cluster, replicas, TLS or ACL, a Kafka broker - the suite runs
#                              them), no chaos soak (the planted-bug chaos tests stay)
#   scripts/test.sh --matrix   the supported range on vanilla installs (tests/test_versions.py:
#                              the oldest and newest Airflow line, the oldest pyspark); CI
#                              runs it after the whole suite
#   scripts/test.sh --soak     the chaos soaks (many schedules per family; the planted-bug
#                              chaos tests stay in the suite); CI runs it after the matrix
# Any other arguments go to pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
FAST=""
MATRIX=""
SOAK=""
if [ "${1:-}" = "--fast" ]; then
  FAST=1
  shift
elif [ "${1:-}" = "--matrix" ]; then
  MATRIX=1
  shift
elif [ "${1:-}" = "--soak" ]; then
  SOAK=1
  shift
fi
bash "$ROOT/scripts/bootstrap.sh"
[ -n "$FAST" ] || bash "$ROOT/scripts/chromium.sh"  # the matrix reads the view in it too
# shellcheck source=scripts/env.sh
source "$ROOT/scripts/env.sh"
cd "$ROOT"
ruff check .
ruff format --check .
status=0
if [ -n "$FAST" ]; then
  nojvm="$(mktemp -d)"
  trap 'rm -rf "$nojvm"' EXIT
  mkdir -p "$nojvm/bin"
  printf '#!/bin/sh\necho "the fast lane starts no JVM: mark the test spark" >&2\nexit 97\n' \
    > "$nojvm/bin/java"
  chmod +x "$nojvm/bin/java"
  lane="not spark and not airflow and not wheel and not servers and not soak and not matrix"
  TRIDENTFLOW_TEST_LANE=fast JAVA_HOME="$nojvm" PATH="$nojvm/bin:$PATH" python -m pytest -n "${TRIDENTFLOW_TEST_WORKERS:-2}" \
    --dist loadgroup -m "$lane" --ignore=tests/airflow "$@" || status=$?
elif [ -n "$MATRIX" ]; then
  python -m pytest -n 3 --dist loadgroup -m matrix tests/test_versions.py "$@" || status=$?
elif [ -n "$SOAK" ]; then
  python -m pytest -n "${TRIDENTFLOW_TEST_WORKERS:-2}" --dist loadgroup -m "soak and not matrix" \
    "$@" || status=$?
else
  python -m pytest -n "${TRIDENTFLOW_TEST_WORKERS:-2}" --dist loadgroup \
    -m "not matrix and not soak" "$@" || status=$?
fi
if [ "$status" -eq 5 ]; then
  echo "test.sh: pytest collected no tests - failing" >&2
  exit 1
fi
exit "$status"
