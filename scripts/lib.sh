# shellcheck shell=bash
# Shared settings for the scripts in this folder. Source it; it sets:
#   GG_ROOT          the repository root
#   CARGO_TARGET_DIR outside the clone, so a warm machine reuses its build:
#                    one folder per clone path (cargo names a path package's
#                    artifacts without its path, so two clones sharing one
#                    folder would run each other's stale builds); an existing
#                    value is kept
#   PG_CONFIG        Debian's PostgreSQL 15 pg_config (an existing value is kept)
#   GPU_GRAPH_DATA   the benchmark/test data folder: an existing (non-empty)
#                    value is kept; else ../shared/data beside the clone when
#                    that folder exists (the full sets); else the clone's own
#                    data/ (a small sample; data/README.md). The same rule as
#                    engine::dataset::data_dir() in Rust.
# and defines gg_say, gg_die, gg_on_exit (EXIT handlers that add up rather than
# replace one another) and gg_as_pg (run a command as the cluster's OS user).

GG_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export GG_ROOT

export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/gpu_graph/target/$(printf %s "$GG_ROOT" | tr -c 'A-Za-z0-9._-' _)}
export PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
if [ -z "${GPU_GRAPH_DATA:-}" ]; then
  if [ -d "$GG_ROOT/../shared/data" ]; then
    GPU_GRAPH_DATA=$(cd "$GG_ROOT/../shared/data" && pwd)
  else
    GPU_GRAPH_DATA=$GG_ROOT/data
  fi
fi
export GPU_GRAPH_DATA
case ":$PATH:" in *":$HOME/.cargo/bin:"*) ;; *) [ -d "$HOME/.cargo/bin" ] && export PATH="$HOME/.cargo/bin:$PATH" ;; esac
export DEBIAN_FRONTEND=noninteractive

gg_say() { printf '%s: %s\n' "$(basename "$0")" "$*" >&2; }
gg_die() { printf '%s: error: %s\n' "$(basename "$0")" "$*" >&2; exit 1; }

# gg_on_exit CMD: run CMD (a string for eval) when the shell exits, after the
# handlers registered before it have run. INT and TERM exit too, so the handlers
# also run on Ctrl-C.
GG_EXIT_HANDLERS=()
gg_run_exit_handlers() {
  local rc=$? h
  trap - EXIT
  for h in "${GG_EXIT_HANDLERS[@]}"; do eval "$h" || true; done
  exit "$rc"
}
gg_on_exit() {
  GG_EXIT_HANDLERS+=("$1")
  trap gg_run_exit_handlers EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
}

# The OS user that owns throwaway clusters: initdb refuses root, so root uses
# `postgres`; anyone else runs them as themselves.
if [ "$(id -u)" = 0 ]; then GG_PG_USER=${GG_PG_USER:-postgres}; else GG_PG_USER=$(id -un); fi
export GG_PG_USER

# gg_as_pg CMD ARGS...: run as GG_PG_USER from / (it may not read our cwd).
gg_as_pg() {
  if [ "$(id -un)" = "$GG_PG_USER" ]; then
    (cd / && "$@")
  else
    (cd / && runuser -u "$GG_PG_USER" -- "$@")
  fi
}

# gg_build_bench: build the benchmark runner (quietly; its output on failure)
# and set GG_BENCH to the binary.
gg_build_bench() {
  local log rc=0
  log=$(mktemp "${TMPDIR:-/tmp}/gpu_graph-bench-build.XXXXXX")
  (cd "$GG_ROOT" && cargo build --release --quiet -p gpu-graph-bench) >"$log" 2>&1 || rc=$?
  [ $rc = 0 ] || cat "$log" >&2
  rm -f "$log"
  [ $rc = 0 ] || gg_die "building gpu-graph-bench failed"
  export GG_BENCH=$CARGO_TARGET_DIR/release/gpu-graph-bench
}
