#!/usr/bin/env bash
# The whole test suite (README command 2; CI runs it through .ci/run).
#
#   bash scripts/test.sh
#
# 1. scripts/setup.sh: install what is missing, build and install gpu_graph
# 2. style: `cargo fmt --check`, and `cargo clippy` of every crate and target
#    with warnings as errors
# 3. crate tests: `cargo test --release` of every workspace crate except the
#    pgrx extension (the engine: algorithms, recall floors on real data, the
#    repository's data/ sample or the full sets; the GPU crate without a GPU:
#    the host-kernel ABI, plans, the search kernel's CPU model; the
#    benchmark runner)
# 4. pg_regress: tests/pg_regress/sql/*.sql against a throwaway cluster with
#    the installed extension (scripts/regress.sh); pgvector.sql (pgvector's
#    vector and halfvec columns) where pgvector is installed, else counted
#    as skipped; then the cluster-level tests (one that needs what the
#    machine lacks, pgvector_recall.sh without pgvector, exits 77: skipped)
#    in tests/cluster (WAL replay on a replica and after a crash, concurrency)
# 5. pgrx tests: the extension's #[pg_test]s (`cargo pgrx test`, in a cluster
#    run as the postgres OS user). It installs a build with the test functions
#    in place of the release one (its test functions in a `tests` schema of
#    every database that creates the extension), so it runs after pg_regress
#    and the release build is installed again right after it.
# 6. scripts/check-kernels.sh: compiles every CUDA kernel and the ABI check
#    with NVRTC (no GPU needed)
#
# Every suite runs even when an earlier one fails. The last line is
# `N passed, N failed, N skipped` (suites); the exit status is non-zero on any failure.
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$GG_ROOT"

names=()
results=()
passed=0
failed=0

# suite NAME CMD...: run one suite, record and report its outcome.
suite() {
  local name=$1 t0 rc=0
  shift
  echo
  echo "==== $name: $*"
  t0=$SECONDS
  "$@" || rc=$?
  names+=("$name")
  if [ $rc = 0 ]; then
    results+=("passed ($((SECONDS - t0)) s)")
    passed=$((passed + 1))
  elif [ $rc = 77 ]; then
    # a suite that needs what this machine lacks (it says what)
    results+=("skipped (see its output)")
    skipped=$((skipped + 1))
  else
    results+=("FAILED, exit $rc ($((SECONDS - t0)) s)")
    failed=$((failed + 1))
  fi
  echo "==== $name: ${results[-1]}"
}

skipped=0
skip() {
  names+=("$1")
  results+=("skipped: $2")
  skipped=$((skipped + 1))
}
not_run() {
  names+=("$1")
  results+=("FAILED, not run: $2")
  failed=$((failed + 1))
}

cargo_pgrx_test() {
  local base rc=0
  # pgrx initdb's and runs its cluster under <base>/15-<pid> as the postgres
  # user (through sudo), with the socket in <base>: postgres must own it.
  base=$(mktemp -d "${TMPDIR:-/tmp}/gpu_graph-pgrx.XXXXXX")
  local runas=()
  if [ "$(id -u)" = 0 ]; then
    chown "$GG_PG_USER:" "$base"
    runas=(--runas "$GG_PG_USER")
  fi
  cargo pgrx test pg15 --release "${runas[@]}" --pgdata "$base" || rc=$?
  rm -rf "$base"
  # what users get, not the test build, stays installed
  bash scripts/setup.sh || rc=$?
  [ $rc != 0 ] || check_release_installed || rc=$?
  return $rc
}

# The installed library has no pg_test functions (the release build).
check_release_installed() {
  local lib
  lib="$("$PG_CONFIG" --pkglibdir)/gpu_graph.so"
  # a #[pg_test] of src/pg_tests.rs, exported only by the test build
  if grep -q operators_match_engine "$lib"; then
    echo "the pgrx test build is still installed at $lib"
    return 1
  fi
}

setup_ok=1
echo "==== setup: bash scripts/setup.sh"
if bash scripts/setup.sh; then
  echo "==== setup: done"
else
  setup_ok=0
  echo "==== setup: FAILED (the suites that need PostgreSQL are not run)"
fi

suite "format" cargo fmt --all --check
if [ $setup_ok = 1 ]; then
  # the extension crate builds against the PostgreSQL that setup configured
  suite "clippy" cargo clippy --workspace --all-targets -- -D warnings
else
  not_run "clippy" "setup failed"
fi
suite "crate tests" cargo test --release --workspace --exclude gpu_graph
if [ $setup_ok = 1 ]; then
  suite "pg_regress" bash scripts/regress.sh
  # pgvector's types: only where pgvector is installed (built from its
  # source; Debian 12 has no package for PostgreSQL 15)
  if [ -f "$("$PG_CONFIG" --sharedir)/extension/vector.control" ]; then
    suite "pgvector" bash scripts/regress.sh pgvector
  else
    skip "pgvector" "pgvector not installed"
  fi
  for t in tests/cluster/*.sh; do
    suite "$(basename "$t" .sh)" bash "$t"
  done
  suite "pgrx tests" cargo_pgrx_test
else
  not_run "pg_regress" "setup failed"
  not_run "cluster tests" "setup failed"
  not_run "pgrx tests" "setup failed"
fi
suite "kernel compile" bash scripts/check-kernels.sh

echo
echo "==== summary"
[ $setup_ok = 1 ] || echo "setup: FAILED"
for i in "${!names[@]}"; do
  printf '%-16s %s\n' "${names[$i]}" "${results[$i]}"
done
echo "$passed passed, $failed failed, $skipped skipped"
[ $failed = 0 ] && [ $setup_ok = 1 ]
