#!/usr/bin/env bash
# gpu_graph_search_batch while the table churns: one session deletes rows,
# VACUUMs (freeing their nodes) and inserts new rows (reusing them) in a
# loop, while batches of 600 queries (searched on all cores from a copy of
# the index, each hit read again from its page) run beside it. Every row a
# batch returns must be one its statement sees (it joins back by ctid), at
# the distance the operator gives for that row's vector (f32 pages: equal),
# and every query must get its k rows. Twice: searched in the backend
# (search_device = cpu), then through the search worker in its CPU test
# mode (its batch path: the segment in dynamic shared memory, the worker's
# copy following the change log, the answers' first nodes with the rows
# and distances of its copy), which must answer the batches itself.
#
#   bash tests/cluster/batch_churn.sh      (after scripts/setup.sh)
set -euo pipefail
# shellcheck source=scripts/cluster.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/cluster.sh"

fail() { gg_test_fail batch_churn "$@"; }
# gpu_timeout 5 s: the test checks the worker's answers, not its timeout. A
# segment's time allowed is gpu_timeout + 100 us a query; the CPU test mode
# takes ~33 us a query on an idle 2-core machine, and one slow segment
# (a loaded machine) makes the ones queued behind it late too. One CI run
# had all three of the 20,400 queries' segments searched on the CPU, why
# not recorded then; a failure now prints the reasons.
gg_cluster_start "max_connections = 40" "gpu_graph.build_device = cpu" "shared_preload_libraries = 'gpu_graph'" \
  "gpu_graph.worker_device = cpu" "gpu_graph.gpu_timeout = 5000"
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

# the churn: 20 rounds of 500 deletes, VACUUM, 500 inserts (round numbers
# from $1, so the second pass inserts new ids)
churn() {
  for r in $(seq "$1" $(($1 + 19))); do
    q -c "DELETE FROM items WHERE id IN (SELECT id FROM items ORDER BY random() LIMIT 500)"
    q -c "VACUUM items"
    q -c "INSERT INTO items SELECT 100000 * $r + i, ARRAY(SELECT (sin(i * 1.37 + $r + j) * 10)::real FROM generate_series(1, 16) j)
          FROM generate_series(1, 500) i"
  done
}
stat() { q -c "SELECT gpu_graph_worker_stats() #>> '{batches,$1}'"; }
# pass DEVICE FIRST_ROUND: batches with gpu_graph.search_device = DEVICE
pass() {
  local device=$1 batches=0 got churner
  churn "$2" &
  churner=$!
  while kill -0 "$churner" 2>/dev/null || [ $batches -lt 3 ]; do
    got=$(PGOPTIONS="-c gpu_graph.search_device=$device" q <<'SQL'
SELECT count(*) || ' ' || count(i.ctid) || ' ' ||
       count(*) FILTER (WHERE abs(r.distance - (i.v <-> q.v)) > 1e-4 * greatest(1, i.v <-> q.v)) || ' ' ||
       count(DISTINCT r.query)
  FROM gpu_graph_search_batch('items_idx', (SELECT m FROM matrix), 10) r
  JOIN queries q ON q.n = r.query
  LEFT JOIN items i ON i.ctid = r.ctid;
SQL
)
    batches=$((batches + 1))
    [ "$got" = "6000 6000 0 600" ] || { kill "$churner" 2>/dev/null || true; fail "$device, batch $batches: rows, rows the statement sees, wrong distances, queries: $got (want 6000 6000 0 600)"; }
  done
  wait "$churner" || fail "the churning session failed"
  echo "batch_churn: $batches batches of 600 queries (search_device = $device) beside 20 rounds of DELETE, VACUUM and INSERT: every row seen, every distance right"
}
pass cpu 1
[ "$(stat asked)" = 0 ] || fail "search_device = cpu asked the worker: $(stat asked) batches"
# the worker holds a copy before the second pass (a batch it has no copy
# for searches on the CPU while the copy is made)
for _ in $(seq 100); do
  q -c "SELECT count(*) FROM gpu_graph_search_batch('items_idx', (SELECT m FROM matrix), 10)" >/dev/null
  [ "$(stat queries)" -gt 0 ] && break
  sleep 0.1
done
before_cpu=$(stat cpu)
pass auto 21
asked=$(stat asked) queries=$(stat queries) cpu=$(($(stat cpu) - before_cpu))
echo "batch_churn: the worker answered $queries queries in $asked segments; $cpu segments searched on the CPU"
[ "$cpu" -le $((asked / 20)) ] || fail "$cpu of $asked segments searched on the CPU (more than 5%), by why: $(stat fallbacks)"
# the table at rest: the worker's rows are the backend's, row for row (its
# CPU test mode searches a copy the same way), at ef 10 and 40
for ef in 10 40; do
  before=$(stat queries) reread=$(stat reread)
  got=$(q <<SQL
CREATE TEMP TABLE w AS SELECT query, rank, ctid::text AS t FROM gpu_graph_search_batch('items_idx', (SELECT m FROM matrix), 10, $ef);
SET gpu_graph.search_device = cpu;
CREATE TEMP TABLE c AS SELECT query, rank, ctid::text AS t FROM gpu_graph_search_batch('items_idx', (SELECT m FROM matrix), 10, $ef);
SELECT (SELECT count(*) FROM w) || ' ' || (SELECT count(*) FROM c) || ' ' || (SELECT count(*) FROM w JOIN c USING (query, rank, t));
SQL
)
  [ "$got" = "6000 6000 6000" ] || fail "ef $ef: worker rows, backend rows, equal: $got (want 6000 6000 6000)"
  [ "$(stat queries)" -eq $((before + 600)) ] || fail "ef $ef: the worker did not answer the batch"
  # the CPU test mode's copy is exact: the answers carry their rows, and
  # the backend reads no page for them (batch_area)
  [ "$(stat reread)" = "$reread" ] || fail "ef $ef: $(($(stat reread) - reread)) queries read again from the pages (want 0)"
