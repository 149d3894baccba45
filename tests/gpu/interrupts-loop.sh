#!/usr/bin/env bash
# tests/gpu/interrupts.sh RUNS times in a row (default 20), on the GPU
# machine, on the table `items` and its index that tests/gpu/build.sh (or
# gpu-graph-bench) leaves: stops at the first run that fails, and fails when
# the server logged a process killed by a signal meanwhile.
#
# Why: a cancel or statement_timeout falling into a backend's first NVRTC
# compile (the start of its first GPU build) once ended the backend (NVRTC's
# own SIGINT handler, then SIGSEGV), which made PostgreSQL restart; one run
# in ten or fewer met it (docs/benchmarks.md, "The cancelled GPU build's
# crash found"). Each run's builds are in fresh sessions, so each starts
# with a first compile. About 10 s a run on 1M SIFT.
#
#   source .device/device-pg "shared_preload_libraries = 'gpu_graph'"
#   OUT=/tmp/x RUNS=20 bash tests/gpu/interrupts-loop.sh
set -uo pipefail
out=${OUT:-/tmp/gpu-test}
runs=${RUNS:-20}
log=${PG_LOG:-/tmp/pg.log}
mkdir -p "$out"
fail() { echo "gpu-interrupts-loop: FAIL: $*" >&2; exit 1; }
here=$(dirname "${BASH_SOURCE[0]}")
log_start=$(wc -l <"$log")
died() { tail -n +"$((log_start + 1))" "$log" | grep -E "terminated by signal|server process .* was terminated|exited with exit code 4"; }
for i in $(seq 1 "$runs"); do
  start=$(date +%s)
  OUT=$out/run$i bash "$here/interrupts.sh" >"$out/run$i.out" 2>&1
  rc=$?
  echo "run $i of $runs: rc $rc in $(($(date +%s) - start)) s"
  died && fail "run $i: a backend died (server log above; the run's output in $out/run$i.out)"
  [ "$rc" = 0 ] || { tail -20 "$out/run$i.out"; fail "run $i failed"; }
done
echo "== gpu-interrupts-loop: passed ($runs runs, no process died)"
