#!/usr/bin/env bash
# Compiles every CUDA kernel in kernels/ with NVRTC, as the extension does at
# run time, and fails on any error OR warning. No GPU needed.
#
#   bash scripts/check-kernels.sh [--arch compute_90] [--arch sm_90] ...
#
# NVRTC 13.0 comes from PyPI through scripts/nvrtc.sh (the nvidia-cuda-nvrtc
# wheel, with the runtime and crt headers beside it, in a virtual environment
# cached under $HOME/.cache/gpu_graph/nvrtc-venv). The compile runs through
# gpu-graph-nvrtc-check (crates/gpu), which calls the very compile function of
# the extension (crates/gpu/src/nvrtc.rs) on the files of the working tree,
# with kernels/abi.h and kernels/common.cuh handed over as the extension
# hands them; it also compiles the ABI check (static_asserts generated from
# crates/gpu/src/abi.rs over abi.h), which fails when the two disagree.
# Default targets: compute_90 (PTX for Hopper, the GPUs the extension is
# measured on: the form the extension compiles to when its NVRTC cannot give
# the device's own machine code, for the driver to compile at load) and
# sm_90 (a CUBIN, what the extension loads on a Hopper; it also runs ptxas,
# which warns about things PTX generation does not). One line per kernel;
# exit status 1 if any kernel failed or warned.
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$GG_ROOT"

SP=$(bash "$GG_ROOT/scripts/nvrtc.sh") || gg_die "no NVRTC (scripts/nvrtc.sh failed)"

cargo build --release --quiet -p gpu_graph_gpu --example gpu-graph-nvrtc-check
CHECK=$CARGO_TARGET_DIR/release/examples/gpu-graph-nvrtc-check

args=("$@")
[ ${#args[@]} -gt 0 ] || args=(--arch compute_90 --arch sm_90)
shopt -s nullglob
kernels=(kernels/*.cu)
[ ${#kernels[@]} -gt 0 ] || gg_die "no kernels/*.cu"
LD_LIBRARY_PATH="$SP/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  "$CHECK" "${args[@]}" -I "$SP/include" "${kernels[@]}"
# the search kernel once more as the extension compiles it by default: CTAs
# of two warps (ServerConfig::cta_warps, -DGG_WARPS)
echo "search_persistent.cu with -DGG_WARPS=2:"
LD_LIBRARY_PATH="$SP/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  "$CHECK" "${args[@]}" -I "$SP/include" --option=-DGG_WARPS=2 kernels/search_persistent.cu
