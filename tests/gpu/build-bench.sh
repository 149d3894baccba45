#!/usr/bin/env bash
# CREATE INDEX at scale, side by side with pgvector's HNSW, on the GPU machine
# (a benchmark: it prints numbers and fails only when a build fails). Run
# there on a server from .device/device-pg, with gpu_graph preloaded:
#
#   bash tests/gpu/build-bench.sh DIR
#
# DIR holds base.fvecs, query.fvecs and groundtruth.ivecs (make_latent.py or
# make_sift128.py output). Settings, from the environment:
#   TABLE      table name (default bench); LOAD=0 reuses a loaded table
#   COLUMN     the column's SET STORAGE before the load (default: PostgreSQL's)
#   STORAGE    gpu_graph storage options to build, e.g. "f32 f16" (default:
#              `default`, no option given)
#   BUILDS     gpu_graph builds in a row for each, in one ordinary session
#              (statements before each CREATE INDEX; default 1)
#   EFS        ef_search values for recall@10 (default "20 40 80")
#   QPS        seconds of pgbench per (path, ef) point, 0 for none (default 0)
#   CLIENTS    pgbench client counts (default "16 64")
#   PGVECTOR   1: also pgvector HNSW (m 16, ef_construction 64, 15 workers)
#              on a vector copy of the table, recall at hnsw.ef_search EFS;
#              the extension must be installed (this never fetches it)
#   PV_MWM     maintenance_work_mem of pgvector's build (default 16GB: it
#              allocates all of it as shared memory up front)
#   PARALLEL_WORKERS  the table's parallel_workers (default: PostgreSQL's
#              choice from the table's size)
#   SETTLE     1 (default): after a load, VACUUM the table and CHECKPOINT, so
#              that builds start from a table at rest (hint bits set, the
#              load's dirty pages and WAL flushed) and pay for their own I/O
#              only; 0: build right after the load
#   KEEP=1     keep the last gpu_graph index
#   BUILD_DEVICE  gpu_graph.build_device for the builds (default gpu)
#   GPU_MEMORY gpu_graph.build_gpu_memory for the builds, in MB (default 0:
#              automatic); below the build's need it builds in shards
#   GPUS       gpu_graph.build_gpus: devices a paged build deals shards to
#   MWM        maintenance_work_mem of the gpu_graph builds (default 64GB);
#              below the vectors' size the build is paged (read back from
#              the index's pages in shards)
# Each build's session also reports its peak resident memory (VmHWM of the
# backend, shared buffers it touched included), and the run the GPU's peak
# memory in use (nvidia-smi every 100 ms) and the largest private memory of
# any postgres process (RssAnon every 100 ms).
set -euo pipefail
dir=${1:?usage: build-bench.sh DIR}
stage=$(pwd)/.device
out=${OUT:-/tmp/gpu-test}
mkdir -p "$out"
table=${TABLE:-bench}
storages=${STORAGE:-default}
builds=${BUILDS:-1}
efs=${EFS:-"20 40 80"}
qps=${QPS:-0}
clients=${CLIENTS:-"16 64"}
fail() { echo "build-bench: FAIL: $*" >&2; tail -20 /tmp/pg.log >&2; exit 1; }
q() { psql -X -v ON_ERROR_STOP=1 -At "$@"; }
settle() { [ "${SETTLE:-1}" = 0 ] || q -c "VACUUM $1" -c "CHECKPOINT"; }
dim=$(python3 -c "import numpy as np,sys; print(np.fromfile(sys.argv[1], dtype=np.int32, count=1)[0])" "$dir/base.fvecs")

if [ "${LOAD:-1}" = 1 ]; then
  "$stage/gpu-graph-bench" --base "$dir/base.fvecs" --query "$dir/query.fvecs" --gt "$dir/groundtruth.ivecs" \
    --metric l2 --table "$table" --load-only ${COLUMN:+--column-storage "$COLUMN"} 2>&1 | grep -E "rows|load"
  settle "$table"
  q -c "DROP TABLE IF EXISTS ${table}_q"
