#!/usr/bin/env bash
# Searches through the worker while the table is written (a benchmark with
# checks): pgbench -M prepared searches at ef_search 20, each query vector
# read from a table of the 1000 query vectors, with inserts at a fixed rate
# beside them (a second pgbench), after a read-only run in the same call.
# For each rate: queries/s, p99 latency, scans served by the worker and
# those that went to the CPU as out of date, pages patched into its copy;
# then rows inserted are found through the worker right after their commit.
# Run on a server with gpu_graph preloaded, on a table `items` with an
# index `items_embedding_idx` (gpu-graph-bench's), /tmp/sift's queries:
#
#   CLIENTS="16 64" RATES="0 200 1000 5000" SECS=15 bash tests/gpu/worker-writes.sh [DIR]
#
# Fails when a rate's scans were served by the worker less than 95% of the
# time, or a fresh row is not found through it.
set -euo pipefail
dir=${1:-/tmp/sift}
out=${OUT:-/tmp/gpu-test}
mkdir -p "$out"
fail() { echo "worker-writes: FAIL: $*" >&2; exit 1; }
q() { psql -X -q -v ON_ERROR_STOP=1 -At "$@"; }
stats() { q -c "SELECT gpu_graph_worker_stats() #>> '{$1}'"; }
secs=${SECS:-15}

python3 - "$dir/query.fvecs" <<'PY'
import sys, struct
raw = open(sys.argv[1], 'rb').read()
d = struct.unpack_from('<i', raw)[0]
row = 4 * (d + 1)
with open('/tmp/queries.copy', 'w') as f:
    for i in range(min(1000, len(raw) // row)):
        v = struct.unpack_from(f'<{d}f', raw, i * row + 4)
        f.write(f"{i}\t{{{','.join(repr(x) for x in v)}}}\n")
PY
q -c "DROP TABLE IF EXISTS queries" -c "CREATE TABLE queries (id int PRIMARY KEY, v real[])" \
  -c "\\copy queries FROM /tmp/queries.copy"
cat >/tmp/knn.sql <<'SQL'
\set qid random(0, 999)
SELECT id FROM items ORDER BY embedding <-> (SELECT v FROM queries WHERE id = :qid) LIMIT 10;
SQL
# a query vector, jittered: a new row near the data
cat >/tmp/insert.sql <<'SQL'
INSERT INTO items SELECT -nextval('new_ids'), (SELECT array_agg(x + (random() * 0.5)::real) FROM unnest(v) x)
  FROM queries WHERE id = (random() * 999)::int;
SQL
q -c "DROP SEQUENCE IF EXISTS new_ids" -c "CREATE SEQUENCE new_ids"
for _ in $(seq 1 600); do [ "$(stats worker,state)" = running ] && break; sleep 0.1; done
echo "worker: $(q -c "SELECT gpu_graph_worker_stats()->'worker'")"
# the first scan makes the copy
PGOPTIONS="-c gpu_graph.search_device=gpu" q -c "SELECT count(*) FROM (SELECT id FROM items ORDER BY embedding <-> (SELECT v FROM queries WHERE id = 1) LIMIT 10) s" >/dev/null
for _ in $(seq 1 300); do
  [ "$(q -c "SELECT (gpu_graph_info('items_embedding_idx') #>> '{search,resident,generation}') IS NOT NULL")" = t ] && break
  sleep 0.2
  PGOPTIONS="-c gpu_graph.search_device=gpu" q -c "SELECT 1 FROM items ORDER BY embedding <-> (SELECT v FROM queries WHERE id = 1) LIMIT 1" >/dev/null
done

printf "%-8s %-6s %10s %10s %9s %9s %9s %8s %8s\n" clients rate "queries/s" "inserts/s" "p99 ms" worker stale patches overflow | tee "$out/writes.txt"
for c in ${CLIENTS:-64}; do
  for rate in ${RATES:-0 200 1000}; do
    name="c${c}_r$rate"
    rm -rf "/tmp/pgb_$name"; mkdir -p "/tmp/pgb_$name"; chmod 777 "/tmp/pgb_$name"
    w0=$(stats scans,worker); s0=$(stats fallbacks,stale); p0=$(stats residency,patched_pages); o0=$(stats residency,log_overflows)
    ins=
    if [ "$rate" != 0 ]; then
      pgbench -n -M prepared -c 2 -j 2 -R "$rate" -T "$secs" -f /tmp/insert.sql postgres >"$out/inserts_$name.log" 2>&1 &
      ins=$!
    fi
    PGOPTIONS="-c gpu_graph.search_device=gpu -c gpu_graph.ef_search=20" pgbench -n -M prepared -c "$c" -j 16 \
      -T "$secs" -f /tmp/knn.sql --log --log-prefix="/tmp/pgb_$name/log" postgres >"$out/search_$name.log" 2>&1 ||
      { cat "$out/search_$name.log"; fail "pgbench $name"; }
    [ -z "$ins" ] || wait "$ins" || { cat "$out/inserts_$name.log"; fail "inserts $name"; }
    tps=$(awk '/^tps/ {printf "%.0f", $3}' "$out/search_$name.log")
    itps=$([ -z "$ins" ] && echo 0 || awk '/^tps/ {printf "%.0f", $3}' "$out/inserts_$name.log")
    p99=$(cat /tmp/pgb_"$name"/log* | awk '{print $3 / 1000}' | sort -g | awk '{v[NR] = $1} END {printf "%.3f", v[int(NR * 0.99) + (NR * 0.99 > int(NR * 0.99))]}')
    w=$(($(stats scans,worker) - w0)); s=$(($(stats fallbacks,stale) - s0))
    printf "%-8s %-6s %10s %10s %9s %9s %9s %8s %8s\n" "$c" "$rate" "$tps" "$itps" "$p99" "$w" "$s" \
      $(($(stats residency,patched_pages) - p0)) $(($(stats residency,log_overflows) - o0)) | tee -a "$out/writes.txt"
    [ $((w * 100)) -ge $(((w + s) * 95)) ] || fail "$name: the worker served $w scans, $s went to the CPU as out of date"
  done
done
echo "fallbacks: $(q -c "SELECT gpu_graph_worker_stats()->'fallbacks'")"

# freshness: each row found through the worker right after its commit
# (a query vector moved by 0.25: no other row is as near it)
for i in $(seq 1 100); do
  vec="(SELECT array_agg(x + 0.25::real ORDER BY o) FROM queries, unnest(v) WITH ORDINALITY u(x, o) WHERE id = $i)"
  echo "INSERT INTO items VALUES (-1000000000 - $i, $vec);"
  echo "SELECT id = -1000000000 - $i FROM items ORDER BY embedding <-> $vec LIMIT 1;"
done >/tmp/fresh.sql
w0=$(stats scans,worker)
found=$(PGOPTIONS="-c gpu_graph.search_device=gpu" q -f /tmp/fresh.sql | grep -c '^t$' || true)
w=$(($(stats scans,worker) - w0))
echo "rows found through the worker right after their commit: $found/100 ($w served by it)"
[ "$found" = 100 ] && [ "$w" = 100 ] || fail "fresh rows: $found/100 found, $w/100 served by the worker"
echo "worker-writes: passed"
