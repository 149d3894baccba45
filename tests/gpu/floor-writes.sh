#!/usr/bin/env bash
# PostgreSQL's own floor beside writes (a benchmark, no checks): pgbench -M
# prepared primary-key lookups of the query table (`SELECT v FROM queries
# WHERE id = :qid`, no gpu_graph in the query), read-only and beside the
# inserts `worker-writes.sh` makes (the same rows, 16 clients, pgbench -R),
# into a table without any index (`side_items`) or into the indexed `items`.
# What a query keeps of its read-only rate beside the writes when the query
# is PostgreSQL's cheapest: the line that issue 10's share (80%) is held
# against. A mode is one of:
#   0        read-only
#   sideN    N inserts/s into side_items (no index)
#   N        N inserts/s into items (its gpu_graph index)
# Run on the server and table of worker-writes.sh (`items`, DIR's queries):
#
#   CLIENTS="64 16" MODES="0 side1000 side5000 5000" SECS=6 bash tests/gpu/floor-writes.sh [DIR]
#
# Appends a line a point to OUT/floor.txt: clients, mode, lookups/s, the
# share of the pass's read-only rate, writes/s.
set -euo pipefail
dir=${1:-/tmp/sift}
out=${OUT:-/tmp/gpu-test}
mkdir -p "$out"
# shellcheck source=tests/gpu/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
secs=${SECS:-6}
w=$(mktemp -d)
gg_q -c "SELECT 1 FROM queries LIMIT 1" >/dev/null 2>&1 || gg_queries_table "$dir" 'real[]'
gg_q -c "SET client_min_messages = warning; CREATE SEQUENCE IF NOT EXISTS new_ids" \
  -c "DROP TABLE IF EXISTS side_items" -c "CREATE TABLE side_items (LIKE items)"
cat >$w/pk.sql <<'SQL'
\set qid random(0, 999)
SELECT v FROM queries WHERE id = :qid;
SQL
# worker-writes.sh's inserts
gg_insert_sql $w
tps() { awk '/^tps/ {printf "%.0f", $3}' "$1"; }
printf "%-7s %-10s %10s %8s %9s\n" clients mode "lookups/s" "of r/o" "writes/s" | tee -a "$out/floor.txt"
for c in ${CLIENTS:-64 16}; do
  base=""
  for mode in ${MODES:-0 side1000 side5000 5000}; do
    writer=""
    case $mode in
      0) ;;
      side*) pgbench -n -M prepared -c 16 -j 16 -R "${mode#side}" -T $((secs + 1)) -f $w/insert_side.sql postgres >$w/writes.log 2>&1 &
        writer=$! ;;
      *) pgbench -n -M prepared -c 16 -j 16 -R "$mode" -T $((secs + 1)) -f $w/insert.sql postgres >$w/writes.log 2>&1 &
        writer=$! ;;
    esac
    sleep 0.5
    pgbench -n -M prepared -c "$c" -j 16 -T "$secs" -f $w/pk.sql postgres >$w/pk.log 2>&1 || { cat $w/pk.log; exit 1; }
    r=$(tps $w/pk.log) wr=-
    if [ -n "$writer" ]; then
      wait "$writer" || { cat $w/writes.log; exit 1; }
      wr=$(tps $w/writes.log)
    fi
    [ "$mode" = 0 ] && base=$r
    share=$([ -n "$base" ] && awk -v a="$r" -v b="$base" 'BEGIN {printf "%.0f%%", 100 * a / b}' || echo -)
    printf "%-7s %-10s %10s %8s %9s\n" "$c" "$mode" "$r" "$share" "$wr" | tee -a "$out/floor.txt"
  done
done
rm -rf "$w"
