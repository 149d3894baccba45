#!/usr/bin/env bash
# Throwaway PostgreSQL 15 clusters for the demo, the tests and benchmarks.
#
# As a library (source it):
#   source scripts/cluster.sh
#   gg_cluster_start ["postgresql.conf line"...]
#       initdb in a fresh temp dir (as the postgres OS user when we are root),
#       start the server on a unix socket in that dir (no TCP), export
#       PGHOST PGPORT PGUSER PGDATABASE (psql then works bare) and GG_CLUSTER_DIR,
#       and stop and remove the cluster when the shell exits.
#   gg_cluster_stop     stop and remove it now (also what the exit handler runs)
#   gg_test_fail NAME MESSAGE...   a test's failure, with the end of the log
#
# As a command:
#   scripts/cluster.sh run CMD [ARGS...]   start a cluster, run CMD with PGHOST..
#                                          set, then stop and remove the cluster
#   scripts/cluster.sh start [conf...]     start one that outlives this command;
#                                          prints the `export` lines to eval
#   scripts/cluster.sh stop DIR            stop and remove the one in DIR
#
# Settings: shared_buffers=1GB, maintenance_work_mem=2GB, max_wal_size=4GB,
# fsync off (a throwaway cluster need not survive a power cut). Extra lines
# given as arguments (or in GG_PG_CONF, one per line) are appended. The server
# log is $GG_CLUSTER_DIR/postgres.log; it is printed when the start fails.
# GG_KEEP_CLUSTER=1 keeps the directory (data and log) after stopping.

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

gg_pg_bindir() { "$PG_CONFIG" --bindir; }

# gg_test_fail NAME MESSAGE...: a cluster test's failure: the message, then
# the end of the server's log (the log goes with the cluster; a worker's
# restart or a crash shows there), exit 1.
gg_test_fail() {
  local name=$1
  shift
  echo "$name: FAIL: $*" >&2
  if [ -n "${GG_CLUSTER_DIR:-}" ] && [ -f "$GG_CLUSTER_DIR/postgres.log" ]; then
    echo "$name: the end of the server's log:" >&2
    tail -n 25 "$GG_CLUSTER_DIR/postgres.log" >&2
  fi
  exit 1
}

gg_cluster_start() {
  local bindir dir port line
  bindir=$(gg_pg_bindir) || gg_die "no pg_config at $PG_CONFIG (run scripts/setup.sh)"
  [ -x "$bindir/initdb" ] || gg_die "no initdb in $bindir: is postgresql-15 installed? (run scripts/setup.sh)"
  id "$GG_PG_USER" >/dev/null 2>&1 || gg_die "no OS user '$GG_PG_USER' to run the cluster (install postgresql-15)"
  dir=$(mktemp -d "${TMPDIR:-/tmp}/gpu_graph-pg.XXXXXX")
  chmod 700 "$dir"
  [ "$(id -un)" = "$GG_PG_USER" ] || chown "$GG_PG_USER:" "$dir"
  GG_CLUSTER_DIR=$dir
  export GG_CLUSTER_DIR
  # The socket lives in our own directory and TCP is off, so the port only
  # names the socket file; any number serves, and two clusters never collide.
  port=${GG_PGPORT:-$((50000 + RANDOM % 10000))}

  if ! gg_as_pg "$bindir/initdb" -D "$dir/data" -U postgres --auth=trust \
      --encoding=UTF8 --locale=C.UTF-8 >"$dir/initdb.log" 2>&1; then
    cat "$dir/initdb.log" >&2
    rm -rf "$dir"
    gg_die "initdb failed"
  fi
  {
    echo "# throwaway cluster settings (scripts/cluster.sh)"
    echo "listen_addresses = ''"
    echo "unix_socket_directories = '$dir'"
    echo "port = $port"
    echo "shared_buffers = 1GB"
    echo "maintenance_work_mem = 2GB"
    echo "max_wal_size = 4GB"
    echo "fsync = off"
    echo "synchronous_commit = off"
    echo "full_page_writes = off"
    echo "max_connections = 100"
    for line in "$@"; do echo "$line"; done
    if [ -n "${GG_PG_CONF:-}" ]; then printf '%s\n' "$GG_PG_CONF"; fi
  } >>"$dir/data/postgresql.conf"
  gg_on_exit gg_cluster_stop
  if ! gg_as_pg "${GG_SERVER_ENV[@]}" "$bindir/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -w -t 120 start >/dev/null 2>&1; then
    tail -n 40 "$dir/postgres.log" >&2 || true
    gg_die "the server did not start (log above, $dir/postgres.log)"
  fi
  export PGHOST=$dir PGPORT=$port PGUSER=postgres PGDATABASE=postgres
}

# How test servers start: with RUST_BACKTRACE=1, the setting under which
# pgrx would append a Rust backtrace to ERROR details, so that every suite
# checks the extension hides them (users must never see one).
GG_SERVER_ENV=(env -u RUST_LIB_BACKTRACE RUST_BACKTRACE=1)

gg_cluster_stop() {
  local dir=${1:-${GG_CLUSTER_DIR:-}}
  [ -n "$dir" ] && [ -d "$dir" ] || return 0
  if [ -f "$dir/data/postmaster.pid" ]; then
    gg_as_pg "$(gg_pg_bindir)/pg_ctl" -D "$dir/data" -m fast -w -t 60 stop >/dev/null 2>&1 ||
      gg_as_pg "$(gg_pg_bindir)/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null 2>&1 || true
  fi
  if [ "${GG_KEEP_CLUSTER:-0}" = 1 ]; then
    gg_say "kept the stopped cluster in $dir"
  else
    rm -rf "$dir"
  fi
  [ "$dir" = "${GG_CLUSTER_DIR:-}" ] && unset GG_CLUSTER_DIR
  return 0
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  cmd=${1:-}
  shift || true
  case "$cmd" in
    run)
      [ $# -gt 0 ] || gg_die "usage: $0 run CMD [ARGS...]"
      gg_cluster_start
      "$@"
      ;;
    start)
      gg_cluster_start "$@"
      GG_EXIT_HANDLERS=()   # this one outlives the command
      trap - EXIT
      echo "export PGHOST=$PGHOST PGPORT=$PGPORT PGUSER=$PGUSER PGDATABASE=$PGDATABASE GG_CLUSTER_DIR=$GG_CLUSTER_DIR"
      echo "# stop and remove it with: $0 stop $GG_CLUSTER_DIR" >&2
      ;;
    stop)
      [ $# -eq 1 ] || gg_die "usage: $0 stop DIR"
      gg_cluster_stop "$1"
      ;;
    *)
      sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//' >&2
      exit 2
      ;;
  esac
fi
