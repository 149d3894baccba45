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
#        BUILD_DEVICE (gpu), BENCH, SELF_JOIN (1: run it)
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
if [ "${SELF_JOIN:-1}" = 1 ]; then
  start=$(date +%s%N)
  got=$(gg_q -c "SET maintenance_work_mem = '16GB';" \
    -c "SELECT count(*) || ' rows, ' || count(*) FILTER (WHERE rank = 1 AND ctid = query_ctid) || ' queries their own nearest'
        FROM gpu_graph_knn_join('items_embedding_idx', 'items', 'embedding', 10)")
  echo "self join (every row's 10 nearest): $got in $(awk -v a="$start" -v b="$(date +%s%N)" 'BEGIN {printf "%.2f", (b - a) / 1e9}') s" | tee -a "$log"
fi
