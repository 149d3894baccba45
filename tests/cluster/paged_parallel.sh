#!/usr/bin/env bash
# A parallel CREATE INDEX beyond maintenance_work_mem (the sharded-build
# issue, part 5): the workers' batches go through the leader's ring of
# slots (more batches than slots, so the ring wraps and workers wait for
# freed ones) into the vector pages, and the graph is built from those
# pages in shards. Every row must be indexed exactly once and found.
#
#   bash tests/cluster/paged_parallel.sh      (after scripts/setup.sh)
set -euo pipefail
# shellcheck source=scripts/cluster.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/cluster.sh"

fail() { gg_test_fail paged_parallel "$@"; }
gg_cluster_start "max_worker_processes = 16" "max_parallel_workers = 8"
q() { psql -X -q -v ON_ERROR_STOP=1 -At "$@"; }

# 240,000 rows of 128 dimensions on a 3-dimensional manifold: 123 MB of
# stored vectors, more than the ring's 7 slots of 16 MB hold at 64 MB
rows=240000
q <<SQL
SET client_min_messages = warning;
CREATE EXTENSION gpu_graph;
CREATE TABLE t (id int, v real[]);
ALTER TABLE t SET (parallel_workers = 2);
SELECT setseed(0.25);
INSERT INTO t
SELECT i, (SELECT array_agg((a * cos(j) + b * sin(j * 1.3) + c * cos(j * 0.7))::real ORDER BY j)
             FROM generate_series(1, 128) j)
  FROM (SELECT i, random() * 10 AS a, random() * 10 AS b, random() * 10 AS c
          FROM generate_series(1, $rows) i) p;
SQL

