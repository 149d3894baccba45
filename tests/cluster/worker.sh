#!/usr/bin/env bash
# The GPU search worker in its CPU test mode (gpu_graph.worker_device = cpu):
# the real shared-memory protocol, residency and fallbacks, without a GPU.
#
#   1. answers through the worker equal the CPU scan's, the counters move, a
#      scan that wants more rows goes on on the CPU without repeating a row
#  1c. a scan the worker serves reads no page of the index; after TRUNCATE
#      and REINDEX new rows are found through it, and a transaction finds
#      the rows it inserted itself
#   2. gpu_timeout shorter than the worker's answer (gpu_graph.worker_delay):
#      CPU answer, timeout counted, the slot comes back; a batch the same,
#      counted under batches.fallbacks.timeout
#   3. statement_timeout while waiting: a clean ERROR, the slot comes back,
#      the next query is served; (3b) a backend terminated while it waits
#      gives its slot back
#   4. the worker ended by pg_terminate_backend and by SIGTERM: CPU answers
#      while it is gone, it comes back and serves again
#   5. gpu_graph.inject_fault: the worker fails, exits with status 1 and is
#      restarted; no backend is harmed
#   6. pgbench searches through the worker while it is terminated, killed
#      and made to fail: no client error, every answer ordered by its true
#      distance
#   7. INSERT, DELETE and VACUUM under pgbench with searches through the
#      worker: its copy follows the change log (>= 95% of the scans served
#      by it, none out of date; the inserted rows come with the log, not
#      from their pages), a row is found through it right after its
#      commit; more writes than the log holds refresh the copy whole; new
#      rows found, the index holds exactly the table's rows
#   8. gpu_graph.gpu_memory_limit: least recently used copies evicted, an
#      index larger than the limit searched on the CPU
#   9. DROP DATABASE with a resident copy does not wait on the worker; the
#      copies of dropped indexes and databases are dropped
#  10. without a usable GPU, worker_device = gpu: the worker says why and
#      scans search on the CPU; worker = auto without a GPU starts none
#
#   bash tests/cluster/worker.sh      (after scripts/setup.sh)
#   GG_WORKER_DEVICE=gpu bash tests/cluster/worker.sh
#       the same against the GPU worker (on a machine with a GPU): answers
#       are then checked against the exact ones rather than the CPU scan's,
#       and a restart (CUDA context, kernel compile) is given longer
set -euo pipefail
# shellcheck source=scripts/cluster.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/cluster.sh"
fail() { gg_test_fail worker "$@"; }
q() { psql -X -q -v ON_ERROR_STOP=1 -At "$@"; }
# stat PATH: a field of gpu_graph_worker_stats(), e.g. stat scans,worker
stat() { q -c "SELECT gpu_graph_worker_stats() #>> '{$1}'"; }
# wait_for CONDITION [SECONDS]: poll an SQL condition every 0.1 s
wait_for() {
  local i
  for ((i = 0; i < ${2:-10} * 10; i++)); do
    [ "$(q -c "SELECT ($1)::int")" = 1 ] && return 0
    sleep 0.1
  done
  return 1
}
ms() { date +%s%3N; }
# through the worker (or its CPU fallback), never a sequential scan
GPU="SET enable_seqscan = off; SET gpu_graph.search_device = gpu;"

device=${GG_WORKER_DEVICE:-cpu}
case $device in
  cpu) restart=5 ;;
  gpu) restart=60 ;;
  *) echo "worker: GG_WORKER_DEVICE is cpu or gpu, not $device" >&2; exit 2 ;;
esac

work=$(mktemp -d "${TMPDIR:-/tmp}/gpu_graph-worker.XXXXXX")
gg_on_exit "rm -rf '$work'"
chmod 755 "$work"

gg_cluster_start "shared_preload_libraries = 'gpu_graph'" "gpu_graph.worker_device = $device" \
  "gpu_graph.build_device = cpu" "gpu_graph.gpu_timeout = 5s" "max_connections = 50"
q -c "CREATE EXTENSION gpu_graph"
wait_for "gpu_graph_worker_stats() #>> '{worker,state}' = 'running'" $restart || fail "the worker does not run"
q -c "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'gpu_graph search worker'" | grep -qx 1 ||
  fail "the worker is not in pg_stat_activity"

q <<'SQL'
SET client_min_messages = warning;
-- a 60×60 integer grid, and query points off the grid (no ties)
CREATE TABLE grid (id int, v real[]);
INSERT INTO grid SELECT i, ARRAY[(i / 60)::real, (i % 60)::real] FROM generate_series(0, 3599) i;
CREATE INDEX grid_idx ON grid USING gpu_graph (v);
CREATE TABLE queries AS
  SELECT q, ARRAY[(q * 7 % 59) + 0.31, (q * 13 % 59) + 0.17]::real[] AS v FROM generate_series(1, 30) q;
CREATE FUNCTION knn(query real[], k int) RETURNS int[] LANGUAGE sql AS
  $$ SELECT array_agg(id) FROM (SELECT id FROM grid ORDER BY v <-> query LIMIT k) s $$;
