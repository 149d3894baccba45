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
# DIR holds base.fvecs, query.fvecs and groundtruth.ivecs. Fails when a
# build or query fails, or when the worker served fewer than 95% of the
# scans sent to it.
set -euo pipefail
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
q() { psql -X -q -v ON_ERROR_STOP=1 -At "$@"; }
case $metric in l2) op='<->' ;; cosine) op='<=>' ;; ip) op='<#>' ;; *) echo "metric $metric?" >&2; exit 2 ;; esac
rows=()
[ -n "${ROWS:-}" ] && rows=(--rows "$ROWS")
[ -n "${STORAGE:-}" ] && rows+=(--column-storage "$STORAGE")

"$bench_bin" --base "$dir/base.fvecs" --query "$dir/query.fvecs" --gt "$dir/groundtruth.ivecs" \
  --metric "$metric" --column "$column" "${rows[@]}" --queries 1000 --clients "${CLIENTS_SWEEP:-16}" --ef "$efs" \
  --compare hnsw --set maintenance_work_mem=16GB --set max_parallel_maintenance_workers=15 \
  --set gpu_graph.build_device="$build_device" --csv "$out/$name.csv" 2>&1 | grep -v 'processed [0-9]* tuples\|already exists, skipping' | tee "$out/$name.log"

# the smallest ef_search of each index reaching the recall asked for (else its largest)
read -r ef_gg ef_hnsw < <(python3 - "$out/$name.csv" "$recall" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
want = float(sys.argv[2])
def pick(index):
    pts = sorted(((int(r['ef_search']), float(r['recall'])) for r in rows if r['index'] == index))
    return next((ef for ef, rc in pts if rc >= want), pts[-1][0])
print(pick('gpu_graph'), pick('hnsw'))
PY
)

python3 - "$dir/query.fvecs" >/tmp/pgvector-queries.copy <<'PY'
import sys, struct
raw = open(sys.argv[1], 'rb').read()
d = struct.unpack_from('<i', raw)[0]
row = 4 * (d + 1)
for i in range(min(1000, len(raw) // row)):
    v = struct.unpack_from(f'<{d}f', raw, i * row + 4)
    print(f"{i}\t[{','.join(repr(x) for x in v)}]")
PY
dim=$(python3 -c "import struct,sys; print(struct.unpack('<i', open(sys.argv[1],'rb').read(4))[0])" "$dir/query.fvecs")
q -c "DROP TABLE IF EXISTS queries; CREATE TABLE queries (id int PRIMARY KEY, v $column($dim))"
q -c "\\copy queries FROM /tmp/pgvector-queries.copy"
cat >/tmp/pgvector-knn.sql <<SQL
\\set qid random(0, 999)
SELECT id FROM items ORDER BY embedding $op (SELECT v FROM queries WHERE id = :qid) LIMIT 10;
SQL

# one pgbench per client count: queries/s, p50 and p99 (ms) from its log
bench() { # LABEL PGOPTIONS
  for c in $clients; do
    rm -rf /tmp/pgb && mkdir -p /tmp/pgb && chmod 777 /tmp/pgb
    PGOPTIONS="$2" pgbench -n -M prepared -c "$c" -j 16 -T "$secs" -f /tmp/pgvector-knn.sql \
      --log --log-prefix=/tmp/pgb/log postgres >/tmp/pgb.out 2>&1 || { cat /tmp/pgb.out; exit 1; }
    python3 - "$1" "$c" "$(awk '/^tps/ {print $3}' /tmp/pgb.out)" <<'PY' | tee -a "$out/$name.log"
import glob, sys, numpy as np
lat = np.concatenate([np.loadtxt(f, usecols=2, ndmin=1) for f in glob.glob('/tmp/pgb/log*')]) / 1000.0
label, c, tps = sys.argv[1:]
print(f"pgbench {label:<28} clients {c:>3}  {float(tps):>9.0f} queries/s  p50 {np.percentile(lat, 50):.3f} ms  p99 {np.percentile(lat, 99):.3f} ms")
PY
  done
}
echo "== pgbench, $column $metric, query vectors from a $column table" | tee -a "$out/$name.log"
bench "hnsw ef_search $ef_hnsw" "-c hnsw.ef_search=$ef_hnsw"
q -c "DROP INDEX items_hnsw_idx"
start=$(date +%s%N)
q -c "SET maintenance_work_mem = '16GB'; SET gpu_graph.build_device = $build_device;
      CREATE INDEX items_embedding_idx ON items USING gpu_graph (embedding ${column}_${metric}_ops)"
echo "gpu_graph rebuilt in $(awk -v a="$start" -v b="$(date +%s%N)" 'BEGIN {printf "%.2f", (b - a) / 1e9}') s" | tee -a "$out/$name.log"
# the worker loads its copy of the new index at its first scan (seconds at
# 768 dims): wait for it to answer, so that pgbench times the worker
worker_scans() { q -c "SELECT (gpu_graph_worker_stats() #>> '{scans,worker}')::bigint"; }
start=$(date +%s%N)
for _ in $(seq 1800); do
  n=$(worker_scans)
  q -c "SET gpu_graph.search_device = gpu; SELECT id FROM items ORDER BY embedding $op (SELECT v FROM queries WHERE id = 0) LIMIT 10" >/dev/null
  [ "$(worker_scans)" -gt "$n" ] && break
  sleep 0.1
done
echo "the worker answers after $(awk -v a="$start" -v b="$(date +%s%N)" 'BEGIN {printf "%.2f", (b - a) / 1e9}') s" | tee -a "$out/$name.log"
served0=$(worker_scans)
fell0=$(q -c "SELECT coalesce(sum(value::bigint), 0) FROM jsonb_each_text(gpu_graph_worker_stats() -> 'fallbacks')")
bench "gpu_graph worker ef $ef_gg" "-c gpu_graph.search_device=gpu -c gpu_graph.ef_search=$ef_gg"
served=$(( $(worker_scans) - served0 ))
fell=$(( $(q -c "SELECT coalesce(sum(value::bigint), 0) FROM jsonb_each_text(gpu_graph_worker_stats() -> 'fallbacks')") - fell0 ))
echo "worker served $served scans, $fell fell back to the CPU (all since the server started, by reason: $(q -c "SELECT gpu_graph_worker_stats() -> 'fallbacks'"))" | tee -a "$out/$name.log"
bench "gpu_graph cpu ef $ef_gg" "-c gpu_graph.search_device=cpu -c gpu_graph.ef_search=$ef_gg"
[ $((served * 100)) -ge $(((served + fell) * 95)) ] || { echo "pgvector.sh: FAIL: the worker served $served of $((served + fell)) scans" >&2; exit 1; }
