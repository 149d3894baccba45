#!/usr/bin/env bash
# The demo (README command 1): install what is missing, then in a throwaway
# PostgreSQL 15 cluster load up to 100,000 SIFT descriptors (the first rows of
# sift128_base.bvecs in the data folder) into items(id int, embedding real[])
# by COPY, build a gpu_graph index, run the held-out queries
#   SELECT id FROM items ORDER BY embedding <-> $1 LIMIT 10
# at the default gpu_graph.ef_search, and print recall@10 against the exact
# ground truth, latency and a few answers. The cluster is removed at the end.
#
#   bash scripts/demo.sh
#
# The data folder (scripts/lib.sh): GPU_GRAPH_DATA when set, else
# ../shared/data beside the clone when it exists (the full set: 100,000 rows,
# 1,000 queries), else the clone's own data/ (a sample: all of its 25,000
# rows, 200 queries). DEMO_ROWS sets the row count (an upper bound); the
# ground truth comes from the folder's files when they cover the rows loaded,
# else by brute force.
set -euo pipefail
# shellcheck source=scripts/cluster.sh
source "$(dirname "${BASH_SOURCE[0]}")/cluster.sh"
cd "$GG_ROOT"

rows=${DEMO_ROWS:-100000}
for f in sift128_base.bvecs sift128_query.fvecs; do
  [ -f "$GPU_GRAPH_DATA/$f" ] || gg_die "no $GPU_GRAPH_DATA/$f (set GPU_GRAPH_DATA to a data folder, such as $GG_ROOT/data)"
done
echo "data: $GPU_GRAPH_DATA"

bash scripts/setup.sh
gg_build_bench
gg_cluster_start
echo "PostgreSQL 15 throwaway cluster: PGHOST=$PGHOST PGPORT=$PGPORT"
echo

csv=$GG_CLUSTER_DIR/demo.csv
"$GG_BENCH" --dataset sift128 --data "$GPU_GRAPH_DATA" --rows "$rows" --ef default --examples 2 --csv "$csv"

echo
echo "The same index from psql (the row with id 42 as the query):"
psql -X -v ON_ERROR_STOP=1 <<'SQL'
EXPLAIN (COSTS OFF)
SELECT id FROM items ORDER BY embedding <-> (SELECT embedding FROM items WHERE id = 42) LIMIT 5;
SELECT id, round((embedding <-> (SELECT embedding FROM items WHERE id = 42))::numeric, 2) AS distance
FROM items ORDER BY embedding <-> (SELECT embedding FROM items WHERE id = 42) LIMIT 5;
SQL

# the CSV's one row: dataset,rows,dims,metric,clients,k,build_s,index_bytes,
# ef_search,recall,qps,mean_ms,p50_ms,p99_ms,index_options,column,index
awk -F, 'NR == 2 {
  printf "\nsift128, %d rows: CREATE INDEX %.1f s, index %.1f MiB; at ef_search = %s (the default): recall@10 %.4f, latency mean %.2f / p50 %.2f / p99 %.2f ms (%.0f queries/s, one client)\n",
    $2, $7, $8 / 1048576, $9, $10, $12, $13, $14, $11
}' "$csv"
