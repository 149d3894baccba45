#!/usr/bin/env bash
# NVRTC 13.0 from PyPI, pinned: installs the nvidia-cuda-nvrtc wheel (with
# the CUDA runtime and crt wheels, whose headers a compile with -I may use)
# into a Python virtual environment, once, and prints the folder that holds
# them:
#
#   dir=$(bash scripts/nvrtc.sh [VENV])
#   #   $dir/lib/libnvrtc.so.13 (and libnvrtc-builtins.so.13.0 beside it)
#   #   $dir/include
#
# VENV defaults to $HOME/.cache/gpu_graph/nvrtc-venv; a second run with the
# same pins installs nothing. Only the folder goes to stdout; progress goes
# to stderr. Needs python3 with its venv module (Debian: python3-venv).
# Callers: scripts/check-kernels.sh (the kernel compile check that
# scripts/test.sh runs) and docker/Dockerfile (the image with NVRTC, whose
# extension compiles its kernels with this libnvrtc at run time).
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

PKGS=(nvidia-cuda-nvrtc==13.0.88 nvidia-cuda-runtime==13.0.96 nvidia-cuda-crt==13.0.88)
VENV=${1:-$HOME/.cache/gpu_graph/nvrtc-venv}
STAMP=$VENV/.gpu_graph-pkgs

if [ ! -x "$VENV/bin/python" ]; then
  gg_say "creating $VENV"
  python3 -m venv "$VENV" >&2 || gg_die "python3 -m venv failed (install python3-venv)"
fi
if [ "$(cat "$STAMP" 2>/dev/null)" != "${PKGS[*]}" ]; then
  gg_say "installing ${PKGS[*]}"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${PKGS[@]}" >&2
  echo "${PKGS[*]}" >"$STAMP"
fi
dir=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/nvidia/cu13
[ -f "$dir/lib/libnvrtc.so.13" ] || gg_die "no libnvrtc.so.13 under $dir/lib"
echo "$dir"
