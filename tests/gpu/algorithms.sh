#!/usr/bin/env bash
# The graphs of the `algorithm` option side by side on one table (the GPU
# machine; gpu_graph preloaded): for each of ALGORITHMS, CREATE INDEX
# (RNN-Descent on the GPU, then for nsg, vamana, cagra and tsdg the CFS
# refinement on the CPU), its size, recall@10 and queries/s at each of EFS
# from 16 bench clients (a CSV each), then pgbench -M prepared through the
# search worker at each of CLIENTS at the smallest ef_search reaching
# RECALL. The summary is OUT/NAME.log.
#
#   bash tests/gpu/algorithms.sh DIR l2|cosine|ip [NAME]
#   env: ALGORITHMS ("rnn_descent nsg vamana cagra tsdg"), EFS (10,20,40,80),
#        CLIENTS (64; empty: no pgbench), SECS (10), RECALL (0.97), OPTIONS (more index
#        options, e.g. "degree = 32"), BUILD_DEVICE (gpu), BENCH
set -euo pipefail
# shellcheck source=tests/gpu/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
dir=${1:?DIR}
metric=${2:?l2, cosine or ip}
name=${3:-algorithms_$(basename "$dir")_$metric}
out=${OUT:-/tmp/gpu-test}
bench_bin=${BENCH:-$(pwd)/.device/gpu-graph-bench}
efs=${EFS:-10,20,40,80}
secs=${SECS:-10}
recall=${RECALL:-0.97}
case $metric in l2) op='<->' ;; cosine) op='<=>' ;; ip) op='<#>' ;; *) echo "metric $metric?" >&2; exit 2 ;; esac
mkdir -p "$out"
log=$out/$name.log
: >"$log"
data=(--base "$dir/base.fvecs" --query "$dir/query.fvecs" --gt "$dir/groundtruth.ivecs" --metric "$metric")
[ -n "${ROWS:-}" ] && data+=(--rows "$ROWS")
"$bench_bin" "${data[@]}" --load-only --set maintenance_work_mem=16GB | tee -a "$log"
gg_queries_table "$dir" 'real[]'
gg_knn_sql "$op"
for a in ${ALGORITHMS:-rnn_descent nsg vamana cagra tsdg}; do
  echo "== $a" | tee -a "$log"
  "$bench_bin" "${data[@]}" --skip-load --queries 1000 --clients 16 --ef "$efs" \
    --index-options "algorithm = '$a'${OPTIONS:+, $OPTIONS}" --set maintenance_work_mem=16GB \
    --set gpu_graph.build_device="${BUILD_DEVICE:-gpu}" --csv "$out/${name}_$a.csv" 2>&1 |
    grep -v 'already exists, skipping' | sed -n '/built\|^build:/p;/ef_search/,/^$/p' | tee -a "$log"
  ef=$(gg_pick_ef "$out/${name}_$a.csv" gpu_graph "$recall")
  gg_wait_worker "$op" | tee -a "$log"
  for c in ${CLIENTS-64}; do
    gg_pgbench "$a worker ef $ef" "$c" "$secs" "-c gpu_graph.search_device=gpu -c gpu_graph.ef_search=$ef" "$log"
  done
done
