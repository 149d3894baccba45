# shellcheck shell=bash
# Shared by the GPU machine's benchmark scripts: source it.
#   gg_queries_table DIR TYPE [TABLE] [ROWS]
#                                 table TABLE (`queries`; id 0.., v TYPE) of the first ROWS
#                                 (1000; 0: all) vectors of DIR/query.fvecs
#   gg_knn_sql OP                 /tmp/gg-knn.sql: pgbench's k-NN query, its vector from `queries`
#   gg_pgbench LABEL CLIENTS SECS PGOPTIONS [LOG]
#                                 one pgbench -M prepared run of /tmp/gg-knn.sql: a line
#                                 with queries/s, p50 and p99 (ms), also appended to LOG
#   gg_pick_ef CSV INDEX RECALL   the smallest swept ef_search of INDEX (the CSV's
#                                 `index` column) whose recall@10 reaches RECALL, else its largest
#   gg_wait_worker OP             until the search worker answers a scan of `items`
#   gg_insert_sql DIR             DIR/insert.sql: pgbench's insert of a new row into `items`
#                                 (a jittered copy of one of queries 0-499, ids from the
#                                 sequence new_ids); DIR/insert_side.sql: the same rows into
#                                 `side_items` (the writes' benchmarks, worker-writes.sh and
#                                 floor-writes.sh)
gg_q() { psql -X -q -v ON_ERROR_STOP=1 -At "$@"; }

gg_queries_table() {
  local dir=$1 type=$2 table=${3:-queries} rows=${4:-1000} dim
  python3 - "$dir/query.fvecs" "$type" "$rows" >/tmp/gg-queries.copy <<'PY'
import sys, struct
raw = open(sys.argv[1], 'rb').read()
d = struct.unpack_from('<i', raw)[0]
row = 4 * (d + 1)
real = sys.argv[2] == 'real[]'
n = len(raw) // row if int(sys.argv[3]) == 0 else min(int(sys.argv[3]), len(raw) // row)
for i in range(n):
    v = ','.join(repr(x) for x in struct.unpack_from(f'<{d}f', raw, i * row + 4))
    print(f"{i}\t{{{v}}}" if real else f"{i}\t[{v}]")
PY
  dim=$(python3 -c "import struct,sys; print(struct.unpack('<i', open(sys.argv[1],'rb').read(4))[0])" "$dir/query.fvecs")
  [ "$type" = 'real[]' ] || type="$type($dim)"
  gg_q -c "SET client_min_messages = warning; DROP TABLE IF EXISTS $table; CREATE TABLE $table (id int PRIMARY KEY, v $type)"
  gg_q -c "\\copy $table FROM /tmp/gg-queries.copy"
}

gg_knn_sql() {
  cat >/tmp/gg-knn.sql <<SQL
\\set qid random(0, 999)
SELECT id FROM items ORDER BY embedding $1 (SELECT v FROM queries WHERE id = :qid) LIMIT 10;
SQL
}

gg_pgbench() {
  local label=$1 c=$2 secs=$3 opts=$4 log=${5:-/dev/null}
  rm -rf /tmp/pgb && mkdir -p /tmp/pgb && chmod 777 /tmp/pgb
  local cpu0 cpu1
  cpu0=$(head -1 /proc/stat)
  PGOPTIONS="$opts" pgbench -n -M prepared -c "$c" -j 16 -T "$secs" -f /tmp/gg-knn.sql \
    --log --log-prefix=/tmp/pgb/log postgres >/tmp/pgb.out 2>&1 || { cat /tmp/pgb.out; return 1; }
  cpu1=$(head -1 /proc/stat)
  # the machine's CPU busy share over the run (all processes: is it the
  # cores that limit?)
  python3 - "$label" "$c" "$(awk '/^tps/ {print $3}' /tmp/pgb.out)" "$cpu0" "$cpu1" <<'PY' | tee -a "$log"
import glob, sys, numpy as np
lat = np.concatenate([np.loadtxt(f, usecols=2, ndmin=1) for f in glob.glob('/tmp/pgb/log*')]) / 1000.0
label, c, tps, cpu0, cpu1 = sys.argv[1:]
d = [b - a for a, b in zip(map(int, cpu0.split()[1:]), map(int, cpu1.split()[1:]))]
busy = 1 - (d[3] + d[4]) / max(sum(d), 1)
print(f"pgbench {label:<28} clients {c:>3}  {float(tps):>9.0f} queries/s  p50 {np.percentile(lat, 50):.3f} ms  p99 {np.percentile(lat, 99):.3f} ms  cpu {busy:.0%}")
PY
}

gg_pick_ef() {
  python3 - "$1" "$2" "$3" <<'PY'
import csv, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r['index'] == sys.argv[2]]
want = float(sys.argv[3])
pts = sorted((int(r['ef_search']), float(r['recall'])) for r in rows)
print(next((ef for ef, rc in pts if rc >= want), pts[-1][0]))
PY
}

gg_worker_scans() { gg_q -c "SELECT (gpu_graph_worker_stats() #>> '{scans,worker}')::bigint"; }

gg_wait_worker() {
  local n start
  start=$(date +%s%N)
  for _ in $(seq 1800); do
    n=$(gg_worker_scans)
    gg_q -c "SET gpu_graph.search_device = gpu; SELECT id FROM items ORDER BY embedding $1 (SELECT v FROM queries WHERE id = 0) LIMIT 10" >/dev/null
    [ "$(gg_worker_scans)" -gt "$n" ] && break
    sleep 0.1
  done
  echo "the worker answers after $(awk -v a="$start" -v b="$(date +%s%N)" 'BEGIN {printf "%.2f", (b - a) / 1e9}') s"
}

# a query vector of 0-499, jittered: a new row near the data (the vector
# found by its key: `id = (random() * 499)::int` is volatile, a scan of the
# whole queries table with a random() a row, and was a tenth of an insert)
gg_insert_sql() {
  cat >"$1/insert.sql" <<'SQL'
\set rid random(0, 499)
INSERT INTO items SELECT -nextval('new_ids'), (SELECT array_agg(x + (random() * 0.5)::real) FROM unnest(v) x)
  FROM queries WHERE id = :rid;
SQL
  sed 's/INSERT INTO items/INSERT INTO side_items/' "$1/insert.sql" >"$1/insert_side.sql"
}
