#!/usr/bin/env bash
# Install what is missing and build gpu_graph into this machine's PostgreSQL 15.
# Idempotent: a second run only rebuilds (incrementally) and reinstalls.
#
#   bash scripts/setup.sh
#
# 1. Debian packages: postgresql-15, its server headers, clang/libclang (for
#    pgrx's bindgen), a C toolchain, sudo (cargo pgrx test --runas uses it)
# 2. cargo-pgrx 0.18.0, unless `cargo pgrx --version` already says 0.18.0
# 3. `cargo pgrx init --pg15 <Debian's pg_config>`, unless ~/.pgrx/config.toml
#    already names pg15
# 4. `cargo pgrx install --release` into Debian's PostgreSQL 15 (as root, it
#    writes into /usr/lib/postgresql/15/lib and /usr/share/postgresql/15),
#    and the gpu_graph_pgvector extension's control and SQL files (sql/pgvector:
#    operator classes for pgvector's types, usable once pgvector is installed)
#
# Quiet on success apart from one line per thing it installs. On failure it
# prints the failing step's output. GG_VERBOSE=1 shows every step's output.
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

PGRX_VERSION=0.18.0
APT_PACKAGES=(postgresql-15 postgresql-server-dev-15 libclang-dev clang build-essential pkg-config sudo ca-certificates)

log=$(mktemp "${TMPDIR:-/tmp}/gpu_graph-setup.XXXXXX")
gg_on_exit "rm -f '$log'"

# step DESCRIPTION CMD...: run CMD with its output in $log; on failure show it.
step() {
  local what=$1
  shift
  if [ "${GG_VERBOSE:-0}" = 1 ]; then
    "$@" && return 0
    gg_die "failed: $what"
  fi
  if ! "$@" >"$log" 2>&1; then
    echo "---- output of: $* (last 150 lines)" >&2
    tail -n 150 "$log" >&2
    echo "----" >&2
    gg_die "failed: $what"
  fi
}

if [ "$(id -u)" = 0 ]; then SUDO=(); else
  command -v sudo >/dev/null || gg_die "not root and no sudo: run as root"
  SUDO=(sudo -n)
fi

# 1. Debian packages
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  command -v apt-get >/dev/null || gg_die "missing packages ${missing[*]} and no apt-get (this script expects Debian 12)"
  gg_say "installing ${missing[*]}"
  step "apt-get update" "${SUDO[@]}" apt-get update -q
  step "apt-get install ${missing[*]}" "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
[ -x "$PG_CONFIG" ] || gg_die "no $PG_CONFIG after installing postgresql-server-dev-15"

# 2. Rust is expected (the toolchain is pinned by the machine); cargo-pgrx is ours
command -v cargo >/dev/null || gg_die "no cargo on PATH: install Rust (rustup) first"
if [ "$(cargo pgrx --version 2>/dev/null || true)" != "cargo-pgrx $PGRX_VERSION" ]; then
  gg_say "installing cargo-pgrx $PGRX_VERSION (a few minutes)"
  step "cargo install cargo-pgrx $PGRX_VERSION" cargo install cargo-pgrx --version "$PGRX_VERSION" --locked --force
fi

# 3. pgrx's registry of PostgreSQL installations
pgrx_config=${PGRX_HOME:-$HOME/.pgrx}/config.toml
if ! grep -qE '^[[:space:]]*pg15[[:space:]]*=' "$pgrx_config" 2>/dev/null; then
  gg_say "cargo pgrx init --pg15 $PG_CONFIG"
  step "cargo pgrx init" cargo pgrx init --pg15 "$PG_CONFIG"
fi

# 4. build (release) and install the extension
cd "$GG_ROOT"
install_flags=(--release --pg-config "$PG_CONFIG")
[ "$(id -u)" = 0 ] || install_flags+=(--sudo)   # PostgreSQL's folders belong to root
step "cargo pgrx install --release (build and install gpu_graph)" cargo pgrx install "${install_flags[@]}"
ext=$("$PG_CONFIG" --sharedir)/extension
pgvector_files=(sql/pgvector/gpu_graph_pgvector.control sql/pgvector/gpu_graph_pgvector--*.sql)
if [ "$(id -u)" = 0 ]; then
  step "install gpu_graph_pgvector into $ext" install -m 644 "${pgvector_files[@]}" "$ext/"
else
  step "install gpu_graph_pgvector into $ext" sudo install -m 644 "${pgvector_files[@]}" "$ext/"
fi
