#!/usr/bin/env bash
# The benchmark command: install/refresh the extension (scripts/setup.sh),
# build gpu-graph-bench, start a throwaway PostgreSQL 15 cluster and run the
# benchmark in it with the arguments given, e.g.
#
#   bash scripts/bench.sh --dataset sift128 --rows 100000 --csv sift128.csv
#   bash scripts/bench.sh --dataset minilm384 --ef 10,20,40,80,160 --index-options "degree=32"
#
# (`bash scripts/bench.sh --help` lists the options.) It loads the table
# through SQL, builds the index, sweeps gpu_graph.ef_search and prints build
# time, index size, recall@10, queries/s and latency per setting. To measure a
# server of your own, run the binary ($CARGO_TARGET_DIR/release/gpu-graph-bench)
# with --host/--port/--dbname/--user or the PG* variables.
#
# --dataset reads the data folder of scripts/lib.sh: GPU_GRAPH_DATA when set,
# else ../shared/data beside the clone when it exists, else the clone's own
# data/ (a sample: 25,000 SIFT rows, 900 MiniLM rows; data/README.md). A
# --rows larger than the file loads every row there is, and says so.
set -euo pipefail
# shellcheck source=scripts/cluster.sh
source "$(dirname "${BASH_SOURCE[0]}")/cluster.sh"

case " $* " in
  *" --help "*|*" -h "*) gg_build_bench; exec "$GG_BENCH" --help ;;
esac
bash "$GG_ROOT/scripts/setup.sh"
gg_build_bench
gg_cluster_start
"$GG_BENCH" --data "$GPU_GRAPH_DATA" "$@"
