#!/usr/bin/env bash
# Concurrent first inserts into an empty index (issue 14, finding 1): ten
# clients each insert one 1900-dimension row into an empty indexed table at
# once, forty rounds (TRUNCATE between them). Every round, every row must be
# reachable: an exact-beam scan with iterative_scan = off returns all ten,
# and each row's own vector finds that row first.
#
#   bash tests/cluster/first_inserts.sh      (after scripts/setup.sh)
set -euo pipefail
# shellcheck source=scripts/cluster.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/cluster.sh"

fail() { gg_test_fail first_inserts "$@"; }
gg_cluster_start "max_connections = 40"
q() { psql -X -q -v ON_ERROR_STOP=1 -At "$@"; }

q <<'SQL'
SET client_min_messages = warning;
CREATE EXTENSION gpu_graph;
CREATE TABLE items (id int, v real[]);
CREATE INDEX items_idx ON items USING gpu_graph (v) WITH (storage = 'f32');
SQL

script=$(mktemp)
# each client a distinct row: its id from the client number
cat >"$script" <<'SQL'
INSERT INTO items SELECT :client_id, ARRAY(SELECT sin(:client_id * 7.1 + j)::real FROM generate_series(1, 1900) j);
SQL
bindir=$(gg_pg_bindir)
rounds=40
for round in $(seq 1 $rounds); do
  q -c "TRUNCATE items"
  "$bindir/pgbench" -n -c 10 -j 10 -t 1 -f "$script" >"$script.log" 2>&1 || { cat "$script.log"; fail "pgbench failed in round $round"; }
  got=$(q <<'SQL'
SET enable_seqscan = off;
SET gpu_graph.iterative_scan = off;
SET gpu_graph.ef_search = 1000;
SELECT (SELECT count(*) FROM (SELECT id FROM items ORDER BY v <-> (SELECT v FROM items LIMIT 1)) s)
    || ' ' || (SELECT count(*) FROM items o WHERE o.id = (SELECT id FROM items ORDER BY v <-> o.v LIMIT 1));
SQL
)
  [ "$got" = "10 10" ] || fail "round $round: a scan returned / found itself: $got (of 10 10)"
done
rm -f "$script" "$script.log"
echo "first_inserts: all 10 rows reachable in each of $rounds rounds"
echo "first_inserts: passed"