fi
if [ -z "$(q -c "SELECT 1 FROM pg_class WHERE relname = '${table}_q'")" ]; then
  q -c "CREATE TABLE ${table}_q (id int PRIMARY KEY, v real[])"
  python3 - "$dir/query.fvecs" >/tmp/${table}_q.csv <<'PY'
import numpy as np, sys
raw = np.fromfile(sys.argv[1], dtype=np.int32); d = raw[0]
x = raw.reshape(-1, d + 1)[:, 1:].view(np.float32)
for i, v in enumerate(x):
    print(f'{i}\t{{{",".join(repr(float(f)) for f in v)}}}')
PY
  q -c "\\copy ${table}_q FROM /tmp/${table}_q.csv"
fi
q -c "CREATE EXTENSION IF NOT EXISTS gpu_graph" >/dev/null
[ -z "${PARALLEL_WORKERS:-}" ] || q -c "ALTER TABLE $table SET (parallel_workers = $PARALLEL_WORKERS)"
rows=$(q -c "SELECT count(*) FROM $table")
echo "table $table: $rows rows x $dim dims, heap $(q -c "SELECT pg_size_pretty(pg_table_size('$table'))") (TOAST included)"

# recall NAME SETTING: recall@10 over the query table at each ef, through the
# index the planner picks with SETTING = ef
recall() {
  local name=$1 setting=$2 op=${3:-embedding} ef
  for ef in $efs; do
    q -q -c "SET $setting = $ef" -c "SET enable_seqscan = off" \
      -c "SELECT q.id, array_to_string(ARRAY(SELECT id FROM $name ORDER BY $op <-> q.v::$4 LIMIT 10), ' ') FROM ${table}_q q ORDER BY q.id" \
      >"/tmp/answers_$ef"
    python3 - "$dir/groundtruth.ivecs" "/tmp/answers_$ef" "$ef" "$setting" <<'PY'
import numpy as np, sys
raw = np.fromfile(sys.argv[1], dtype=np.int32); k = raw[0]
gt = raw.reshape(-1, k + 1)[:, 1:11]
hits = n = 0
for line in open(sys.argv[2]):
    i, ids = line.rstrip('\n').split('|')
    got = set(int(x) for x in ids.split())
    hits += len(got & set(gt[int(i)].tolist())); n += 10
print(f"  {sys.argv[4]} {sys.argv[3]:>3}: recall@10 {hits / n:.4f}")
PY
  done
}

# qps NAME SETTING EF [PGOPTIONS]: pgbench queries/s, each query's vector from the query table
qps() {
  local name=$1 setting=$2 ef=$3 opts=${4:-} cast=${5:-}
  [ "$qps" -gt 0 ] || return 0
  printf '\\set qid random(0, 999)\nSELECT id FROM %s ORDER BY %s <-> (SELECT v FROM %s_q WHERE id = :qid)%s LIMIT 10;\n' \
    "$name" "${6:-embedding}" "$table" "$cast" >/tmp/bench_knn.sql
  local c
  for c in $clients; do
    PGOPTIONS="-c $setting=$ef $opts" pgbench -n -M prepared -c "$c" -j 16 -T "$qps" -f /tmp/bench_knn.sql postgres \
      >/tmp/bench_pgb.log 2>&1 || { cat /tmp/bench_pgb.log; fail "pgbench"; }
    echo "  $setting $ef, $c clients: $(awk '/^tps/ {printf "%.0f", $3}' /tmp/bench_pgb.log) queries/s ($opts)"
  done
}

