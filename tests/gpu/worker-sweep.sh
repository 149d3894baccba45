#!/usr/bin/env bash
# Throughput of the search worker against ef_search, on the GPU machine, on a
# server with gpu_graph preloaded and the 1M-row table `items` indexed (as
# tests/gpu/build.sh leaves it): recall@10 through the worker
# (gpu-graph-bench, 1000 queries) and pgbench queries/s with p50/p99 for
# each client count and ef_search, each query's vector read from a table of
# the 1000 query vectors.
#
#   bash tests/gpu/worker-sweep.sh "12 16 20" "16 64" [SECONDS]
set -euo pipefail
# shellcheck source=tests/gpu/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
efs=${1:-"12 16 20"}
clients=${2:-"16 64"}
secs=${3:-10}
dir=${DIR:-/tmp/sift}
out=${OUT:-/tmp/gpu-test}
mkdir -p "$out"
"${BENCH:-$(pwd)/.device/gpu-graph-bench}" --base "$dir/base.fvecs" --query "$dir/query.fvecs" --gt "$dir/groundtruth.ivecs" \
  --metric l2 --ef "$(echo $efs | tr ' ' ,)" --skip-load --skip-build --set gpu_graph.search_device=gpu 2>&1 | sed -n '/ef_search/,/^$/p'
gg_queries_table "$dir" 'real[]'
gg_knn_sql '<->'
for ef in $efs; do
  for c in $clients; do
    gg_pgbench "ef_search $ef" "$c" "$secs" "-c gpu_graph.search_device=gpu -c gpu_graph.ef_search=$ef" "$out/sweep.log"
  done
done
