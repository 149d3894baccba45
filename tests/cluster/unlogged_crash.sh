#!/usr/bin/env bash
# An unlogged table's index after a crash (issue 14, finding 3): PostgreSQL
# resets an unlogged relation to its init fork at recovery, so the init
# fork must be WAL-logged and synced when it is made (as btree's is). An
# immediate stop right after CREATE INDEX, no checkpoint between: the index
# must come back empty and usable, take inserts and answer them.
#
#   bash tests/cluster/unlogged_crash.sh      (after scripts/setup.sh)
set -euo pipefail
# shellcheck source=scripts/cluster.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/cluster.sh"
# shellcheck source=tests/cluster/lib/crash.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/crash.sh"

fail() { gg_test_fail unlogged_crash "$@"; }
# no checkpoint may run between the build and the crash
gg_cluster_start "checkpoint_timeout = 1h" "max_wal_size = 10GB" "fsync = on"
dir=$GG_CLUSTER_DIR
q() { psql -X -q -v ON_ERROR_STOP=1 -At "$@"; }

q <<'SQL'
SET client_min_messages = warning;
CREATE EXTENSION gpu_graph;
CHECKPOINT;
CREATE UNLOGGED TABLE items (id int, v real[]);
INSERT INTO items SELECT i, ARRAY[i, i % 7]::real[] FROM generate_series(1, 500) i;
CREATE INDEX items_idx ON items USING gpu_graph (v);
CREATE UNLOGGED TABLE empty_items (id int, v real[]);
CREATE INDEX empty_idx ON empty_items USING gpu_graph (v);
SQL
crash_restart "$dir" || fail "the server did not restart"

out=$(q 2>&1 <<'SQL'
SET enable_seqscan = off;
SELECT count(*) FROM items;
SELECT gpu_graph_info('items_idx')->'nodes';
INSERT INTO items SELECT i, ARRAY[i, i % 7]::real[] FROM generate_series(1, 300) i;
INSERT INTO empty_items SELECT i, ARRAY[i, 1]::real[] FROM generate_series(1, 50) i;
SELECT count(*) FROM (SELECT id FROM items ORDER BY v <-> '{150,3}' LIMIT 1000) s;
SELECT id FROM items ORDER BY v <-> '{150,3}' LIMIT 1;
SELECT id FROM empty_items ORDER BY v <-> '{20,1}' LIMIT 1;
SQL
) || fail "after recovery: $out"
echo "$out"
expected='0
{"free": 0, "live": 0, "deleted": 0, "allocated": 0}
300
150
20'
[ "$out" = "$expected" ] || fail "after recovery the index answered (above) instead of: $expected"
echo "unlogged_crash: passed"
