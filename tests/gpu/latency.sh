#!/usr/bin/env bash
# One query's latency through the search worker (issue 15), on a server with
# gpu_graph preloaded and the table `items` (column `embedding`) indexed
# from DIR: for each gpu_graph.worker_spin of SPINS the server is restarted
# (RESTART, a shell command: the worker's counters start at zero), the
# worker waited for, then pgbench -M prepared with 1 client (p50/p99, and
# the worker's breakdown: gpu_graph_worker_stats()->'latency_us'), 16 and
# 64 clients, each query's vector read from a table of the 1000 query
# vectors; last, PostgreSQL's own floor: pgbench of a primary-key lookup of
# that table (SELECT v FROM queries WHERE id = :qid) at 1, 16 and 64 clients.
# Each pgbench line gives the machine's CPU busy share over its run; after
# each, the worker thread's counters so far ('requests').
#
#   RESTART="pg_ctl -D ... -w restart" bash tests/gpu/latency.sh DIR OP EF
#   env: SPINS ("1000 0": the default, then sleeping at once), CLIENTS ("1 16 64"), SECS (5), OUT,
#        BUSY (1: each one-client run again beside a low-priority busy loop
#        on every core, so that no core idles between one client's
#        queries: how much of one client's latency is the wake-up of idle
#        cores, a diagnostic; 0, the default: not run)
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
busy_pids=()
busy_start() {
  local _
  for _ in $(seq 1 "$(nproc)"); do
    nice -n 19 bash -c 'while :; do :; done' &
    busy_pids+=($!)
  done
}
busy_stop() {
  kill "${busy_pids[@]}" 2>/dev/null || true
  wait "${busy_pids[@]}" 2>/dev/null || true
  busy_pids=()
}
trap busy_stop EXIT
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
    if [ "$c" = 1 ] && [ "${BUSY:-0}" = 1 ]; then
      busy_start
      gg_pgbench "spin $spin, cores kept busy" 1 "$secs" \
        "-c gpu_graph.search_device=gpu -c gpu_graph.ef_search=$ef -c gpu_graph.worker_spin=$spin" "$log"
      busy_stop
      gg_q -c "SELECT '  requests after 1 client, cores kept busy: ' || (gpu_graph_worker_stats() -> 'requests')::text" | tee -a "$log"
    fi
  done
  gg_q -c "SELECT '  fallbacks: ' || (gpu_graph_worker_stats() -> 'fallbacks')::text" | tee -a "$log"
done
cat >/tmp/gg-knn.sql <<'SQL'
\set qid random(0, 999)
SELECT v FROM queries WHERE id = :qid;
SQL
for c in 1 16 64; do
  gg_pgbench "primary-key lookup (floor)" "$c" "$secs" "" "$log"
  if [ "$c" = 1 ] && [ "${BUSY:-0}" = 1 ]; then
    busy_start
    gg_pgbench "primary-key lookup, cores kept busy" 1 "$secs" "" "$log"
    busy_stop
  fi
done
