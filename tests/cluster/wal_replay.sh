#!/usr/bin/env bash
# The index is WAL-logged: a streaming replica and a primary restarted after a
# crash (an immediate stop: no shutdown checkpoint, so recovery replays the
# WAL) answer exactly as the primary did, after CREATE INDEX, INSERTs into the
# graph, DELETE + VACUUM (list repair, freed nodes) and inserts that reuse the
# freed nodes; and a second index built beyond maintenance_work_mem (paged:
# its graph pages written by the merge, then relinked through the buffers);
# where pgvector is installed, a halfvec index too. Every page replayed is
# compared with the primary's (wal_consistency_checking).
#
#   bash tests/cluster/wal_replay.sh      (after scripts/setup.sh)
set -euo pipefail
# shellcheck source=scripts/cluster.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/cluster.sh"
# shellcheck source=tests/cluster/lib/crash.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/crash.sh"

fail() { gg_test_fail wal_replay "$@"; }
bindir=$(gg_pg_bindir)

# wal_consistency_checking: each record carries its pages' images as well,
# and the replica and the recovery compare every page they replay with
# them (a FATAL on the first byte that differs): the deltas the index
# logs (storage::delta) are checked byte for byte, not just by answers
gg_cluster_start "wal_level = replica" "max_wal_senders = 4" "hot_standby = on" "fsync = on" \
  "wal_consistency_checking = 'generic'"
primary_dir=$GG_CLUSTER_DIR
primary=(-h "$PGHOST" -p "$PGPORT")
q() { psql -X -q -v ON_ERROR_STOP=1 -At "$@"; }

# the standby starts from an empty base backup: everything about the index
# reaches it through the WAL
standby_dir=$(mktemp -d "${TMPDIR:-/tmp}/gpu_graph-standby.XXXXXX")
chmod 700 "$standby_dir"
[ "$(id -un)" = "$GG_PG_USER" ] || chown "$GG_PG_USER:" "$standby_dir"
gg_on_exit "gg_as_pg '$bindir/pg_ctl' -D '$standby_dir/data' -m immediate -w stop >/dev/null 2>&1; rm -rf '$standby_dir'"
gg_as_pg "$bindir/pg_basebackup" -h "$PGHOST" -p "$PGPORT" -U postgres -D "$standby_dir/data" -R -X stream >/dev/null
standby_port=$((PGPORT + 1))
{
  echo "port = $standby_port"
  echo "unix_socket_directories = '$standby_dir'"
} >>"$standby_dir/data/postgresql.conf"
gg_as_pg "${GG_SERVER_ENV[@]}" "$bindir/pg_ctl" -D "$standby_dir/data" -l "$standby_dir/postgres.log" -w start >/dev/null ||
  { tail -20 "$standby_dir/postgres.log"; fail "standby did not start"; }
standby=(-h "$standby_dir" -p "$standby_port")

q "${primary[@]}" <<'SQL'
SET client_min_messages = warning;
CREATE EXTENSION gpu_graph;
CREATE TABLE items (id int, v real[]);
INSERT INTO items SELECT i, ARRAY[sin(i)::real, cos(i * 1.3)::real, sin(i * 0.7)::real, (i % 17)::real / 17]
  FROM generate_series(1, 20000) i;
CREATE INDEX items_idx ON items USING gpu_graph (v) WITH (degree = 16);
INSERT INTO items SELECT i, ARRAY[cos(i)::real, sin(i * 1.1)::real, cos(i * 0.3)::real, (i % 13)::real / 13]
  FROM generate_series(20001, 22000) i;
DELETE FROM items WHERE id % 5 = 0;
VACUUM items;
INSERT INTO items SELECT i, ARRAY[sin(i * 2)::real, cos(i)::real, sin(i * 0.2)::real, (i % 11)::real / 11]
  FROM generate_series(22001, 22500) i;
CREATE TABLE queries AS SELECT q, ARRAY[sin(q * 3)::real, cos(q * 5)::real, sin(q)::real, 0.5::real] AS v
  FROM generate_series(1, 50) q;
CREATE TABLE paged (id int, v real[]);
INSERT INTO paged SELECT id, v FROM items;
SET maintenance_work_mem = '2MB';
SET gpu_graph.build_device = cpu;
CREATE INDEX paged_idx ON paged USING gpu_graph (v) WITH (degree = 16);
SQL
[ "$(q "${primary[@]}" -c "SELECT (gpu_graph_info('paged_idx')->'build'->'shards'->>'count')::int > 1")" = t ] ||
  fail "the second index was not built paged, in shards"

