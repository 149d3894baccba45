#!/usr/bin/env bash
# Concurrent INSERTs, index scans, DELETEs and VACUUM on one gpu_graph index
# (pgbench on loopback, bounded in time): no client error, every inserted row
# that survives is found by a search for its own vector, no deleted row is
# ever returned, and the index holds exactly the table's rows.
#
#   bash tests/cluster/concurrency.sh      (after scripts/setup.sh)
set -euo pipefail
# shellcheck source=scripts/cluster.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/cluster.sh"
fail() { gg_test_fail concurrency "$@"; }
q() { psql -X -q -v ON_ERROR_STOP=1 -At "$@"; }

gg_cluster_start "max_connections = 50"
q <<'SQL'
SET client_min_messages = warning;
CREATE EXTENSION gpu_graph;
CREATE TABLE items (id bigint, v real[]);
INSERT INTO items SELECT i, ARRAY[random(), random(), random(), random(), random(), random(), random(), random()]::real[]
  FROM generate_series(1, 5000) i;
CREATE INDEX items_idx ON items USING gpu_graph (v) WITH (degree = 16);
CREATE SEQUENCE ids START 1000000;
SQL

work=$(mktemp -d "${TMPDIR:-/tmp}/gpu_graph-conc.XXXXXX")
gg_on_exit "rm -rf '$work'"
chmod 755 "$work"
cat >"$work/insert.sql" <<'SQL'
INSERT INTO items SELECT nextval('ids'), ARRAY[random(), random(), random(), random(), random(), random(), random(), random()]::real[] FROM generate_series(1, 5);
SQL
cat >"$work/search.sql" <<'SQL'
SET enable_seqscan = off;
SELECT count(*) FROM (SELECT id FROM items ORDER BY v <-> ARRAY[random(), random(), random(), random(), random(), random(), random(), random()]::real[] LIMIT 10) s;
SQL
cat >"$work/delete.sql" <<'SQL'
DELETE FROM items WHERE id = (random() * 5000)::int;
SQL

pgbench -n -T 15 -c 6 -j 2 -f "$work/insert.sql@4" -f "$work/search.sql@4" -f "$work/delete.sql@1" postgres \
  >"$work/pgbench.log" 2>&1 &
bench=$!
for _ in 1 2 3; do sleep 4; q -c "VACUUM items"; done
wait $bench || { cat "$work/pgbench.log"; fail "pgbench reported an error"; }
grep -E "number of (transactions actually processed|failed)" "$work/pgbench.log" | sed 's/^/  /'
q -c "VACUUM items"

rows=$(q -c "SELECT count(*) FROM items")
live=$(q -c "SELECT (gpu_graph_info('items_idx')->'nodes'->>'live')::int")
echo "  rows $rows, live index nodes $live"
[ "$rows" = "$live" ] || fail "the index holds $live live nodes for $rows rows"

# every surviving row inserted under load is found by a search for itself
found=$(q -c "SET enable_seqscan = off" -c "
  SELECT count(*) FILTER (WHERE o.id = (SELECT id FROM items ORDER BY v <-> o.v LIMIT 1)) || '/' || count(*)
  FROM items o WHERE o.id >= 1000000")
echo "  inserted rows found by their own vector: $found"
got=${found%/*}; all=${found#*/}
[ "$all" -gt 0 ] && [ $((got * 100)) -ge $((all * 99)) ] || fail "only $found inserted rows found"
# a full scan returns each row once, and only rows that exist
dups=$(q -c "SET enable_seqscan = off" -c "
  SELECT count(*) - count(DISTINCT id) FROM (SELECT id FROM items ORDER BY v <-> '{0.5,0.5,0.5,0.5,0.5,0.5,0.5,0.5}' LIMIT 1000000) s")
n=$(q -c "SET enable_seqscan = off" -c "
  SELECT count(*) FROM (SELECT id FROM items ORDER BY v <-> '{0.5,0.5,0.5,0.5,0.5,0.5,0.5,0.5}' LIMIT 1000000) s")
[ "$dups" = 0 ] && [ "$n" = "$rows" ] || fail "a full scan returned $n rows ($dups duplicates) for $rows rows"
# VACUUM reports the repair at DEBUG1: the nodes it freed, on
# max_parallel_maintenance_workers + 1 threads (INDEX_CLEANUP ON: so few
# dead rows would let VACUUM skip the indexes)
for workers in 0 3; do
  q -c "DELETE FROM items WHERE id IN (SELECT id FROM items ORDER BY id LIMIT 50)"
  report=$(q -c "SET client_min_messages = debug1" -c "SET max_parallel_maintenance_workers = $workers" \
    -c "VACUUM (INDEX_CLEANUP ON) items" 2>&1 | grep 'gpu_graph index' || true)
  echo "  ${report#*DEBUG:  }"
  threads=$((workers + 1))
  [[ "$report" == *"\"items_idx\": 50 deleted nodes freed, "*" on $threads thread"* ]] ||
    fail "VACUUM with max_parallel_maintenance_workers = $workers reported: ${report:-nothing}"
done
rows=$(q -c "SELECT count(*) FROM items")

# and the index is whole: lists, the free chain the VACUUMs built while
# inserts reused its slots, every live node reachable, every heap TID used
problems=$(q -c "SELECT count(*) FROM gpu_graph_verify('items_idx')")
[ "$problems" = 0 ] || { q -c "SELECT * FROM gpu_graph_verify('items_idx') LIMIT 10"; fail "gpu_graph_verify lists $problems problems"; }
echo "  gpu_graph_verify: no problem"
echo "concurrency: passed"
