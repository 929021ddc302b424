#!/usr/bin/env bash
# The main job: seed 000's word count through Airflow (`airflow dags test`), with one injected
# failure inside the Spark emit that Airflow retries; then the counts and an audit.
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

log="$TRIDENTFLOW_HOME/demo-dags-test.log"
echo "== airflow dags test tridentflow_wordcount (fault: in-emit@1 - the first emit attempt fails)"
echo "   full log: $log"
# The main job shows Spark's emit: a batch this small would otherwise be emitted in the task
# itself, without a JVM (local_emit_max_records, docs/airflow.md).
if ! TRIDENTFLOW_LOCAL_EMIT_MAX_RECORDS=0 TRIDENTFLOW_FAULTS="in-emit@1" tridentflow-airflow dags-test tridentflow_wordcount >"$log" 2>&1; then
  tail -40 "$log"
  echo "demo: airflow dags test failed" >&2
  exit 1
fi
grep -oE "injected fault [^ ]+|run [^ ]+ -> txid [0-9]+ \([a-z]+\)|new_state=[a-z_]+|\"status\": \"staged\", \"attempt\": [0-9]+|commit of txid [0-9]+: [a-z-]+|DagRun Finished: dag_id=[a-z_]+" "$log" \
  | sed 's/^/   /' | uniq
echo "== query"
tridentflow query wordcount how are you nice to meet what a good day
echo "== audit"
tridentflow audit wordcount
echo "== demo wall time: $(( $(date +%s) - started ))s"
