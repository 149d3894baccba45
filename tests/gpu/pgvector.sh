#!/usr/bin/env bash
# gpu_graph against pgvector's HNSW on the same pgvector column, in one run
# (the GPU machine, pgvector and gpu_graph_pgvector installed: gpu-stage.sh
# takes them along where pgvector is installed here):
#   1. gpu-graph-bench --column TYPE --compare hnsw: the table loaded as
#      `vector` or `halfvec`, gpu_graph built (on the GPU) and swept over
#      ef_search, then HNSW (m 16, ef_construction 64, 15 workers) built and
#      swept over hnsw.ef_search: build times, index sizes, recall@10,
#      queries/s of CLIENTS_SWEEP clients; CSV and SVG chart into OUT;
#   2. pgbench -M prepared, each query's vector read from a table of 1000
#      query vectors (of the same type), at each of CLIENTS, for each index
#      at the smallest swept ef_search whose recall@10 reaches RECALL (0.97):
#      HNSW, then gpu_graph rebuilt and searched through the worker and on
#      the CPU. Scans the worker served and those that fell back are shown.
#
#   bash tests/gpu/pgvector.sh DIR vector|halfvec l2|cosine|ip [NAME]
#   env: EFS (10,20,40,80), CLIENTS ("16 64"), SECS (10), ROWS (all),
#        RECALL (0.97), CLIENTS_SWEEP (16), BUILD_DEVICE (gpu),
#        BENCH (.device/gpu-graph-bench), STORAGE (the column's, e.g. plain:
#        768-dim `vector` values are TOASTed otherwise)
# DIR holds base.fvecs, query.fvecs and groundtruth.ivecs; the server needs
# max_worker_processes >= 17 (15 build workers, the search worker and the
# logical replication launcher). Fails when a
# build or query fails, or when the worker served fewer than 95% of the
# scans sent to it.
set -euo pipefail
# shellcheck source=tests/gpu/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
dir=${1:?DIR}
column=${2:?vector or halfvec}
metric=${3:?l2, cosine or ip}
name=${4:-$(basename "$dir")_${column}_$metric}
efs=${EFS:-10,20,40,80}
clients=${CLIENTS:-"16 64"}
secs=${SECS:-10}
recall=${RECALL:-0.97}
out=${OUT:-/tmp/gpu-test}
bench_bin=${BENCH:-$(pwd)/.device/gpu-graph-bench}
build_device=${BUILD_DEVICE:-gpu}
mkdir -p "$out"
case $metric in l2) op='<->' ;; cosine) op='<=>' ;; ip) op='<#>' ;; *) echo "metric $metric?" >&2; exit 2 ;; esac
rows=()
[ -n "${ROWS:-}" ] && rows=(--rows "$ROWS")
[ -n "${STORAGE:-}" ] && rows+=(--column-storage "$STORAGE")
log=$out/$name.log

# HNSW's 15 build workers are background workers: a server of
# max_worker_processes 8 (PostgreSQL's default; the search worker and the
# logical replication launcher hold two) grants it at most 6, whatever
# max_parallel_workers says, and the
# build comparison would not be the one this script claims
mwp=$(gg_q -c "SHOW max_worker_processes")
[ "$mwp" -ge 17 ] || {
  echo "pgvector.sh: FAIL: max_worker_processes is $mwp: HNSW's 15 build workers need 17 or more (e.g. source .device/device-pg \"shared_preload_libraries = 'gpu_graph'\" \"max_worker_processes = 32\")" >&2
  exit 1
}

"$bench_bin" --base "$dir/base.fvecs" --query "$dir/query.fvecs" --gt "$dir/groundtruth.ivecs" \
  --metric "$metric" --column "$column" "${rows[@]}" --queries 1000 --clients "${CLIENTS_SWEEP:-16}" --ef "$efs" \
  --compare hnsw --set maintenance_work_mem=16GB --set max_parallel_workers=15 --set max_parallel_maintenance_workers=15 \
  --set gpu_graph.build_device="$build_device" --csv "$out/$name.csv" 2>&1 | grep -v 'processed [0-9]* tuples\|already exists, skipping\|serially' | tee "$log"

# the smallest ef_search of each index reaching the recall asked for (else its largest)
ef_gg=$(gg_pick_ef "$out/$name.csv" gpu_graph "$recall")
ef_hnsw=$(gg_pick_ef "$out/$name.csv" hnsw "$recall")
gg_queries_table "$dir" "$column"
gg_knn_sql "$op"
echo "== pgbench, $column $metric, query vectors from a $column table" | tee -a "$log"
for c in $clients; do gg_pgbench "hnsw ef_search $ef_hnsw" "$c" "$secs" "-c hnsw.ef_search=$ef_hnsw" "$log"; done
gg_q -c "DROP INDEX items_hnsw_idx"
start=$(date +%s%N)
gg_q -c "SET maintenance_work_mem = '16GB'; SET gpu_graph.build_device = $build_device;
      CREATE INDEX items_embedding_idx ON items USING gpu_graph (embedding ${column}_${metric}_ops)"
echo "gpu_graph rebuilt in $(awk -v a="$start" -v b="$(date +%s%N)" 'BEGIN {printf "%.2f", (b - a) / 1e9}') s" | tee -a "$log"
# the worker loads its copy of the new index at its first scan (seconds at
# 768 dims): wait for it to answer, so that pgbench times the worker
gg_wait_worker "$op" | tee -a "$log"
fallbacks() { gg_q -c "SELECT coalesce(sum(value::bigint), 0) FROM jsonb_each_text(gpu_graph_worker_stats() -> 'fallbacks')"; }
served0=$(gg_worker_scans)
fell0=$(fallbacks)
for c in $clients; do gg_pgbench "gpu_graph worker ef $ef_gg" "$c" "$secs" "-c gpu_graph.search_device=gpu -c gpu_graph.ef_search=$ef_gg" "$log"; done
served=$(($(gg_worker_scans) - served0))
fell=$(($(fallbacks) - fell0))
echo "worker served $served scans, $fell fell back to the CPU (all since the server started, by reason: $(gg_q -c "SELECT gpu_graph_worker_stats() -> 'fallbacks'"))" | tee -a "$log"
for c in $clients; do gg_pgbench "gpu_graph cpu ef $ef_gg" "$c" "$secs" "-c gpu_graph.search_device=cpu -c gpu_graph.ef_search=$ef_gg" "$log"; done
[ $((served * 100)) -ge $(((served + fell) * 95)) ] || { echo "pgvector.sh: FAIL: the worker served $served of $((served + fell)) scans" >&2; exit 1; }
