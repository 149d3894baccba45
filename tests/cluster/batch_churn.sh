#!/usr/bin/env bash
# gpu_graph_search_batch while the table churns: one session deletes rows,
# VACUUMs (freeing their nodes) and inserts new rows (reusing them) in a
# loop, while batches of 600 queries (searched on all cores from a copy of
# the index, each hit read again from its page) run beside it. Every row a
# batch returns must be one its statement sees (it joins back by ctid), at
# the distance the operator gives for that row's vector (f32 pages: equal),
# and every query must get its k rows.
#
#   bash tests/cluster/batch_churn.sh      (after scripts/setup.sh)
set -euo pipefail
# shellcheck source=scripts/cluster.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/cluster.sh"

fail() { echo "batch_churn: FAIL: $*" >&2; exit 1; }
gg_cluster_start "max_connections = 40" "gpu_graph.build_device = cpu"
q() { psql -X -q -v ON_ERROR_STOP=1 -At "$@"; }

q <<'SQL'
SET client_min_messages = warning;
CREATE EXTENSION gpu_graph;
CREATE TABLE items (id int, v real[]);
INSERT INTO items SELECT i, ARRAY(SELECT (sin(i * 0.7311 + j * 1.913) * 10 + sin(i * (0.011 * j)) * 5)::real
                                  FROM generate_series(1, 16) j)
  FROM generate_series(1, 20000) i;
CREATE INDEX items_idx ON items USING gpu_graph (v) WITH (storage = 'f32');
CREATE TABLE queries AS SELECT n, ARRAY(SELECT (sin((n * 31) * 0.7311 + j * 1.913) * 10 + 0.3 * sin(n + j))::real
                                        FROM generate_series(1, 16) j) AS v
  FROM generate_series(1, 600) n;
CREATE TABLE matrix AS SELECT array_agg(v ORDER BY n) AS m FROM queries;
SQL

# the churn: 20 rounds of 500 deletes, VACUUM, 500 inserts
churn() {
  for r in $(seq 1 20); do
    q -c "DELETE FROM items WHERE id IN (SELECT id FROM items ORDER BY random() LIMIT 500)"
    q -c "VACUUM items"
    q -c "INSERT INTO items SELECT 100000 * $r + i, ARRAY(SELECT (sin(i * 1.37 + $r + j) * 10)::real FROM generate_series(1, 16) j)
          FROM generate_series(1, 500) i"
  done
}
churn &
churner=$!
batches=0
while kill -0 "$churner" 2>/dev/null || [ $batches -lt 3 ]; do
  got=$(q <<'SQL'
SELECT count(*) || ' ' || count(i.ctid) || ' ' ||
       count(*) FILTER (WHERE abs(r.distance - (i.v <-> q.v)) > 1e-4 * greatest(1, i.v <-> q.v)) || ' ' ||
       count(DISTINCT r.query)
  FROM gpu_graph_search_batch('items_idx', (SELECT m FROM matrix), 10) r
  JOIN queries q ON q.n = r.query
  LEFT JOIN items i ON i.ctid = r.ctid;
SQL
)
  batches=$((batches + 1))
  [ "$got" = "6000 6000 0 600" ] || { kill "$churner" 2>/dev/null || true; fail "batch $batches: rows, rows the statement sees, wrong distances, queries: $got (want 6000 6000 0 600)"; }
done
wait "$churner" || fail "the churning session failed"
echo "batch_churn: $batches batches of 600 queries beside 20 rounds of DELETE, VACUUM and INSERT: every row seen, every distance right"
echo "batch_churn: passed"