# where pgvector is installed: a halfvec index goes through the same WAL
halfvec=0
if [ -f "$("$PG_CONFIG" --sharedir)/extension/vector.control" ]; then
  halfvec=1
  q "${primary[@]}" <<'SQL'
SET client_min_messages = warning;
CREATE EXTENSION vector;
CREATE EXTENSION gpu_graph_pgvector;
SET gpu_graph.build_device = cpu;
CREATE TABLE hv AS SELECT id, v::halfvec(4) AS v FROM items WHERE id <= 15000;
CREATE INDEX hv_idx ON hv USING gpu_graph (v halfvec_l2_ops) WITH (degree = 16);
INSERT INTO hv SELECT id, v::halfvec FROM items WHERE id > 15000;
DELETE FROM hv WHERE id % 7 = 0;
VACUUM hv;
SQL
fi
# what 50 scans of the halfvec index return, and its node counts
hv_fingerprint() {
  [ $halfvec = 1 ] || return 0
  q "$@" -c "SET enable_seqscan = off" -c "SELECT md5(string_agg(ids, ';' ORDER BY q)) FROM (
    SELECT q, (SELECT string_agg(id::text, ',') FROM (SELECT id FROM hv ORDER BY v <-> queries.v::halfvec LIMIT 20) s) AS ids
    FROM queries) t" -c "SELECT gpu_graph_info('hv_idx')->'nodes'"
}
hv_before=$(hv_fingerprint "${primary[@]}")

# the paged index's fingerprint
paged_fingerprint() { FP_TABLE=paged FP_INDEX=paged_idx index_fingerprint "$@"; }
paged_before=$(paged_fingerprint "${primary[@]}")

# what 50 index scans return, and the index's own counts, as one fingerprint

before=$(index_fingerprint "${primary[@]}")
echo "primary:  $before" | tr '\n' ' '; echo
# 22000 nodes before the DELETE; the 500 later rows took freed ones
[ "$(q "${primary[@]}" -c "SELECT (gpu_graph_info('items_idx')->'nodes'->>'allocated')::int")" = 22000 ] ||
  fail "freed nodes were not reused"

# the standby catches up, then answers alike
lsn=$(q "${primary[@]}" -c "SELECT pg_current_wal_lsn()")
for _ in $(seq 1 300); do
  caught=$(q "${standby[@]}" -c "SELECT pg_last_wal_replay_lsn() >= '$lsn'::pg_lsn")
  [ "$caught" = t ] && break
  sleep 0.1
done
[ "$caught" = t ] || fail "the standby did not catch up"
on_standby=$(index_fingerprint "${standby[@]}")
echo "standby:  $on_standby" | tr '\n' ' '; echo
[ "$on_standby" = "$before" ] || fail "the standby answers differently"
[ "$(paged_fingerprint "${standby[@]}")" = "$paged_before" ] || fail "the standby's paged index answers differently"
[ "$(hv_fingerprint "${standby[@]}")" = "$hv_before" ] || fail "the standby's halfvec index answers differently"

# a crash: no shutdown checkpoint, recovery replays the WAL
crash_restart "$primary_dir" || fail "the primary did not restart"
grep -q "redo starts" "$primary_dir/postgres.log" || fail "the restart replayed no WAL"
after=$(index_fingerprint "${primary[@]}")
echo "recovered: $after" | tr '\n' ' '; echo
[ "$after" = "$before" ] || fail "the recovered primary answers differently"
[ "$(paged_fingerprint "${primary[@]}")" = "$paged_before" ] || fail "the recovered paged index answers differently"
[ "$(hv_fingerprint "${primary[@]}")" = "$hv_before" ] || fail "the recovered halfvec index answers differently"
if [ $halfvec = 1 ]; then
  echo "halfvec index: $hv_before" | tr '\n' ' '; echo "(primary = standby = recovered)"
else
  echo "halfvec index: skipped: pgvector not installed"
fi

# and the recovered index still takes inserts and finds them
q "${primary[@]}" -c "INSERT INTO items VALUES (99999, '{9,9,9,9}')"
[ "$(q "${primary[@]}" -c "SET enable_seqscan = off" -c "SELECT id FROM items ORDER BY v <-> '{9,9,9,9}' LIMIT 1")" = 99999 ] ||
  fail "a row inserted after recovery is not found"
echo "wal_replay: passed"
