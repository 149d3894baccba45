#!/usr/bin/env bash
# gpu_graph on pgvector columns of real data (needs pgvector installed; exit
# 77, counted as skipped, without it): sift128 (its first 100,000 rows, or
# the whole sample in the repository's data/) under vector_l2_ops, and
# minilm384 under vector_cosine_ops and halfvec_cosine_ops, CPU builds,
# recall@10 of 100 queries at the default ef_search against pgvector's own
# exact answer (a sequential scan with its operator). Floors: 0.95.
#
#   bash tests/cluster/pgvector_recall.sh      (after scripts/setup.sh)
set -euo pipefail
# shellcheck source=scripts/cluster.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/cluster.sh"
fail() { gg_test_fail pgvector_recall "$@"; }
q() { psql -X -q -v ON_ERROR_STOP=1 -At "$@"; }
if [ ! -f "$("$PG_CONFIG" --sharedir)/extension/vector.control" ]; then
  echo "pgvector_recall: skipped: pgvector not installed"
  exit 77
fi
bench=$CARGO_TARGET_DIR/release/gpu-graph-bench
[ -x "$bench" ] || (cd "$GG_ROOT" && cargo build --release -q -p gpu-graph-bench)
work=$(mktemp -d "${TMPDIR:-/tmp}/gpu_graph-pgvr.XXXXXX")
gg_on_exit "rm -rf '$work'"
chmod 755 "$work"
gg_cluster_start "gpu_graph.build_device = cpu" "maintenance_work_mem = 1GB"
q -c "SET client_min_messages = warning" -c "CREATE EXTENSION gpu_graph" -c "CREATE EXTENSION vector" \
  -c "CREATE EXTENSION gpu_graph_pgvector"

# the first 100 queries of a set, as pgvector literals
queries() {
  python3 - "$GPU_GRAPH_DATA/$1_query.fvecs" >"$work/q.copy" <<'PY'
import struct, sys
raw = open(sys.argv[1], 'rb').read()
d = struct.unpack_from('<i', raw)[0]
for i in range(min(100, len(raw) // (4 * (d + 1)))):
    v = struct.unpack_from(f'<{d}f', raw, i * 4 * (d + 1) + 4)
    print(f"{i}\t[{','.join(repr(x) for x in v)}]")
PY
}
# ids of each query's 10 nearest by `op` over column `col` (type `ty`)
probe() {
  local col=$1 op=$2 ty=$3 n
  n=$(q -c "SELECT count(*) FROM q")
  for ((i = 0; i < n; i++)); do
    echo "SELECT string_agg(id::text, ' ') FROM (SELECT id FROM items ORDER BY $col $op (SELECT v FROM q WHERE id = $i)::$ty LIMIT 10) s;"
  done >"$work/probe.sql"
  q -f "$work/probe.sql"
}
recall() {
  python3 - "$1" "$2" <<'PY'
import sys
got = [set(l.split()) for l in open(sys.argv[1])]
exact = [set(l.split()) for l in open(sys.argv[2])]
print(f"{sum(len(a & b) for a, b in zip(got, exact)) / sum(len(b) for b in exact):.4f}")
PY
}
# checks one index: recall against the exact answer, at least 0.95
check() {
  local name=$1 col=$2 op=$3 ty=$4 r
  probe "$col" "$op" "$ty" >"$work/got"
  r=$(recall "$work/got" "$work/exact")
  echo "  $name: recall@10 $r ($(q -c "SELECT count(*) FROM items") rows, $(q -c "SELECT count(*) FROM q") queries, ef_search 40)"
  awk -v r="$r" 'BEGIN {exit !(r >= 0.95)}' || fail "$name: recall@10 $r below 0.95"
}

echo "sift128, vector_l2_ops"
"$bench" --dataset sift128 --rows 100000 --ef 40 --queries 10 >/dev/null
queries sift128
q -c "DROP INDEX IF EXISTS items_embedding_idx" -c "ALTER TABLE items ADD COLUMN v vector(128)" \
  -c "UPDATE items SET v = embedding::vector" -c "VACUUM items" \
  -c "CREATE TABLE q (id int, v vector(128))" -c "\\copy q FROM $work/q.copy"
probe v '<->' vector >"$work/exact"
q -c "CREATE INDEX ON items USING gpu_graph (v vector_l2_ops)"
check vector_l2_ops v '<->' vector

echo "minilm384, vector_cosine_ops and halfvec_cosine_ops"
q -c "DROP TABLE items, q"
"$bench" --dataset minilm384 --ef 40 --queries 10 >/dev/null
queries minilm384
q -c "DROP INDEX IF EXISTS items_embedding_idx" -c "ALTER TABLE items ADD COLUMN v vector(384), ADD COLUMN h halfvec(384)" \
  -c "UPDATE items SET v = embedding::vector, h = embedding::halfvec" -c "VACUUM items" \
  -c "CREATE TABLE q (id int, v vector(384))" -c "\\copy q FROM $work/q.copy"
probe v '<=>' vector >"$work/exact"
q -c "CREATE INDEX items_v ON items USING gpu_graph (v vector_cosine_ops)"
check vector_cosine_ops v '<=>' vector
# halfvec's own exact answer: its values are the vector's rounded to f16
q -c "DROP INDEX items_v"
probe h '<=>' halfvec >"$work/exact"
q -c "CREATE INDEX items_h ON items USING gpu_graph (h halfvec_cosine_ops)"
check halfvec_cosine_ops h '<=>' halfvec
echo "pgvector_recall: passed"
