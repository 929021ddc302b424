#!/usr/bin/env bash
# The test command: set everything up from a clean clone, lint, run the whole suite.
# Tests start their own redis-server on free ports; Spark runs in local mode.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/bootstrap.sh"
bash "$ROOT/scripts/chromium.sh"
# shellcheck source=scripts/env.sh
source "$ROOT/scripts/env.sh"
cd "$ROOT"
ruff check .
ruff format --check .
status=0
python -m pytest -n "${TRIDENTFLOW_TEST_WORKERS:-2}" --dist loadgroup "$@" || status=$?
if [ "$status" -eq 5 ]; then
  echo "test.sh: pytest collected no tests - failing" >&2
  exit 1
fi
exit "$status"
