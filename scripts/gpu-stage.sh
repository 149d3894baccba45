#!/usr/bin/env bash
# Run HERE (not on the GPU machine): builds the extension package and the
# GPU-side binaries in release mode and fills .device/ (git-ignored) through
# ../shared/tools/device-stage, for a `device` call with carry [".device"]:
#
#   bash scripts/gpu-stage.sh
#   # then, on the GPU machine:
#   source .device/device-pg "shared_preload_libraries = 'gpu_graph'"; bash tests/gpu/build.sh
#
# (tests/gpu/ holds the GPU test scripts: build.sh, then worker.sh and
# worker-sweep.sh on the same server.)
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$GG_ROOT"
tools=${GPU_GRAPH_TOOLS:-$GG_ROOT/../shared/tools}
pkg=$CARGO_TARGET_DIR/gpu-graph-package
rm -rf "$pkg"
cargo pgrx package --pg-config "$PG_CONFIG" --out-dir "$pkg" >/dev/null
cargo build -q --release -p gpu-graph-bench && cargo build -q --release -p gpu_graph_gpu --examples
bins=()
for b in gpu-graph-bench examples/gpu-graph-gpucheck examples/gpu-graph-searchcheck; do
  [ -x "$CARGO_TARGET_DIR/release/$b" ] && bins+=("$CARGO_TARGET_DIR/release/$b")
done
# a 10k-row prefix of minilm384 (the whole set would not fit the 64 MiB
# that travels): the builders' parity check on 384-dim embeddings
minilm=$CARGO_TARGET_DIR/minilm384_base_10k.fvecs
[ -f "$minilm" ] || head -c $((10000 * (4 + 384 * 4))) "$GPU_GRAPH_DATA/minilm384_base.fvecs" >"$minilm"
# the operator classes for pgvector's types, and pgvector itself where it is
# installed here (built from its source by whoever has it: it is never part
# of this repository), laid out as packages that device-pg installs
pkgs=("$pkg")
sharedir=$("$PG_CONFIG" --sharedir)
pgv=$CARGO_TARGET_DIR/gpu-graph-pgvector-package
rm -rf "$pgv" && mkdir -p "$pgv/extension" && cp sql/pgvector/gpu_graph_pgvector* "$pgv/extension/"
pkgs+=("$pgv")
if [ -f "$sharedir/extension/vector.control" ]; then
  vec=$CARGO_TARGET_DIR/pgvector-package
  rm -rf "$vec" && mkdir -p "$vec/lib" "$vec/extension"
  cp "$("$PG_CONFIG" --pkglibdir)/vector.so" "$vec/lib/"
  cp "$sharedir"/extension/vector.control "$sharedir"/extension/vector--*.sql "$vec/extension/"
  pkgs+=("$vec")
fi
rm -rf .device/ext
"$tools/device-stage" "${pkgs[@]}" -- "$GPU_GRAPH_DATA/make_sift128.py" "${bins[@]}" \
  "$minilm" "$GPU_GRAPH_DATA/minilm384_query.fvecs"
