#!/usr/bin/env bash
# Every benchmark docs/benchmarks.md quotes, with the command that produced its figures, one
# after the other (nothing else may run meanwhile: the figures are wall times on a shared VM).
#
#   bash benchmarks/run_all.sh [NAME ...]
#
# Each command's output goes to $TF_BENCH_OUT/NAME.txt (default /tmp/tf-benchmarks-TREE), with
# the tree, the start time and the wall time in a header; a failed one is marked and the rest
# run. With NAMEs, only those (an unknown name is refused before anything runs). Needs what the suite needs (scripts/bootstrap.sh, a PostgreSQL at
# 127.0.0.1:5432 for postgres_sink); about three hours on 2 cores.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/env.sh
source "$ROOT/scripts/env.sh"
cd "$ROOT"
TREE="$(git rev-parse --short HEAD)"
OUT="${TF_BENCH_OUT:-/tmp/tf-benchmarks-$TREE}"
mkdir -p "$OUT"

declare -a ORDER=(
  user_scores user_scores_frames batch_operations batch_operations_frames per_exchange
  per_exchange_frames vs_spark vs_spark_all staging_scale staging_scale_large staging_scale_cluster
  commit_throughput commit_profile produce commit_scaleout commit_scaleout_shards undo_retention expiry memory reshard reshard_cluster postgres_sink lakehouse_sink
  kafka_source file_memory files_vs_spark files_vs_spark_big wordcount_vs_pyspark pipelining batch_operations_connect per_exchange_connect
  airflow_connect airflow_connect_redis airflow_both_connect airflow_both_submit on_data
)
declare -A COMMAND=(
  [user_scores]="python -m benchmarks.user_scores_vs_df --repeat 2"
  [user_scores_frames]="env TRIDENTFLOW_SPARK_GRAPH=frames python -m benchmarks.user_scores_vs_df --repeat 2"
  [batch_operations]="python -m benchmarks.batch_operations"
  [batch_operations_frames]="env TRIDENTFLOW_SPARK_GRAPH=frames python -m benchmarks.batch_operations"
  [per_exchange]="python -m benchmarks.batch_operations --per-exchange --repeat 3"
  [per_exchange_frames]="env TRIDENTFLOW_SPARK_GRAPH=frames python -m benchmarks.batch_operations --per-exchange --repeat 3"
  [vs_spark]="python benchmarks/vs_spark.py --only bare-df,tf-one,ss-foreach,tf-txids --repeat 2"
  [vs_spark_all]="python benchmarks/vs_spark.py --repeat 2"
  [staging_scale]="python -m benchmarks.staging_scale --keys 1000000,2000000"
  [staging_scale_large]="python -m benchmarks.staging_scale --keys 4000000,8000000"
  [staging_scale_cluster]="python -m benchmarks.staging_scale --cluster --only tf-redis,bare-foreach --keys 1000000,2000000,4000000,8000000"
  [commit_throughput]="python benchmarks/commit_throughput.py"
  [file_memory]="python -m benchmarks.file_memory --files 100000,1000000"
  [files_vs_spark]="python -m benchmarks.files_vs_spark --files 10000 --rows 1000 --cap 100"
  [files_vs_spark_big]="python -m benchmarks.files_vs_spark --files 200 --rows 100000 --cap 10"
  [expiry]="python -m benchmarks.expiry --sizes 10000,1000000,10000000 --txids 3 --repeat 1"
  [commit_profile]="python benchmarks/commit_throughput.py --profile"
  [produce]="python benchmarks/produce.py"
  [commit_scaleout]="python -m benchmarks.commit_scaleout"
  [commit_scaleout_shards]="python -m benchmarks.commit_scaleout --keys 1000000 --shards 1,2,3 --ops count --staging files,redis --repeat 1"
  [undo_retention]="python -m benchmarks.undo_retention --keys 200000 --repeat 5"
  [postgres_sink]="python -m benchmarks.postgres_sink --keys 1000000 --export"
  [lakehouse_sink]="python -m benchmarks.lakehouse_sink --keys 1000000 --repeat 3 --export"
  [memory]="python -m benchmarks.memory --sizes 1000000,10000000 --chunk 1000000 --retain 3"
  [reshard]="python -m benchmarks.reshard --keys 1000000"
  [reshard_cluster]="python -m benchmarks.reshard --keys 1000000 --cluster"
  [kafka_source]="python -m benchmarks.kafka_source --records 2000000"
  [wordcount_vs_pyspark]="python benchmarks/wordcount_vs_pyspark.py"
  [pipelining]="python benchmarks/pipelining.py"
  [batch_operations_connect]="python -m benchmarks.batch_operations --connect --repeat 3"
  [per_exchange_connect]="python -m benchmarks.batch_operations --per-exchange --connect --repeat 3"
  [airflow_connect]="python -m benchmarks.airflow_connect --runs 4 --idle-runs 0 --continuous-sentences 0"
  [airflow_connect_redis]="env TRIDENTFLOW_STAGING=redis python -m benchmarks.airflow_connect --runs 4 --idle-runs 0 --continuous-sentences 0"
  [airflow_both_connect]="python -m benchmarks.airflow_connect --emitter connect --runs 5 --idle-runs 2 --idle-cpu 60"
  [airflow_both_submit]="python -m benchmarks.airflow_connect --emitter submit --runs 4 --idle-runs 1 --continuous-sentences 0"
  [on_data]="python -m benchmarks.on_data --trickle 10 --backlog 1000000 --idle 60"
)
names=("$@")
[ ${#names[@]} -gt 0 ] || names=("${ORDER[@]}")
for name in "${names[@]}"; do
  if [ -z "${COMMAND[$name]:-}" ]; then
    echo "run_all.sh: no benchmark named $name (known: ${ORDER[*]})" >&2
    exit 2
  fi
done
for name in "${names[@]}"; do
  command="${COMMAND[$name]}"
  started=$(date +%s)
  {
    echo "# $command"
    echo "# tree $TREE, $(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) cores"
  } > "$OUT/$name.txt"
  # shellcheck disable=SC2086
  $command >> "$OUT/$name.txt" 2>&1
  status=$?
  echo "# exit $status after $(( $(date +%s) - started )) s" >> "$OUT/$name.txt"
  echo "$name: exit $status, $(( $(date +%s) - started )) s -> $OUT/$name.txt"
done
