#!/usr/bin/env bash
# One query's latency through the search worker (issue 15), on a server with
# gpu_graph preloaded and the table `items` (column `embedding`) indexed
# from DIR: for each gpu_graph.worker_spin of SPINS the server is restarted
# (RESTART, a shell command: the worker's counters start at zero), the
# worker waited for, then pgbench -M prepared with 1 client (p50/p99, and
# the worker's breakdown: gpu_graph_worker_stats()->'latency_us'), 16 and
# 64 clients, each query's vector read from a table of the 1000 query
# vectors; last, PostgreSQL's own floor: pgbench of a primary-key lookup of
# that table (SELECT v FROM queries WHERE id = :qid) at 16 and 64 clients.
# Each pgbench line gives the machine's CPU busy share over its run; after
# each, the worker thread's counters so far ('requests').
#
#   RESTART="pg_ctl -D ... -w restart" bash tests/gpu/latency.sh DIR OP EF
#   env: SPINS ("1000 0": the default, then sleeping at once), CLIENTS ("1 16 64"), SECS (5), OUT
set -euo pipefail
# shellcheck source=tests/gpu/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
dir=${1:?DIR}
op=${2:?the distance operator, e.g. '<->'}
ef=${3:?ef_search}
out=${OUT:-/tmp/gpu-test}
secs=${SECS:-5}
mkdir -p "$out"
log=$out/latency.log
gg_queries_table "$dir" 'real[]'
gg_knn_sql "$op"
for spin in ${SPINS:-1000 0}; do
  eval "${RESTART:?RESTART: a command that restarts the server}" >/dev/null
  echo "== worker_spin $spin us, ef_search $ef: $(gg_wait_worker "$op")" | tee -a "$log"
  for c in ${CLIENTS:-1 16 64}; do
    gg_pgbench "spin $spin" "$c" "$secs" \
      "-c gpu_graph.search_device=gpu -c gpu_graph.ef_search=$ef -c gpu_graph.worker_spin=$spin" "$log"
    if [ "$c" = 1 ]; then
      gg_q -c "SELECT '  latency_us after 1 client: ' || (gpu_graph_worker_stats() -> 'latency_us')::text" | tee -a "$log"
    fi
    # the worker's thread so far (counters since the restart: the
    # difference of two lines is one run's)
    gg_q -c "SELECT '  requests after $c clients: ' || (gpu_graph_worker_stats() -> 'requests')::text" | tee -a "$log"
  done
  gg_q -c "SELECT '  fallbacks: ' || (gpu_graph_worker_stats() -> 'fallbacks')::text" | tee -a "$log"
done
cat >/tmp/gg-knn.sql <<'SQL'
\set qid random(0, 999)
SELECT v FROM queries WHERE id = :qid;
SQL
for c in 16 64; do
  gg_pgbench "primary-key lookup (floor)" "$c" "$secs" "" "$log"
done
