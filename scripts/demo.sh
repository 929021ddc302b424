#!/usr/bin/env bash
# The main job: seed 000's word count, exactly once, on Spark + Redis; then an audit.
# Uses TRIDENTFLOW_REDIS_URL if set, else starts (or reuses) a local redis-server on port 6390.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/bootstrap.sh"
# shellcheck source=scripts/env.sh
source "$ROOT/scripts/env.sh"
started=$(date +%s)
if [ -z "${TRIDENTFLOW_REDIS_URL:-}" ]; then
  TRIDENTFLOW_REDIS_URL="$(tridentflow dev-redis --port "${TRIDENTFLOW_DEV_REDIS_PORT:-6390}")"
  export TRIDENTFLOW_REDIS_URL
fi
echo "== Redis: $TRIDENTFLOW_REDIS_URL   home: $TRIDENTFLOW_HOME"
tridentflow reset wordcount --yes --source
printf 'how are you\nnice to meet you\nwhat a good day\n' | tridentflow produce wordcount -
echo "== run (Spark, local mode)"
tridentflow run wordcount --no-progress
echo "== query"
tridentflow query wordcount how are you nice to meet what a good day
echo "== audit"
tridentflow audit wordcount
echo "== demo wall time: $(( $(date +%s) - started ))s"
