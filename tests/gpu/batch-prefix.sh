#!/usr/bin/env bash
# TSDG's prefix for batches (issue 13), on a server with gpu_graph preloaded:
# DIR (base.fvecs, query.fvecs, groundtruth.ivecs) loaded into the table
# TABLE and indexed with algorithm = 'tsdg' (built on the GPU, refined on
# the CPU), then for each gpu_graph.batch_prefix of PREFIXES (0: the
# index's choice, half the degree; 256: whole lists) all the queries in one
# gpu_graph_search_batch call per ef of EFS (gpu-graph-bench --batch:
# recall@10 of the rows joined back, queries/s from SQL). Log to OUT.
#
#   bash tests/gpu/batch-prefix.sh DIR l2|cosine|ip
#   env: PREFIXES ("256 0 8"), EFS (10,20,40), TABLE (tp), ROWS, BENCH
set -euo pipefail
dir=${1:?DIR}
metric=${2:?l2, cosine or ip}
out=${OUT:-/tmp/gpu-test}
bench_bin=${BENCH:-$(pwd)/.device/gpu-graph-bench}
table=${TABLE:-tp}
efs=${EFS:-10,20,40}
mkdir -p "$out"
log=$out/batch-prefix.log
data=(--base "$dir/base.fvecs" --query "$dir/query.fvecs" --gt "$dir/groundtruth.ivecs" --metric "$metric" --table "$table")
[ -n "${ROWS:-}" ] && data+=(--rows "$ROWS")
nq=$(python3 -c "import os,struct,sys; f=sys.argv[1]; d=struct.unpack('<i', open(f,'rb').read(4))[0]; print(os.path.getsize(f) // (4 * (d + 1)))" "$dir/query.fvecs")
echo "== $table: algorithm tsdg, $nq queries a call" | tee -a "$log"
"$bench_bin" "${data[@]}" --index-options algorithm=tsdg --ef "$efs" --set maintenance_work_mem=16GB 2>&1 |
  grep -v 'already exists, skipping' | sed -n '/built\|^build:\|^load\|search worker/p' | tee -a "$log"
for p in ${PREFIXES:-256 0 8}; do
  echo "== gpu_graph.batch_prefix = $p" | tee -a "$log"
  "$bench_bin" "${data[@]}" --skip-load --skip-build --queries "$nq" --batch "$nq" --ef "$efs" \
    --set gpu_graph.batch_prefix="$p" 2>&1 | sed -n '/ef_search/,/^$/p' | tee -a "$log"
done
psql -X -At -c "SELECT 'worker batches: ' || (gpu_graph_worker_stats() -> 'batches')::text" | tee -a "$log"