# 64 MB: the least for one worker beside the leader (32 MB a process)
out=$(q 2>&1 <<'SQL'
SET client_min_messages = notice;
SET gpu_graph.build_device = cpu;
SET maintenance_work_mem = '64MB';
SET max_parallel_maintenance_workers = 2;
CREATE INDEX t_idx ON t USING gpu_graph (v) WITH (storage = 'f32');
SQL
)
echo "$out" | grep -q "read back from the index's pages" || fail "the build did not go paged: $out"
info=$(q -c "SELECT (gpu_graph_info('t_idx')->'build'->>'scan_workers')::int,
                    (gpu_graph_info('t_idx')->'build'->'shards'->>'count')::int,
                    gpu_graph_info('t_idx')->'nodes'->>'live',
                    gpu_graph_info('t_idx')->'nodes'->>'allocated'")
IFS='|' read -r workers shards live allocated <<<"$info"
[ "$workers" -gt 0 ] || fail "no parallel workers scanned ($info)"
[ "$shards" -gt 1 ] || fail "not built in shards ($info)"
[ "$live" = "$rows" ] && [ "$allocated" = "$rows" ] || fail "$live live of $allocated nodes for $rows rows"
q -c "SELECT gpu_graph_verify('t_idx')" >/dev/null || fail "gpu_graph_verify"

# every row once: an exhaustive scan through the index returns each id once
got=$(q <<SQL
SET enable_seqscan = off;
SELECT count(*) || ' ' || count(DISTINCT id) FROM
  (SELECT id FROM t ORDER BY v <-> (SELECT v FROM t WHERE id = 1) LIMIT $rows) s;
SQL
)
[ "$got" = "$rows $rows" ] || fail "the index returned $got rows (all, distinct) of $rows"

# each of 60 rows found first by its own vector
found=$(q <<'SQL'
SET enable_seqscan = off;
SET gpu_graph.ef_search = 40;
SELECT count(*) FROM t o WHERE o.id % 4000 = 0 AND o.id = (SELECT id FROM t ORDER BY v <-> o.v LIMIT 1);
SQL
)
[ "$found" -ge 57 ] || fail "only $found of 60 rows found first by their own vector"
echo "paged_parallel: ok ($rows rows, $workers workers, $shards shards, $found of 60 found first)"

# A CFS graph beyond maintenance_work_mem (issue 12, item 5): each shard's
# graph refined by the graph's filter while its rows are in memory, each
# node's two lists united and filtered again by it (their rows read back
# from the pages); TSDG's merged lists then put in its (lambda, distance)
# order from those rows.
small=60000
q -c "CREATE TABLE t2 AS SELECT * FROM t WHERE id <= $small" >/dev/null
# recall@10 of 30 queries (rows' vectors moved a little) against exact,
# through whichever index t2 has
recall_t2() {
  q <<'SQL'
CREATE TEMP TABLE qs AS SELECT id AS q, (SELECT array_agg(x + 0.05::real) FROM unnest(v) x) AS v FROM t2 WHERE id % 2000 = 1;
SET enable_indexscan = off; SET enable_bitmapscan = off;
CREATE TEMP TABLE exact AS SELECT q, ARRAY(SELECT id FROM t2 ORDER BY v <-> qs.v LIMIT 10) AS ids FROM qs;
RESET enable_indexscan; RESET enable_bitmapscan; SET enable_seqscan = off; SET gpu_graph.ef_search = 40;
CREATE TEMP TABLE got AS SELECT q, ARRAY(SELECT id FROM t2 ORDER BY v <-> qs.v LIMIT 10) AS ids FROM qs;
SELECT round(avg((SELECT count(*) FROM unnest(g.ids) i WHERE i = ANY (e.ids)) / 10.0), 3) FROM exact e JOIN got g USING (q);
SQL
}
# paged_cfs ALGORITHM: t2's only index, built paged on the CPU: its shards,
# live nodes, gpu_graph_verify, every row returned once, recall@10 >= 0.9
# at ef_search 40; prints "SHARDS RECALL"
paged_cfs() {
  local a=$1 idx=t2_$1 out info algorithm shards live got recall
  out=$(q 2>&1 <<SQL
SET client_min_messages = notice;
SET gpu_graph.build_device = cpu;
SET maintenance_work_mem = '16MB';
SET max_parallel_maintenance_workers = 0;
CREATE INDEX $idx ON t2 USING gpu_graph (v) WITH (algorithm = '$a', storage = 'f32');
SQL
  )
  echo "$out" | grep -q "read back from the index's pages in [0-9]* shards" || fail "the $a build did not go paged: $out"
  info=$(q -c "SELECT gpu_graph_info('$idx')->>'algorithm', (gpu_graph_info('$idx')->'build'->'shards'->>'count')::int,
                      gpu_graph_info('$idx')->'nodes'->>'live'")
  IFS='|' read -r algorithm shards live <<<"$info"
  [ "$algorithm" = "$a" ] && [ "$shards" -gt 1 ] && [ "$live" = "$small" ] || fail "the paged $a index: $info"
  q -c "SELECT gpu_graph_verify('$idx')" >/dev/null || fail "gpu_graph_verify $idx"
  got=$(q -c "SET enable_seqscan = off;" -c "SELECT count(*) || ' ' || count(DISTINCT id) FROM
    (SELECT id FROM t2 ORDER BY v <-> (SELECT v FROM t2 WHERE id = 7) LIMIT $small) s" | tail -n 1)
  [ "$got" = "$small $small" ] || fail "the paged $a index returned $got rows (all, distinct) of $small"
  recall=$(recall_t2)
  awk -v r="$recall" 'BEGIN { exit !(r >= 0.9) }' || fail "the paged $a index's recall@10 is $recall"
  q -c "DROP INDEX $idx" >/dev/null
  echo "$shards $recall"
}
# (assigned first: a failure inside ends the script)
vamana=$(paged_cfs vamana)
tsdg=$(paged_cfs tsdg)
echo "paged_parallel: ok (beyond maintenance_work_mem, shards and recall@10 at ef_search 40: vamana $vamana; tsdg $tsdg)"
