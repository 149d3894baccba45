#!/usr/bin/env bash
# Damaged pages (issue 14, finding 13): a meta page or a list overwritten on
# disk while the server is down surfaces as ERRCODE_INDEX_CORRUPTED (XX002)
# naming the index and the block, never as a Rust panic ("index out of
# bounds", "attempt to divide by zero"), and gpu_graph_verify() lists it.
#
#   bash tests/cluster/corruption.sh      (after scripts/setup.sh)
set -euo pipefail
# shellcheck source=scripts/cluster.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/cluster.sh"

fail() { gg_test_fail corruption "$@"; }
gg_cluster_start
dir=$GG_CLUSTER_DIR
q() { psql -X -q -v ON_ERROR_STOP=1 -At "$@"; }

q <<'SQL'
SET client_min_messages = warning;
CREATE EXTENSION gpu_graph;
CREATE TABLE a (id int, v real[]);
INSERT INTO a SELECT i, ARRAY[sin(i), cos(i), sin(i * 0.3)]::real[] FROM generate_series(1, 3000) i;
CREATE INDEX a_idx ON a USING gpu_graph (v);
CREATE TABLE b (id int, v real[]);
INSERT INTO b SELECT i, ARRAY[sin(i), cos(i), sin(i * 0.3)]::real[] FROM generate_series(1, 3000) i;
CREATE INDEX b_idx ON b USING gpu_graph (v);
CHECKPOINT;
SQL
[ "$(q -c "SELECT count(*) FROM gpu_graph_verify('a_idx')")" = 0 ] || fail "a_idx does not verify before the damage"
a_file=$dir/data/$(q -c "SELECT pg_relation_filepath('a_idx')")
b_file=$dir/data/$(q -c "SELECT pg_relation_filepath('b_idx')")
bindir=$(gg_pg_bindir)
gg_as_pg "$bindir/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null

# a_idx: the meta page's degree (the fifth u32 after the 24-byte page header) set to 0
printf '\x00\x00\x00\x00' | dd of="$a_file" bs=1 seek=$((24 + 16)) conv=notrunc status=none
# b_idx: node 0's first neighbour (block 1, right after its header) set to 4000000000
printf '\x00\x28\x6b\xee' | dd of="$b_file" bs=1 seek=$((8192 + 24)) conv=notrunc status=none
gg_as_pg "${GG_SERVER_ENV[@]}" "$bindir/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -w start >/dev/null

check() { # check NAME SQL: the statement fails with XX002 and the index's name
  local out
  out=$(psql -X -q -At -v ON_ERROR_STOP=1 -v VERBOSITY=verbose -c "SET enable_seqscan = off" -c "$2" 2>&1) &&
    fail "$1: no error from: $2"
  echo "$1: $out" | head -3
  grep -q "XX002" <<<"$out" || fail "$1: not ERRCODE_INDEX_CORRUPTED"
  grep -q "is corrupted at block" <<<"$out" || fail "$1: the message names no block"
  ! grep -qi "panic\|out of bounds\|divide by zero" <<<"$out" || fail "$1: a Rust panic reached the client"
}
check "meta: scan" "SELECT id FROM a ORDER BY v <-> '{0,1,0}' LIMIT 5"
check "meta: insert" "INSERT INTO a VALUES (0, '{1,1,1}')"
check "meta: info" "SELECT gpu_graph_info('a_idx')"
check "list: scan" "SELECT count(*) FROM (SELECT id FROM b ORDER BY v <-> (SELECT v FROM b WHERE id = 1) LIMIT 3000) s"
got=$(q -c "SELECT block, node, problem FROM gpu_graph_verify('b_idx') LIMIT 1")
echo "verify: $got"
[ "$got" = "1|0|its list names node 4000000000, beyond the index's 3000" ] || fail "gpu_graph_verify did not list the damaged list"
echo "corruption: passed"
