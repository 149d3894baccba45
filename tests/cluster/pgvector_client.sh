#!/usr/bin/env bash
# The psycopg 3 + pgvector-python client test (pgvector_client.py) against a
# throwaway cluster: needs pgvector installed (exit 77, counted as skipped,
# without it). The client packages come from PyPI, pinned, into a virtual
# environment made once ($HOME/.cache/gpu_graph/client-venv).
#
#   bash tests/cluster/pgvector_client.sh      (after scripts/setup.sh)
set -euo pipefail
# shellcheck source=scripts/cluster.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/cluster.sh"
if [ ! -f "$("$PG_CONFIG" --sharedir)/extension/vector.control" ]; then
  echo "pgvector_client: skipped: pgvector not installed"
  exit 77
fi
PKGS=("psycopg[binary]==3.3.9" pgvector==0.5.1 numpy==2.4.6)
venv=$HOME/.cache/gpu_graph/client-venv
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv" || gg_die "python3 -m venv failed (install python3-venv)"
fi
if [ "$(cat "$venv/.gpu_graph-pkgs" 2>/dev/null)" != "${PKGS[*]}" ]; then
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${PKGS[@]}"
  echo "${PKGS[*]}" >"$venv/.gpu_graph-pkgs"
fi
gg_cluster_start "gpu_graph.build_device = cpu"
"$venv/bin/python" "$(dirname "${BASH_SOURCE[0]}")/pgvector_client.py" "$GPU_GRAPH_DATA"
echo "pgvector_client: passed"