for storage in $storages; do
  echo "== gpu_graph, storage $storage: $builds builds in one session"
  {
    for i in $(seq 1 "$builds"); do
      echo "SELECT count(*) AS rows_before_build_$i FROM $table;"
      echo "SELECT pg_sleep(0.2);"
      echo "DROP INDEX IF EXISTS ${table}_gg;"
      echo "\\timing on"
      with=""
      [ "$storage" = default ] || with="WITH (storage = '$storage')"
      # the backend's peak resident memory from here (Linux: 5 resets it)
      echo "COPY (SELECT 5) TO '/proc/self/clear_refs';"
      echo "CREATE INDEX ${table}_gg ON $table USING gpu_graph (embedding) $with;"
      echo "\\timing off"
      echo "SELECT 'backend peak memory ' || substring(pg_read_file('/proc/self/status') from 'VmHWM:\\s*(\\d+ kB)') AS peak;"
      # less the shared buffers and files it maps at the end: its own memory
      echo "SELECT 'backend peak private memory ' || (substring(s from 'VmHWM:\\s*(\\d+)')::bigint - substring(s from 'RssShmem:\\s*(\\d+)')::bigint - substring(s from 'RssFile:\\s*(\\d+)')::bigint) || ' kB (VmHWM less RssShmem and RssFile at the end)' FROM pg_read_file('/proc/self/status') s;"
    done
  } >/tmp/bench_builds.sql
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 >/tmp/bench_gpu_mem.log 2>/dev/null &
  smi=$!
  # private memory (RssAnon: not the shared buffers a process touched, which
  # VmHWM counts) of the largest postgres process, every 100 ms
  while :; do
    # (cat goes on past processes that end meanwhile; mawk would stop)
    cat /proc/[0-9]*/status 2>/dev/null |
      awk '/^Name:/ {n = $2} /^RssAnon:/ {if (n == "postgres" && $2 > m) m = $2} END {print m + 0}'
    sleep 0.1
  done >/tmp/bench_anon.log &
  anon=$!
  q -c "SET client_min_messages = debug1" -c "SET maintenance_work_mem = '${MWM:-64GB}'" \
    -c "SET max_parallel_maintenance_workers = 15" -c "SET gpu_graph.build_device = ${BUILD_DEVICE:-gpu}" \
    -c "SET gpu_graph.build_gpu_memory = ${GPU_MEMORY:-0}" -c "SET gpu_graph.build_gpus = ${GPUS:-1}" \
    -f /tmp/bench_builds.sql >"$out/builds_${table}_$storage.log" 2>&1 || {
    kill $smi $anon 2>/dev/null
    cat "$out/builds_${table}_$storage.log"
    fail "a gpu_graph build failed"
  }
  kill $smi $anon 2>/dev/null || true
  grep -E "NOTICE|DEBUG:  gpu_graph|Time|peak" "$out/builds_${table}_$storage.log" | sed 's/^/  /'
  echo "  GPU peak memory in use: $(sort -n /tmp/bench_gpu_mem.log | tail -1) MiB (the whole device)"
  echo "  peak private memory of a postgres process: $(sort -n /tmp/bench_anon.log | tail -1) kB (RssAnon, sampled)"
  echo "  index $(q -c "SELECT pg_size_pretty(pg_relation_size('${table}_gg'))")"
  recall "$table" gpu_graph.ef_search embedding real[]
  for ef in $efs; do
    qps "$table" gpu_graph.ef_search "$ef" "-c gpu_graph.search_device=gpu"
    qps "$table" gpu_graph.ef_search "$ef" "-c gpu_graph.search_device=cpu"
  done
  [ "${KEEP:-0}" = 1 ] || q -c "DROP INDEX ${table}_gg"
done

if [ "${PGVECTOR:-0}" = 1 ]; then
  echo "== pgvector HNSW (m 16, ef_construction 64, 15 workers)"
  q -c "CREATE EXTENSION IF NOT EXISTS vector" >/dev/null
  q -c "DROP TABLE IF EXISTS ${table}_pv" \
    -c "CREATE TABLE ${table}_pv AS SELECT id, embedding::vector($dim) AS v FROM $table" >/dev/null
  settle "${table}_pv"
  # pgvector allocates all of maintenance_work_mem as shared memory up front
  q -c "SET maintenance_work_mem = '${PV_MWM:-16GB}'" -c "SET max_parallel_maintenance_workers = 15" -c "\\timing on" \
    -c "CREATE INDEX ${table}_pv_hnsw ON ${table}_pv USING hnsw (v vector_l2_ops) WITH (m = 16, ef_construction = 64)" \
    2>&1 | grep -E "Time|ERROR" | sed 's/^/  /'
  echo "  index $(q -c "SELECT pg_size_pretty(pg_relation_size('${table}_pv_hnsw'))")"
  recall "${table}_pv" hnsw.ef_search v "vector($dim)"
  for ef in $efs; do qps "${table}_pv" hnsw.ef_search "$ef" "" "::vector($dim)" v; done
fi
