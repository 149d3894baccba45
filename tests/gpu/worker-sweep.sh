#!/usr/bin/env bash
# Throughput of the search worker against ef_search, on the GPU machine, on a
# server with gpu_graph preloaded and the 1M-row table `items` indexed (as
# tests/gpu/build.sh leaves it) and `queries` loaded (tests/gpu/worker.sh):
# recall@10 through the worker (gpu-graph-bench, 1000 queries) and pgbench
# queries/s with p50/p99 for each client count and ef_search.
#
#   bash tests/gpu/worker-sweep.sh "12 16 20" "16 64" [SECONDS]
set -euo pipefail
efs=${1:-"12 16 20"}
clients=${2:-"16 64"}
secs=${3:-10}
stage=$(pwd)/.device
out=${OUT:-/tmp/gpu-test}
mkdir -p "$out"
cat >/tmp/knn.sql <<'SQL'
\set qid random(0, 999)
SELECT id FROM items ORDER BY embedding <-> (SELECT v FROM queries WHERE id = :qid) LIMIT 10;
SQL
"$stage/gpu-graph-bench" --base /tmp/sift/base.fvecs --query /tmp/sift/query.fvecs --gt /tmp/sift/groundtruth.ivecs \
  --metric l2 --ef "$(echo $efs | tr ' ' ,)" --skip-build --set gpu_graph.search_device=gpu 2>&1 | sed -n '/ef_search/,/^$/p'
for ef in $efs; do
  for c in $clients; do
    rm -rf /tmp/pgb; mkdir -p /tmp/pgb; chmod 777 /tmp/pgb
    PGOPTIONS="-c gpu_graph.search_device=gpu -c gpu_graph.ef_search=$ef" pgbench -n -M prepared -c "$c" -j 16 -T "$secs" \
      -f /tmp/knn.sql --log --log-prefix=/tmp/pgb/log postgres >"$out/sweep_${ef}_$c.log" 2>&1
    tps=$(awk '/^tps/ {print $3}' "$out/sweep_${ef}_$c.log")
    failed=$(awk '/number of failed/ {print $5}' "$out/sweep_${ef}_$c.log")
    python3 - "$ef" "$c" "$tps" "$failed" <<'PY'
import glob, sys, numpy as np
lat = np.concatenate([np.loadtxt(f, usecols=2, ndmin=1) for f in glob.glob('/tmp/pgb/log*')]) / 1000.0
ef, c, tps, failed = sys.argv[1:]
print(f"ef_search {ef:>3}  clients {c:>3}  {float(tps):>9.0f} queries/s  p50 {np.percentile(lat, 50):.3f} ms  p99 {np.percentile(lat, 99):.3f} ms  failed {failed}")
PY
  done
done