done
echo "batch_churn: at rest, the worker's batches (their rows from its copy) equal the backend's row for row (ef 10 and 40)"
# a batch of 20,400 queries: three segments of queries through one shared
# segment, which the worker keeps mapped from one to the next
before=$(stat queries) asked=$(stat asked)
got=$(q <<'SQL'
CREATE TEMP TABLE big AS SELECT array_agg(v ORDER BY r, n) AS m FROM queries, generate_series(1, 34) r;
CREATE TEMP TABLE w2 AS SELECT query, rank, ctid::text AS t FROM gpu_graph_search_batch('items_idx', (SELECT m FROM big), 10, 20);
SET gpu_graph.search_device = cpu;
CREATE TEMP TABLE c2 AS SELECT query, rank, ctid::text AS t FROM gpu_graph_search_batch('items_idx', (SELECT m FROM big), 10, 20);
SELECT (SELECT count(*) FROM w2) || ' ' || (SELECT count(*) FROM w2 JOIN c2 USING (query, rank, t));
SQL
)
[ "$got" = "204000 204000" ] || fail "20,400 queries: worker rows, equal to the backend's: $got (want 204000 204000)"
[ "$(stat queries)" -eq $((before + 20400)) ] && [ "$(stat asked)" -eq $((asked + 3)) ] ||
  fail "20,400 queries: the worker answered $(($(stat queries) - before)) in $(($(stat asked) - asked)) segments (want 20400 in 3); segments left to the CPU, by why: $(stat fallbacks)"
echo "batch_churn: 20,400 queries in three segments through the worker equal the backend's rows"
# each query's 12 nearest rows deleted by the transaction that searches:
# invisible to it but still in the index, so the worker's answers need
# their nodes beyond the first ones read from the pages (Answer::rest).
# Row for row equal but for at most 10 of the 6,000: the queries lie near
# one curve and share neighbours, so some find fewer than 10 visible rows
# among the worker's 40 nodes (36 of 600 in a local run, counted by
# scans.cpu_after_worker) and resume a search on the pages from them,
# where the backend's CPU path goes on with its own beam: two searches
# past the first round, which may differ. One CI run gave 5,998 equal
# (36 runs since gave 6,000; at rest, above, the two are equal row for
# row). A difference is printed; more than 10 fail.
got=$(q <<'SQL'
BEGIN;
DELETE FROM items WHERE ctid IN (SELECT ctid FROM gpu_graph_search_batch('items_idx', (SELECT m FROM matrix), 12, 40));
CREATE TEMP TABLE w AS SELECT query, rank, ctid::text AS t, distance FROM gpu_graph_search_batch('items_idx', (SELECT m FROM matrix), 10, 40);
SET LOCAL gpu_graph.search_device = cpu;
CREATE TEMP TABLE c AS SELECT query, rank, ctid::text AS t, distance FROM gpu_graph_search_batch('items_idx', (SELECT m FROM matrix), 10, 40);
SELECT (SELECT count(*) FROM w) || ' ' || (SELECT count(*) FROM c) || ' ' || (SELECT count(*) FROM w JOIN c USING (query, rank, t))
       || ' ' || (SELECT count(*) FROM w JOIN items i ON i.ctid::text = w.t);
SELECT 'worker ' || query || ' ' || rank || ' ' || t || ' ' || distance FROM (SELECT * FROM w EXCEPT SELECT * FROM c) d ORDER BY query, rank;
SELECT 'cpu    ' || query || ' ' || rank || ' ' || t || ' ' || distance FROM (SELECT * FROM c EXCEPT SELECT * FROM w) d ORDER BY query, rank;
ROLLBACK;
SQL
)
counts=$(head -1 <<<"$got")
read -r w_rows c_rows equal visible <<<"$counts"
[ "$(wc -l <<<"$got")" -gt 1 ] && { echo "batch_churn: rows that differ (query rank ctid distance):"; tail -n +2 <<<"$got"; }
[ "$w_rows $c_rows $visible" = "6000 6000 6000" ] && [ "$equal" -ge 5990 ] ||
  fail "nearest rows deleted: worker rows, backend rows, equal, visible: $counts (want 6000 6000 >=5990 6000)"
echo "batch_churn: with each query's 12 nearest rows deleted by the searching transaction, $equal of the worker's 6000 rows equal the backend's, every one visible"
echo "batch_churn: passed"