SET enable_indexscan = off;
CREATE TABLE exact AS SELECT q, knn(v, 10) AS ids FROM queries;
SQL
EXPECT=$(q -c "SELECT ids[1:5] FROM exact WHERE q = 1")
QV=$(q -c "SELECT v FROM queries WHERE q = 1")
# check: a scan of query 1 through the worker path answers right
check() { q -c "$GPU ${1:-}" -c "SELECT knn('$QV', 5)::text = '$EXPECT'" | tail -n 1; }
# served_again: a scan is answered by the worker (a new worker copies the index first)
# current INDEX TABLE [DATABASE]: scans through the worker until it holds a
# copy of the index as it is now
current() {
  local i db=${3:-$PGDATABASE}
  for ((i = 0; i < 50; i++)); do
    q -d "$db" -c "$GPU" -c "SELECT count(*) FROM (SELECT 1 FROM $2 ORDER BY v <-> (SELECT v FROM $2 LIMIT 1) LIMIT 1) s" >/dev/null
    [ "$(q -d "$db" -c "SELECT gpu_graph_info('$1') #>> '{search,resident,generation}' = gpu_graph_info('$1') ->> 'generation'")" = t ] && return 0
    sleep 0.1
  done
  fail "the worker holds no current copy of $1"
}
served_again() {
  local before i
  for ((i = 0; i < 50; i++)); do
    before=$(stat scans,worker)
    [ "$(check)" = t ] || fail "a wrong answer after the worker came back"
    [ "$(stat scans,worker)" -gt "$before" ] && return 0
    sleep 0.1
  done
  fail "the worker does not serve again"
}

echo "1. answers through the worker"
[ "$(check)" = t ] || fail "first scan (no copy yet) answered wrong"
wait_for "gpu_graph_info('grid_idx') #>> '{search,resident}' IS NOT NULL" || fail "the worker made no copy of grid_idx"
before=$(stat scans,worker); busy0=$(stat requests,work_ms); t0=$(ms)
q <<SQL
$GPU
CREATE TABLE via_worker AS SELECT q, knn(v, 10) AS ids FROM queries;
SET gpu_graph.search_device = cpu;
CREATE TABLE via_cpu AS SELECT q, knn(v, 10) AS ids FROM queries;
SQL
served=$(($(stat scans,worker) - before))
# the worker's busy time grew with the scans it served, within the wall time
busy=$(awk -v a="$(stat requests,work_ms)" -v b="$busy0" 'BEGIN {print a - b}')
awk -v w="$busy" -v t="$(($(ms) - t0))" 'BEGIN {exit !(w > 0 && w <= t)}' ||
  fail "the worker's work time grew by $busy ms over $(($(ms) - t0)) ms"
same=$(q -c "SELECT count(*) FROM via_worker w JOIN via_cpu c USING (q) WHERE w.ids = c.ids")
exact=$(q -c "SELECT count(*) FROM via_worker w JOIN exact e USING (q) WHERE w.ids = e.ids")
echo "  $served scans served by the worker (its thread busy $busy ms); equal to the CPU scan: $same/30, exact: $exact/30"
[ "$served" -ge 30 ] || fail "the worker served $served of 30 scans"
# the CPU test mode runs the CPU scan's search on an identical copy
[ "$device" = gpu ] || [ "$same" = 30 ] || fail "the worker's answers differ from the CPU scan's"
[ "$exact" -ge 28 ] || fail "only $exact/30 exact answers"
# the latency breakdown: each step counted for every served scan (the
# queue and search on the worker's side, for each request it took), its
# percentiles in order, and no step longer than the round trip it is in
# (the GPU's own steps only with a GPU: null in the CPU test mode)
latency=$(q -c "SELECT string_agg(format('%s %s %s %s %s', key, value->>'count', value->>'p50', value->>'p90', value->>'p99'), ',' ORDER BY key)
                FROM jsonb_each(gpu_graph_worker_stats() -> 'latency_us') WHERE jsonb_typeof(value) <> 'null'")
echo "  latency (step count p50 p90 p99, µs): $latency"
python3 - "$latency" "$device" <<'PY' || fail "the latency breakdown is wrong: $latency"
import sys
steps = {s.split()[0]: [float(x) for x in s.split()[1:]] for s in sys.argv[1].split(',')}
want = {'queue', 'search', 'wake', 'verify', 'roundtrip'}
if sys.argv[2] == 'gpu':
    want |= {'kernel', 'kernel_start', 'kernel_steps', 'kernel_dispatch', 'transport'}
assert set(steps) == want, steps
if sys.argv[2] == 'gpu':
    # the kernel's part of a search is within the search
    assert steps['kernel'][1] <= steps['search'][3] * 1.1, steps
for name, (n, p50, p90, p99) in steps.items():
    assert n >= 30 and p50 <= p90 <= p99, (name, n, p50, p90, p99)
# every scan the backend read was counted once in each backend-side step
assert steps['roundtrip'][0] == steps['wake'][0] == steps['verify'][0], steps
for name in ('queue', 'search', 'wake'):
    assert steps[name][1] <= steps['roundtrip'][3] * 1.1, (name, steps)
PY
# the breakdown starts over: empty after the reset, then exactly the scans
# the worker served since (the counters go on)
q -c "SELECT gpu_graph_worker_latency_reset()" >/dev/null
[ "$(q -c "SELECT count(*) FROM jsonb_each(gpu_graph_worker_stats() -> 'latency_us') WHERE jsonb_typeof(value) <> 'null'")" = 0 ] ||
  fail "the latency breakdown is not empty after gpu_graph_worker_latency_reset()"
[ "$(stat scans,worker)" -ge "$((before + served))" ] || fail "the reset cleared the scans' counter"
before=$(stat scans,worker)
[ "$(check)" = t ] || fail "wrong answer after the latency reset"
served=$(($(stat scans,worker) - before))
[ "$served" -gt 0 ] && [ "$(stat latency_us,roundtrip,count)" = "$served" ] ||
  fail "after the reset the round trip counted $(stat latency_us,roundtrip,count) scans, the worker served $served"
echo "  latency reset: empty, then $served round trips for $served served scans"
before=$(stat scans,cpu_after_worker)
rows=$(q -c "$GPU SET gpu_graph.ef_search = 20;" \
  -c "SELECT count(*) || '/' || count(DISTINCT id) FROM (SELECT id FROM grid ORDER BY v <-> '{30.3,30.2}' LIMIT 5000) s" | tail -n 1)
[ "$rows" = 3600/3600 ] || fail "a full scan after the worker's round returned $rows rows/distinct"
[ "$(stat scans,cpu_after_worker)" -gt "$before" ] || fail "the full scan did not go on on the CPU"
rows=$(q -c "$GPU" -c "SELECT count(*) FROM (SELECT id FROM grid WHERE id % 7 = 0 ORDER BY v <-> '{30.3,30.2}' LIMIT 30) s" | tail -n 1)
[ "$rows" = 30 ] || fail "a filtered scan returned $rows rows, not 30"
echo "  full scan: 3600 distinct rows; filtered LIMIT 30: 30 rows"
before=$(stat scans,worker)
[ "$(check "SET gpu_graph.worker_spin = 0;")" = t ] || fail "wrong answer with gpu_graph.worker_spin = 0"
[ "$(stat scans,worker)" -gt "$before" ] || fail "gpu_graph.worker_spin = 0: the scan was not served by the worker"
echo "  worker_spin = 0 (asleep on its latch at once, woken by the worker): served by the worker, right"

echo "1b. gpu_graph.worker_core"
# the cores a process may run on (a list as 0-3,5)
allowed() { awk '/^Cpus_allowed_list/ {print $2}' "/proc/$1/status"; }
# the cores of the backend that runs it
MY_CPUS="SELECT substring(pg_read_file('/proc/self/status') FROM 'Cpus_allowed_list:\s*(\S+)')"
# whether core $2 is in list $1
holds() { python3 -c 'import sys; c = int(sys.argv[2]); sys.exit(0 if any(int(r.split("-")[0]) <= c <= int(r.split("-")[-1]) for r in sys.argv[1].split(",") if r) else 1)' "$1" "$2"; }
# the postmaster's (the worker's parent), which every server process starts with
server=$(allowed "$(awk '/^PPid/ {print $2}' "/proc/$(stat worker,pid)/status")")
q -c "ALTER SYSTEM SET gpu_graph.worker_core = on" -c "SELECT pg_reload_conf()" >/dev/null
if [ "$(nproc)" -ge 2 ]; then
  wait_for "gpu_graph_worker_stats() #>> '{worker,core}' IS NOT NULL" || fail "worker_core = on: the worker keeps no core"
  core=$(stat worker,core)
  [ "$(allowed "$(stat worker,pid)")" = "$core" ] || fail "the worker keeps core $core but may run on $(allowed "$(stat worker,pid)")"
  before=$(stat scans,worker)
  mine=$(q -c "$GPU" -c "SELECT knn('$QV', 5)" -c "$MY_CPUS" | tail -n 1)
  [ "$(stat scans,worker)" -gt "$before" ] || fail "worker_core = on: the scan was not served by the worker"
  ! holds "$mine" "$core" || fail "a backend that asked the worker still runs on its core $core ($mine)"
  holds "$server" "$core" || fail "the worker's core $core is not one of the server's ($server)"
  [ "$(check)" = t ] || fail "a wrong answer with the worker on its own core"
  # VACUUM's repair (on every core) keeps off it too
  q -c "SET client_min_messages = error" -c "CREATE TABLE vac AS SELECT * FROM grid WHERE id < 400" \
    -c "CREATE INDEX vac_idx ON vac USING gpu_graph (v)" -c "DELETE FROM vac WHERE id < 100" >/dev/null
  vacuumed=$(q -c "VACUUM (INDEX_CLEANUP ON) vac" -c "$MY_CPUS" | tail -n 1)
  q -c "DROP TABLE vac"
  ! holds "$vacuumed" "$core" || fail "a backend that ran VACUUM still runs on the worker's core $core ($vacuumed)"
  echo "  on: the worker runs on core $core alone, a backend that asked it on $mine, one that ran VACUUM on $vacuumed (the server's: $server); answers right"
  q -c "ALTER SYSTEM SET gpu_graph.worker_core = off" -c "SELECT pg_reload_conf()" >/dev/null
  wait_for "gpu_graph_worker_stats() #>> '{worker,core}' IS NULL" || fail "worker_core = off: the worker still keeps a core"
  [ "$(allowed "$(stat worker,pid)")" = "$server" ] || fail "worker_core = off: the worker runs on $(allowed "$(stat worker,pid)"), not $server"
  echo "  off: the worker runs on $server again"
else
  echo "  one core: none kept ($(stat worker,core))"
fi
q -c "ALTER SYSTEM RESET gpu_graph.worker_core" -c "SELECT pg_reload_conf()" >/dev/null

echo "1c. a scan the worker answers reads no page of the index"
# the meta page's generation and node count from shared memory
# (worker::meta_mirror), the rest from the relation cache: after a
# session's first scan, 30 scans served by the worker read no index block
IFS="|" read -r blocks served <<<"$(q <<SQL | tail -n 1
$GPU
SELECT count(*) FROM (SELECT knn('$QV', 5)) s;
SELECT pg_stat_force_next_flush();
SELECT idx_blks_read + idx_blks_hit AS b0, gpu_graph_worker_stats() #>> '{scans,worker}' AS w0
  FROM pg_statio_user_indexes WHERE indexrelid = 'grid_idx'::regclass \gset
SELECT count(knn(v, 5)) FROM queries;
SELECT pg_stat_force_next_flush();
SELECT idx_blks_read + idx_blks_hit - :b0, (gpu_graph_worker_stats() #>> '{scans,worker}')::bigint - :w0
  FROM pg_statio_user_indexes WHERE indexrelid = 'grid_idx'::regclass;
SQL
)"
[ "$served" = 30 ] || fail "the worker served $served of the 30 scans"
[ "$blocks" = 0 ] || fail "30 scans the worker served read $blocks index blocks"
# a new file under the index (TRUNCATE, REINDEX): rows inserted after it
# are found through the worker by their own vectors, none left out by an
# older node count
q -c "SET client_min_messages = warning" -c "CREATE TABLE churn (id int, v real[])" \
  -c "INSERT INTO churn SELECT i, ARRAY[i, i % 17]::real[] FROM generate_series(1, 300) i" \
  -c "CREATE INDEX churn_idx ON churn USING gpu_graph (v)"
OWN="SELECT count(*) FROM churn c WHERE (SELECT id FROM churn ORDER BY v <-> c.v LIMIT 1) = c.id"
current churn_idx churn
[ "$(q -c "$GPU" -c "$OWN" | tail -n 1)" = 300 ] || fail "rows of churn not found by their own vectors"
for change in "TRUNCATE churn" "REINDEX INDEX churn_idx"; do
  q -c "$change" -c "INSERT INTO churn SELECT i, ARRAY[i + 1000, i % 13]::real[] FROM generate_series(301, 380) i"
  n=$(q -c "SELECT count(*) FROM churn")
  # the shared fields are at least the page's
  info="gpu_graph_info('churn_idx')"
  [ "$(q -c "SELECT ($info #>> '{search,meta_mirror,node_count}')::bigint >= ($info #>> '{nodes,allocated}')::bigint
                AND ($info #>> '{search,meta_mirror,generation}')::bigint >= ($info ->> 'generation')::bigint")" = t ] ||
    fail "after $change: the shared meta fields $(q -c "SELECT $info #> '{search,meta_mirror}'") are behind the page's $(q -c "SELECT $info ->> 'generation', $info #>> '{nodes,allocated}'")"
  current churn_idx churn
  before=$(stat scans,worker)
  found=$(q -c "$GPU" -c "$OWN" | tail -n 1)
  [ "$found" = "$n" ] || fail "after $change: $found of $n rows found by their own vectors (the index: $(q -c "SELECT $info - 'build' - 'parameters'"))"
  [ "$(($(stat scans,worker) - before))" -ge "$n" ] || fail "after $change: the scans were not served by the worker"
done
# a transaction finds the rows it inserted itself, not yet committed
mine=$(q -c "$GPU" -c "BEGIN" -c "INSERT INTO churn SELECT i, ARRAY[i - 900, 50]::real[] FROM generate_series(1001, 1020) i" \
  -c "SELECT count(*) FROM churn c WHERE c.id > 1000 AND (SELECT id FROM churn ORDER BY v <-> c.v LIMIT 1) = c.id" -c "COMMIT" | tail -n 1)
[ "$mine" = 20 ] || fail "a transaction found $mine of the 20 rows it inserted through the worker"
q -c "DROP TABLE churn"
echo "  30 scans served, 0 index blocks read; after TRUNCATE and REINDEX every new row found through the worker, and a transaction's own"

echo "2. gpu_timeout"
before=$(stat fallbacks,timeout)
t0=$(ms)
[ "$(check "SET gpu_graph.worker_delay = 1500; SET gpu_graph.gpu_timeout = 50;")" = t ] || fail "wrong answer after a timeout"
took=$(($(ms) - t0))
echo "  answered on the CPU in $took ms (the worker would have taken 1500)"
[ "$took" -lt 1200 ] || fail "the scan waited $took ms"
[ "$(stat fallbacks,timeout)" -gt "$before" ] || fail "no timeout counted"
wait_for "(gpu_graph_worker_stats() #>> '{worker,slots_in_use}')::int = 0" 5 || fail "the slot was not reclaimed"
# a batch too: searched on the CPU, right, counted as a batch timeout
before=$(stat batches,fallbacks,timeout)
got=$(q -c "$GPU SET gpu_graph.worker_delay = 1500; SET gpu_graph.gpu_timeout = 50;" -c "
  SELECT bool_and(b.ids[1:5] = e.ids[1:5]) FROM (SELECT query, array_agg(g.id ORDER BY r.rank) AS ids
    FROM gpu_graph_search_batch('grid_idx', (SELECT array_agg(v ORDER BY q) FROM queries), 5) r
    JOIN grid g ON g.ctid = r.ctid GROUP BY query) b JOIN exact e ON e.q = b.query" | tail -n 1)
[ "$got" = t ] || fail "a batch after its timeout: right answers $got (want t)"
[ "$(stat batches,fallbacks,timeout)" = $((before + 1)) ] ||
  fail "the batch's timeout not counted: $(stat batches,fallbacks)"
wait_for "(gpu_graph_worker_stats() #>> '{worker,slots_in_use}')::int = 0" 5 || fail "the batch's slot was not reclaimed"
echo "  a batch searched on the CPU after its timeout, right, counted as batches.fallbacks.timeout"

echo "3. cancel while waiting"
if q -c "$GPU SET gpu_graph.worker_delay = 2000; SET statement_timeout = 200;" -c "SELECT knn('$QV', 5)" 2>"$work/cancel.err"; then
  fail "the scan was not cancelled"
fi
grep -q "canceling statement due to statement timeout" "$work/cancel.err" || fail "cancel: $(cat "$work/cancel.err")"
wait_for "(gpu_graph_worker_stats() #>> '{worker,slots_in_use}')::int = 0" 5 || fail "the cancelled scan's slot was not reclaimed"
served_again
echo "  clean ERROR, slot reclaimed, next scan served by the worker"

echo "3b. a waiting backend terminated (FATAL while it waits: its claim is never dropped)"
[ "$(stat worker,slots_in_use)" = 0 ] || fail "after the timeout and the cancel, $(stat worker,slots_in_use) slots in use (want 0)"
q -c "$GPU SET gpu_graph.worker_delay = 3000; SET application_name = 'gg_waiter';" -c "SELECT knn('$QV', 5)" >/dev/null 2>&1 &
waiter=$!
wait_for "(gpu_graph_worker_stats() #>> '{worker,slots_in_use}')::int = 1" 5 || fail "the delayed scan holds no slot"
q -c "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'gg_waiter'" >/dev/null
wait "$waiter" 2>/dev/null && fail "the terminated scan's session did not fail"
wait_for "(gpu_graph_worker_stats() #>> '{worker,slots_in_use}')::int = 0" 5 || fail "the terminated scan's slot was not reclaimed"
served_again
echo "  its slot held while it waited, reclaimed after it was terminated"

echo "4. worker terminated"
for how in pg_terminate_backend SIGTERM; do
  starts=$(stat worker,starts)
  pid=$(stat worker,pid)
  if [ $how = SIGTERM ]; then kill -TERM "$pid"; else q -c "SELECT pg_terminate_backend($pid)" >/dev/null; fi
  wait_for "gpu_graph_worker_stats() #>> '{worker,state}' = 'absent'" 5 || fail "the worker did not stop ($how)"
  before=$(stat fallbacks,absent)
  [ "$(check)" = t ] || fail "wrong answer while the worker is gone"
  [ "$(stat fallbacks,absent)" -gt "$before" ] || fail "no absent fallback counted"
  wait_for "(gpu_graph_worker_stats() #>> '{worker,starts}')::int > $starts
            AND gpu_graph_worker_stats() #>> '{worker,state}' = 'running'" $restart || fail "the worker did not come back ($how)"
  served_again
  echo "  $how: CPU answers while gone, back as pid $(stat worker,pid), serving"
done

echo "5. inject_fault"
starts=$(stat worker,starts)
[ "$(check "SET gpu_graph.inject_fault = on;")" = t ] || fail "wrong answer when the worker failed"
wait_for "(gpu_graph_worker_stats() #>> '{worker,starts}')::int > $starts
          AND gpu_graph_worker_stats() #>> '{worker,state}' = 'running'" $restart || fail "the worker did not restart after the fault"
served_again
grep -q "exited with exit code 1" "$GG_CLUSTER_DIR/postgres.log" || fail "no clean worker exit in the log"
echo "  the worker exited with status 1, restarted and serves"

echo "6. pgbench through the worker while it is terminated, killed and failing"
cat >"$work/search.sql" <<'SQL'
\set x random(0, 5899)
SET enable_seqscan = off;
SET gpu_graph.search_device = gpu;
SELECT 1 / (count(*) = 10 AND bool_and(d >= p))::int FROM (
  SELECT d, lag(d, 1, 0::float8) OVER () AS p FROM (
    SELECT v <-> ARRAY[:x / 100 + 0.31, :x % 59 + 0.17]::real[] AS d
      FROM grid ORDER BY v <-> ARRAY[:x / 100 + 0.31, :x % 59 + 0.17]::real[] LIMIT 10) s) t;
SQL
before=$(stat scans,worker)
pgbench -n -T 10 -c 4 -j 2 -f "$work/search.sql" postgres >"$work/pgbench.log" 2>&1 &
bench=$!
sleep 2
q -c "SELECT pg_terminate_backend((gpu_graph_worker_stats() #>> '{worker,pid}')::int)" >/dev/null
sleep 3
wait_for "gpu_graph_worker_stats() #>> '{worker,state}' = 'running'" $restart && kill -TERM "$(stat worker,pid)"
sleep 3
wait_for "gpu_graph_worker_stats() #>> '{worker,state}' = 'running'" $restart &&
  q -c "$GPU SET gpu_graph.inject_fault = on;" -c "SELECT knn('$QV', 5)" >/dev/null
wait $bench || { cat "$work/pgbench.log"; fail "pgbench reported an error"; }
grep -E "number of (transactions actually processed|failed)" "$work/pgbench.log" | sed 's/^/  /'
echo "  scans served by the worker meanwhile: $(($(stat scans,worker) - before)); fallbacks: $(stat fallbacks)"

echo "7. INSERT, DELETE and VACUUM while searching through the worker"
# coordinates in 1/1024ths, which f16 (the index's default storage) holds
# exactly: the scan ranks by the stored values, so the order it hands out
# is then exactly the order of `v <-> q` over the table's values, which
# the check asserts (with random() values, two rows within f16 rounding of
# each other may come out swapped: ranked by their stored f16 values)
q <<'SQL'
SET client_min_messages = warning;
CREATE FUNCTION r() RETURNS real LANGUAGE sql AS $$ SELECT (floor(random() * 1024) / 1024)::real $$;
CREATE TABLE items (id bigint, v real[]);
INSERT INTO items SELECT i, ARRAY[r(), r(), r(), r(), r(), r(), r(), r()] FROM generate_series(1, 3000) i;
CREATE INDEX items_idx ON items USING gpu_graph (v) WITH (degree = 16);
-- the test's VACUUMs only: a copy current at the end stays current
ALTER TABLE items SET (autovacuum_enabled = off);
CREATE SEQUENCE ids START 1000000;
SQL
cat >"$work/insert.sql" <<'SQL'
INSERT INTO items SELECT nextval('ids'), ARRAY[r(), r(), r(), r(), r(), r(), r(), r()] FROM generate_series(1, 5);
SQL
cat >"$work/items.sql" <<'SQL'
SET enable_seqscan = off;
SET gpu_graph.search_device = gpu;
SELECT 1 / (count(*) = 10 AND bool_and(d >= p))::int FROM (
  SELECT d, lag(d, 1, 0::float8) OVER () AS p FROM (
    SELECT v <-> '{0.5,0.4,0.6,0.5,0.3,0.5,0.7,0.5}' AS d
      FROM items ORDER BY v <-> '{0.5,0.4,0.6,0.5,0.3,0.5,0.7,0.5}' LIMIT 10) s) t;
SQL
cat >"$work/delete.sql" <<'SQL'
DELETE FROM items WHERE id = (random() * 3000)::int;
SQL
# the first scan makes the copy; from then on the worker follows the
# change log and serves every scan, however the table is written
current items_idx items
before=$(stat scans,worker)
stale=$(stat fallbacks,stale)
patched=$(stat residency,patched_pages)
rows_logged=$(stat residency,patched_rows_from_log); rows_read=$(stat residency,patched_rows_from_pages)
from_log=$(stat residency,patches_from_log)
ins_worker=$(stat inserts,worker); ins_cpu=$(stat inserts,cpu)
pgbench -n -T 10 -c 6 -j 2 -f "$work/insert.sql@2" -f "$work/items.sql@6" -f "$work/delete.sql@1" postgres \
  >"$work/pgbench2.log" 2>&1 &
bench=$!
for _ in 1 2 3; do sleep 3; q -c "VACUUM items"; done
wait $bench || { cat "$work/pgbench2.log"; fail "pgbench reported an error"; }
grep -E "number of (transactions actually processed|failed)" "$work/pgbench2.log" | sed 's/^/  /'
served=$(($(stat scans,worker) - before))
stale=$(($(stat fallbacks,stale) - stale))
echo "  scans served by the worker meanwhile: $served; out of date (searched on the CPU): $stale; pages patched into its copy: $(($(stat residency,patched_pages) - patched)); log overflows: $(stat residency,log_overflows)"
[ $((served * 100)) -ge $(((served + stale) * 95)) ] || fail "the worker served $served scans, $stale went to the CPU as out of date"
# the inserted rows come to the copy with the change log, not from their pages
rows_logged=$(($(stat residency,patched_rows_from_log) - rows_logged))
rows_read=$(($(stat residency,patched_rows_from_pages) - rows_read))
echo "  rows patched into its copy from the change log: $rows_logged; read from their pages: $rows_read"
[ "$rows_logged" -gt 0 ] || fail "no row came to the worker's copy with the change log ($rows_read read from pages)"
# and a patch of inserts alone reads no page: the log carries the meta page too
from_log=$(($(stat residency,patches_from_log) - from_log))
echo "  patches that read no page of the index: $from_log"
[ "$from_log" -gt 0 ] || fail "every patch read pages of the index (none came from the change log alone)"
# each inserted row's neighbour search is the worker's too
ins_worker=$(($(stat inserts,worker) - ins_worker)); ins_cpu=$(($(stat inserts,cpu) - ins_cpu))
echo "  inserted rows whose neighbours the worker found: $ins_worker; searched on the CPU: $ins_cpu"
[ $((ins_worker * 100)) -ge $(((ins_worker + ins_cpu) * 90)) ] ||
  fail "the worker searched for $ins_worker inserted rows' neighbours, the CPU for $ins_cpu"

# freshness: a row committed before a scan starts is found through the
# worker at once (no wait for a new copy), 100 times in a row
for i in $(seq 1 100); do
  vec="ARRAY[$((i % 1024)) / 1024.0, $((i * 7 % 1024)) / 1024.0, $((i * 13 % 1024)) / 1024.0, $((i * 31 % 1024)) / 1024.0, 5 / 1024.0, 17 / 1024.0, $((i * 3 % 1024)) / 1024.0, 511 / 1024.0]::real[]"
  echo "INSERT INTO items VALUES ($((2000000 + i)), $vec);"
  echo "SELECT id = $((2000000 + i)) FROM items ORDER BY v <-> $vec LIMIT 1;"
done >"$work/fresh.sql"
before=$(stat scans,worker)
stale=$(stat fallbacks,stale)
found=$(q -c "$GPU" -f "$work/fresh.sql" | grep -c '^t$' || true)
served=$(($(stat scans,worker) - before))
stale=$(($(stat fallbacks,stale) - stale))
echo "  rows found through the worker right after their commit: $found/100 ($served served by it, $stale out of date)"
[ "$found" = 100 ] && [ "$served" = 100 ] || fail "fresh rows: $found/100 found, $served/100 served by the worker"
# the same while other scans keep the worker busy (an idle worker patches
# its copy at once; a busy one when a request needs the change)
for i in $(seq 1 100); do
  vec="ARRAY[$((i * 11 % 1024)) / 1024.0, $((i * 17 % 1024)) / 1024.0, $((i * 5 % 1024)) / 1024.0, $((i * 29 % 1024)) / 1024.0, 300 / 1024.0, 700 / 1024.0, $((i * 23 % 1024)) / 1024.0, 99 / 1024.0]::real[]"
  echo "INSERT INTO items VALUES ($((3000000 + i)), $vec);"
  echo "SELECT id = $((3000000 + i)) FROM items ORDER BY v <-> $vec LIMIT 1;"
done >"$work/fresh2.sql"
pgbench -n -T 60 -c 3 -j 1 -f "$work/items.sql" postgres >"$work/pgbench_fresh.log" 2>&1 &
bench=$!
sleep 1
before=$(stat scans,worker)
found=$(q -c "$GPU" -f "$work/fresh2.sql" | grep -c '^t$' || true)
served=$(($(stat scans,worker) - before))
kill $bench 2>/dev/null || true
wait $bench 2>/dev/null || true
echo "  the same beside other scans: $found/100 found ($served scans served by the worker meanwhile)"
[ "$found" = 100 ] || fail "fresh rows beside other scans: $found/100 found"

# an insert in progress (not committed) has moved the index's generation
# on and written pages: scans still get the worker's copy, which holds
# every committed change, rather than the CPU as out of date
q -c "BEGIN" -c "INSERT INTO items VALUES (2000500, ARRAY[0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5]::real[])" \
  -c "SELECT pg_sleep(4)" -c "COMMIT" >/dev/null &
open_insert=$!
sleep 1
before=$(stat scans,worker)
stale=$(stat fallbacks,stale)
for _ in $(seq 1 20); do echo "SELECT count(*) FROM (SELECT 1 FROM items ORDER BY v <-> '{0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8}' LIMIT 10) s;"; done >"$work/during.sql"
q -c "$GPU" -f "$work/during.sql" >/dev/null
served=$(($(stat scans,worker) - before))
stale=$(($(stat fallbacks,stale) - stale))
wait $open_insert
echo "  with an insert in progress: $served/20 scans served by the worker, $stale out of date"
[ "$served" = 20 ] || fail "with an insert in progress the worker served $served of 20 scans ($stale out of date)"

# more page writes than the log holds (12,000 rows, ~10 pages each) while
# the worker is stopped: it reads an overflow, reads the pages whose LSN
# moved again into its copy in place (no new load), and answers right
# (the checks below run on that copy)
overflows=$(stat residency,log_overflows)
resyncs=$(stat residency,resyncs)
loads=$(stat residency,loads)
wpid=$(stat worker,pid)
kill -STOP "$wpid"
q -c "INSERT INTO items SELECT 900000 + i, ARRAY[r(), r(), r(), r(), r(), r(), r(), r()] FROM generate_series(1, 12000) i"
kill -CONT "$wpid"
current items_idx items
[ "$(stat residency,log_overflows)" -gt "$overflows" ] || fail "12,000 inserted rows did not overflow the change log"
[ "$(stat residency,resyncs)" -gt "$resyncs" ] && [ "$(stat residency,loads)" = "$loads" ] ||
  fail "after the overflow: $(($(stat residency,resyncs) - resyncs)) copies read again in place, $(($(stat residency,loads) - loads)) loaded whole"
echo "  the change log overflowed while the worker was stopped: its copy read $(stat residency,resynced_pages) changed pages again in place, no new load"
q -c "VACUUM items"
rows=$(q -c "SELECT count(*) FROM items")
live=$(q -c "SELECT (gpu_graph_info('items_idx')->'nodes'->>'live')::int")
[ "$rows" = "$live" ] || fail "the index holds $live live nodes for $rows rows"
# the worker copies the index as it is now, then answers: every surviving
# inserted row (those written while the log was lost included) is found
# by a search for its own vector
current items_idx items
before=$(stat scans,worker)
found=$(q -c "$GPU" -c "
  SELECT count(*) FILTER (WHERE o.id = (SELECT id FROM items ORDER BY v <-> o.v LIMIT 1)) || '/' || count(*)
  FROM items o WHERE o.id > 900000" | tail -n 1)
got=${found%/*}; all=${found#*/}
served=$(($(stat scans,worker) - before))
echo "  inserted rows found by their own vector through the worker: $found ($served scans served by it)"
[ "$all" -gt 0 ] && [ $((got * 100)) -ge $((all * 99)) ] || fail "only $found inserted rows found"
[ "$served" -ge "$all" ] || fail "the worker served $served of $all scans"
# the CPU test mode's copy holds the pages' own vectors: every answer came
# with its rows and distances, no page read again (worker::rows)
reread=$(stat scans,reread)
[ "$reread" = 0 ] || fail "$reread worker-served scans read their answer from the pages again"
echo "  every answer carried its rows and distances: scans.reread = 0"
n=$(q -c "$GPU" -c "
  SELECT count(*) || '/' || count(DISTINCT id) FROM (SELECT id FROM items ORDER BY v <-> '{0.5,0.5,0.5,0.5,0.5,0.5,0.5,0.5}' LIMIT 1000000) s" | tail -n 1)
[ "$n" = "$rows/$rows" ] || fail "a full scan returned $n rows/distinct for $rows rows"

echo "7b. a pgvector column through the worker"
if [ -f "$("$PG_CONFIG" --sharedir)/extension/vector.control" ]; then
  q -c "SET client_min_messages = warning" -c "CREATE EXTENSION vector" -c "CREATE EXTENSION gpu_graph_pgvector" \
    -c "CREATE TABLE hv (id int, h halfvec(2))" \
    -c "INSERT INTO hv SELECT i, ARRAY[i / 100, i % 100]::halfvec FROM generate_series(0, 9999) i" \
    -c "CREATE INDEX hv_idx ON hv USING gpu_graph (h halfvec_l2_ops)"
  for ((i = 0; i < 50; i++)); do
    q -c "$GPU" -c "SELECT 1 FROM hv ORDER BY h <-> '[1,1]' LIMIT 1" >/dev/null
    [ "$(q -c "SELECT gpu_graph_info('hv_idx') #>> '{search,resident}' IS NOT NULL")" = t ] && break
    sleep 0.1
  done
  before=$(stat scans,worker)
  got=$(q -c "$GPU" -c "SELECT string_agg(id::text, ',') FROM (SELECT id FROM hv ORDER BY h <-> '[40.1,60.2]' LIMIT 3) s" | tail -n 1)
  [ "$(stat scans,worker)" -gt "$before" ] || fail "the halfvec scan was not served by the worker"
  [ "$got" = "4060,4061,4160" ] || fail "the halfvec scan through the worker answered $got"
  echo "  halfvec_l2_ops served by the worker, nearest to [40.1,60.2]: $got"
else
  echo "  skipped: pgvector not installed"
fi

echo "8. gpu_memory_limit"
# grid's copy takes 3600 × (2 × 4 + 32 × 4 + 1) = 493,200 bytes: two fit in
# 1 MB, three do not; big's 12000 × (8 × 4 + 16 × 4 + 1) bytes never fit
q <<'SQL'
SET client_min_messages = warning;
CREATE TABLE grid2 AS SELECT * FROM grid;
CREATE INDEX grid2_idx ON grid2 USING gpu_graph (v);
CREATE TABLE grid3 AS SELECT * FROM grid;
CREATE INDEX grid3_idx ON grid3 USING gpu_graph (v);
CREATE TABLE big (id int, v real[]);
INSERT INTO big SELECT i, ARRAY[random(), random(), random(), random(), random(), random(), random(), random()]::real[]
  FROM generate_series(1, 12000) i;
CREATE INDEX big_idx ON big USING gpu_graph (v) WITH (degree = 16);
ALTER SYSTEM SET gpu_graph.gpu_memory_limit = '1MB';
SQL
q -c "SELECT pg_reload_conf()" >/dev/null
sleep 0.5
evictions=$(stat residency,evictions)
current grid_idx grid
current grid2_idx grid2
current grid3_idx grid3
resident=$(q -c "SELECT string_agg(coalesce(c.relname, e->>'relfilenode') || ' ' || (e->>'bytes'), ' + ')
  FROM jsonb_array_elements(gpu_graph_worker_stats() #> '{residency,indexes}') e
  LEFT JOIN pg_class c ON c.relfilenode = (e->>'relfilenode')::oid")
echo "  resident under 1 MB: $resident bytes; evictions: $(($(stat residency,evictions) - evictions))"
[ "$(stat residency,evictions)" -gt "$evictions" ] || fail "no copy evicted under the limit"
[ "$(q -c "SELECT gpu_graph_info('grid_idx') #>> '{search,resident}' IS NULL")" = t ] || fail "grid_idx, least recently used, is still resident"
[ "$(q -c "SELECT gpu_graph_info('grid3_idx') #>> '{search,resident}' IS NOT NULL")" = t ] || fail "grid3_idx is not resident"
before=$(stat fallbacks,unfit)
for _ in 1 2 3; do q -c "$GPU" -c "SELECT count(*) FROM (SELECT 1 FROM big ORDER BY v <-> (SELECT v FROM big LIMIT 1) LIMIT 5) s" >/dev/null; sleep 0.2; done
[ "$(stat fallbacks,unfit)" -gt "$before" ] || fail "the index over the limit was not searched on the CPU as unfit"
[ "$(q -c "SELECT gpu_graph_info('big_idx') #>> '{search,resident}' IS NULL")" = t ] || fail "big_idx is resident over the limit"
echo "  least recently used copy evicted; an index over the limit stays on the CPU"

echo "9. dropped indexes and databases"
q -c "CREATE DATABASE other"
q -d other <<'SQL'
SET client_min_messages = warning;
CREATE EXTENSION gpu_graph;
CREATE TABLE t AS SELECT i, ARRAY[i % 50, i / 50]::real[] AS v FROM generate_series(0, 2499) i;
CREATE INDEX t_idx ON t USING gpu_graph (v);
SQL
current t_idx t other
other=$(q -c "SELECT oid FROM pg_database WHERE datname = 'other'")
gone=$(q -c "SELECT relfilenode FROM pg_class WHERE relname = 'grid3_idx'")
t0=$(ms)
# DROP DATABASE waits until every process closed its files (a ProcSignal
# barrier the worker serves in its loop)
timeout 20 psql -X -q -c "DROP DATABASE other" || fail "DROP DATABASE failed or hung"
echo "  DROP DATABASE with a resident copy took $(($(ms) - t0)) ms"
q -c "DROP INDEX grid3_idx"
wait_for "NOT EXISTS (SELECT FROM jsonb_array_elements(gpu_graph_worker_stats() #> '{residency,indexes}') e
                      WHERE (e->>'database')::oid = $other OR (e->>'relfilenode')::oid = $gone)" 15 ||
  fail "copies of a dropped index or database are still resident"
echo "  their copies are dropped"

grep -E "terminated by signal|was terminated|all server processes terminated|PANIC" "$GG_CLUSTER_DIR/postgres.log" &&
  fail "a process crashed (above)"

echo "10. no usable GPU"
if [ -e /dev/nvidiactl ] || [ -e /dev/nvidia0 ] || [ "$device" = gpu ]; then
  echo "  skipped: this machine has a GPU"
else
  gg_cluster_stop
  gg_cluster_start "shared_preload_libraries = 'gpu_graph'" "gpu_graph.build_device = cpu"
  q -c "CREATE EXTENSION gpu_graph"
  [ "$(stat worker,state)" = "not started" ] || fail "worker = auto started a worker without a GPU: $(stat worker)"
  gg_cluster_stop
  gg_cluster_start "shared_preload_libraries = 'gpu_graph'" "gpu_graph.build_device = cpu" "gpu_graph.worker = on"
  q -c "SET client_min_messages = warning" -c "CREATE EXTENSION gpu_graph" -c "CREATE TABLE t AS SELECT i, ARRAY[i, i % 7]::real[] AS v FROM generate_series(1, 500) i" \
    -c "CREATE INDEX ON t USING gpu_graph (v)"
  n=$(q -c "SET enable_seqscan = off" -c "SELECT count(*) FROM (SELECT i FROM t ORDER BY v <-> '{100,3}' LIMIT 10) s" | tail -n 1)
  [ "$n" = 10 ] || fail "scans fail without the worker"
  [ "$(stat worker,state)" = absent ] || fail "worker state $(stat worker,state)"
  [ "$(stat fallbacks,absent)" -ge 1 ] || fail "no absent fallback counted"
  for ((i = 0; i < 30; i++)); do grep -q "gpu_graph search worker: cannot start" "$GG_CLUSTER_DIR/postgres.log" && break; sleep 0.1; done
  grep "gpu_graph search worker: cannot start" "$GG_CLUSTER_DIR/postgres.log" | head -n 1 | sed 's/^.*LOG: */  /' ||
    fail "the worker did not say why it cannot start"
fi
echo "worker: passed"
