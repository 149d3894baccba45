#!/usr/bin/env bash
# Batches from SQL (issue 13), on a server with gpu_graph preloaded: the
# table loaded and indexed from DIR (base.fvecs, query.fvecs,
# groundtruth.ivecs), then for each of BATCHES queries a call (the first
# N of query.fvecs, all of them by default) a sweep of EFS through
# gpu_graph_search_batch (gpu-graph-bench --batch: queries/s from SQL,
# recall@10 from the rows joined back), the same queries one a statement
# from CLIENTS bench clients beside it, and the whole-table self join
# through gpu_graph_knn_join, timed. CSVs and the log go to OUT.
#
#   bash tests/gpu/batch.sh DIR l2|cosine|ip [NAME]
#   env: BATCHES ("10000"), EFS (10,20,40,80), CLIENTS (64), ROWS,
#        BUILD_DEVICE (gpu), BENCH, SELF_JOIN (1: run it),
#        COUNT_BATCHES ("10000 100000": the count(*) calls' sizes)
set -euo pipefail
# shellcheck source=tests/gpu/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
dir=${1:?DIR}
metric=${2:?l2, cosine or ip}
name=${3:-batch_$(basename "$dir")_$metric}
out=${OUT:-/tmp/gpu-test}
bench_bin=${BENCH:-$(pwd)/.device/gpu-graph-bench}
efs=${EFS:-10,20,40,80}
mkdir -p "$out"
log=$out/$name.log
: >"$log"
data=(--base "$dir/base.fvecs" --query "$dir/query.fvecs" --gt "$dir/groundtruth.ivecs" --metric "$metric")
[ -n "${ROWS:-}" ] && data+=(--rows "$ROWS")
sets=(--set maintenance_work_mem=16GB --set gpu_graph.build_device="${BUILD_DEVICE:-gpu}")
skip=()
for b in ${BATCHES:-10000}; do
  echo "== $b queries a call" | tee -a "$log"
  "$bench_bin" "${data[@]}" "${skip[@]}" --queries "$b" --batch "$b" --ef "$efs" "${sets[@]}" \
    --csv "$out/${name}_$b.csv" 2>&1 | grep -v 'already exists, skipping' |
    sed -n '/built\|^build:\|^load\|search worker/p;/ef_search/,/^$/p' | tee -a "$log"
  skip=(--skip-load --skip-build)
done
echo "== one query a statement, ${CLIENTS:-64} clients" | tee -a "$log"
"$bench_bin" "${data[@]}" --skip-load --skip-build --ef "$efs" --clients "${CLIENTS:-64}" "${sets[@]}" 2>&1 |
  sed -n '/ef_search/,/^$/p' | tee -a "$log"
# SELECT count(*) FROM gpu_graph_search_batch(...) as the issue times it:
# the query vectors (all of query.fvecs, repeated to COUNT_BATCHES) in one
# two-dimensional array kept in a table, one call per ef; the worker's own
# time on the batches from gpu_graph_worker_stats()
gg_queries_table "$dir" 'real[]' bq 0
nbq=$(gg_q -c "SELECT count(*) FROM bq")
for b in ${COUNT_BATCHES:-10000 100000}; do
  gg_q -c "DROP TABLE IF EXISTS bq_arr" \
    -c "CREATE TABLE bq_arr AS SELECT array_agg(v ORDER BY g, id) AS a FROM bq, generate_series(0, ($b - 1) / $nbq) g WHERE g * $nbq + id < $b"
  for ef in ${efs//,/ }; do
    s0=$(gg_q -c "SELECT gpu_graph_worker_stats() #>> '{batches,worker_ms}'")
    t0=$(date +%s%N)
    rows=$(gg_q -c "SELECT count(*) FROM bq_arr, gpu_graph_search_batch('items_embedding_idx', a, 10, $ef)")
    t1=$(date +%s%N)
    stats=$(gg_q -c "SELECT gpu_graph_worker_stats() -> 'batches'")
    s1=$(gg_q -c "SELECT gpu_graph_worker_stats() #>> '{batches,worker_ms}'")
    awk -v b="$b" -v ef="$ef" -v rows="$rows" -v a="$t0" -v z="$t1" -v w0="$s0" -v w1="$s1" -v st="$stats" 'BEGIN {
      s = (z - a) / 1e9; w = (w1 - w0) / 1e3;
      printf "count(*) of a batch of %d queries, ef %d: %d rows in %.3f s = %.0f queries/s from SQL; the worker %.3f s of it = %.0f queries/s (%s)\n", b, ef, rows, s, b / s, w, (w > 0 ? b / w : 0), st }' | tee -a "$log"
  done
done

if [ "${SELF_JOIN:-1}" = 1 ]; then
  start=$(date +%s%N)
  got=$(gg_q -c "SET maintenance_work_mem = '16GB';" \
    -c "SELECT count(*) || ' rows, ' || count(*) FILTER (WHERE rank = 1 AND ctid = query_ctid) || ' queries their own nearest'
        FROM gpu_graph_knn_join('items_embedding_idx', 'items', 'embedding', 10)")
  echo "self join (every row's 10 nearest): $got in $(awk -v a="$start" -v b="$(date +%s%N)" 'BEGIN {printf "%.2f", (b - a) / 1e9}') s" | tee -a "$log"
fi
