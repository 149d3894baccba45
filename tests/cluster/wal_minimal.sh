#!/usr/bin/env bash
# Under wal_level = minimal, CREATE INDEX writes no WAL for its pages (the
# index's file is new in the transaction: the commit syncs it instead), and
# the index survives a crash right after the build: a primary stopped
# immediately and restarted answers exactly as before.
#
#   bash tests/cluster/wal_minimal.sh      (after scripts/setup.sh)
set -euo pipefail
# shellcheck source=scripts/cluster.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/cluster.sh"
# shellcheck source=tests/cluster/lib/crash.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/crash.sh"

fail() { gg_test_fail wal_minimal "$@"; }
# wal_skip_threshold 0: the commit fsyncs the new file rather than logging it
gg_cluster_start "wal_level = minimal" "max_wal_senders = 0" "wal_skip_threshold = 0" "fsync = on"
dir=$GG_CLUSTER_DIR
q() { psql -X -q -v ON_ERROR_STOP=1 -At "$@"; }

q <<'SQL'
SET client_min_messages = warning;
CREATE EXTENSION gpu_graph;
CREATE TABLE items (id int, v real[]);
INSERT INTO items SELECT i, ARRAY(SELECT sin(i * j)::real FROM generate_series(1, 32) j)
  FROM generate_series(1, 20000) i;
CREATE TABLE queries AS SELECT q, ARRAY(SELECT cos(q * j)::real FROM generate_series(1, 32) j) AS v
  FROM generate_series(1, 50) q;
CHECKPOINT;
SQL

lsn=$(q -c "SELECT pg_current_wal_lsn()")
notice=$(q -c "SET client_min_messages = debug1" -c "SET gpu_graph.build_device = cpu" \
  -c "CREATE INDEX items_idx ON items USING gpu_graph (v) WITH (degree = 16)" 2>&1)
echo "$notice"
grep -q "no WAL needed" <<<"$notice" || fail "the build says it logged its pages"
wal=$(q -c "SELECT pg_current_wal_lsn() - '$lsn'::pg_lsn")
size=$(q -c "SELECT pg_relation_size('items_idx')")
echo "index $size bytes, WAL during the build $wal bytes"
[ "$wal" -lt $((size / 20)) ] || fail "the build wrote $wal bytes of WAL for a $size-byte index"

before=$(index_fingerprint)
echo "before:    $before" | tr '\n' ' '; echo
[ "$(q -c "SELECT (gpu_graph_info('items_idx')->'nodes'->>'live')::int")" = 20000 ] || fail "the index does not hold 20000 rows"

crash_restart "$dir" || fail "the server did not restart"
after=$(index_fingerprint)
echo "recovered: $after" | tr '\n' ' '; echo
[ "$after" = "$before" ] || fail "the recovered index answers differently"
echo "wal_minimal: passed"
