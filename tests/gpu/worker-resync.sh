#!/usr/bin/env bash
# A copy on the GPU whose change log was lost (the worker stopped while
# more pages were written than the log holds) is brought up to date in
# place: the worker reads again the pages whose LSN moved and keeps its
# copy (no new load), and every row written meanwhile is found through it.
# Run on a server with gpu_graph preloaded and the table `items` (column
# `embedding`, index `items_embedding_idx`, gpu-graph-bench's) from DIR:
#
#   bash tests/gpu/worker-resync.sh /tmp/sift [ROWS]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
dir=${1:?DIR}
rows=${2:-30000}
fail() { echo "worker-resync: FAIL: $*" >&2; exit 1; }
stat() { gg_q -c "SELECT gpu_graph_worker_stats() #>> '{$1}'"; }
gg_queries_table "$dir" 'real[]'
echo "worker: $(gg_wait_worker '<->')"
loads=$(stat residency,loads); overflows=$(stat residency,log_overflows); resyncs=$(stat residency,resyncs)
wpid=$(stat worker,pid)
kill -STOP "$wpid"
# rows near the query vectors, each findable by its own vector: query
# i % 1000 moved by up to 4 in each coordinate at random, with ids of their
# own (base - i: other scripts' rows may be in the table). (Moved along one
# line, 0.25 (1 + i / 1000) in every coordinate, as this script did first,
# each query's 30 rows make a chain of near-collinear points: beside the
# hundreds of near-copies worker.sh inserts around the same query vectors,
# the GPU's search then misses a few of a chain's far rows at any
# ef_search, on a copy loaded whole too, where the CPU's finds them.)
base=-1500000000
gg_q -c "DELETE FROM items WHERE id <= $base AND id > $base - $rows - 1"
t0=$(date +%s.%N)
gg_q -c "INSERT INTO items SELECT $base - i, (SELECT array_agg(x + (random() * 4)::real) FROM unnest(v) x)
  FROM generate_series(1, $rows) i JOIN queries q ON q.id = i % 1000"
t1=$(date +%s.%N)
kill -CONT "$wpid"
# the first scan after it: the worker reads the lost changes back in place
sleep 1
gg_q -c "SET gpu_graph.search_device = gpu" -c "SELECT count(*) FROM (SELECT 1 FROM items ORDER BY embedding <-> (SELECT v FROM queries WHERE id = 1) LIMIT 10) s" >/dev/null
sleep 1
echo "$rows rows inserted in $(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.1f", b - a}') s with the worker stopped; overflows $(($(stat residency,log_overflows) - overflows)), resyncs $(($(stat residency,resyncs) - resyncs)) ($(stat residency,resynced_pages) pages read again), loads $(($(stat residency,loads) - loads))"
[ "$(stat residency,log_overflows)" -gt "$overflows" ] || fail "no overflow: insert more rows"
[ "$(stat residency,resyncs)" -gt "$resyncs" ] && [ "$(stat residency,loads)" = "$loads" ] || fail "the copy was not read again in place"
# every 100th new row, searched for by its own vector through the worker,
# then on the CPU (for reference): found when the nearest row is at
# distance 0 (itself, or a row of equal vector left by an earlier run). At
# ef_search 200: after other scripts' writes (worker.sh inserts ~300k rows
# near the same query vectors) a search of the default beam may miss a row
# among the crowd; a change the copy missed leaves its row unfindable at
# any beam.
found_by() {
  gg_q -c "SET gpu_graph.search_device = $1" -c "SET gpu_graph.ef_search = 200" -c "SET enable_seqscan = off" -c "
    SELECT count(*) FILTER (WHERE (SELECT embedding <-> o.embedding FROM items ORDER BY embedding <-> o.embedding LIMIT 1) = 0)
    FROM items o WHERE o.id <= $base AND o.id > $base - $rows - 1 AND o.id % 100 = 0" | tail -n 1
}
w0=$(stat scans,worker)
found=$(found_by gpu)
served=$(($(stat scans,worker) - w0))
cpu=$(found_by cpu)
echo "rows found by their own vector through the worker: $found of $((rows / 100)) ($served scans served by it); on the CPU: $cpu"
[ "$found" = $((rows / 100)) ] && [ "$served" -ge $((rows / 100)) ] || fail "rows written while the log was lost: $found found, $served served"
echo "worker-resync: passed"
