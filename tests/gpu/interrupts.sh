#!/usr/bin/env bash
# Interrupts during a GPU build, on the GPU machine, on the table `items` that
# tests/gpu/build.sh loads and indexes (it runs this after its SQL build):
#
# 1. harmless interrupts (pg_log_backend_memory_contexts every 20 ms, after
#    another statement in the same session) do not stop a GPU build: they
#    set InterruptPending, which the GPU thread once took for a cancel;
# 2. pg_cancel_backend while the graph is being built stops the build within
#    5 s, leaves no index and the backend holds no GPU memory afterwards;
# 3. statement_timeout while the vector pages are written: the same;
# 4. statement_timeout at three points of a build streamed from the index's
#    pages (maintenance_work_mem below the vectors): the same.
set -euo pipefail
out=${OUT:-/tmp/gpu-test}
mkdir -p "$out"
fail() { echo "gpu-interrupts-test: FAIL: $*" >&2; exit 1; }
say() { echo "== $*"; }
q() { psql -X -v ON_ERROR_STOP=1 -At "$@"; }

for name in interrupted cancelled timed_out streamed_probe; do q -c "DROP INDEX IF EXISTS $name" >/dev/null; done

say "harmless interrupts do not stop a GPU build"
# each signal sets InterruptPending in the building backend (and makes it log
# its memory contexts); before the fix, the GPU thread took that for a cancel
set +e
(
  q -c "SELECT count(*) FROM items" -c "SET maintenance_work_mem = '16GB'" -c "SET gpu_graph.build_device = gpu" \
    -c "SET application_name = 'gg_interrupted'" -c "CREATE INDEX interrupted ON items USING gpu_graph (embedding)" \
    >"$out/interrupted.log" 2>&1
  echo $? >"$out/interrupted.rc"
) &
builder=$!
: >"$out/interrupts.txt"
while kill -0 $builder 2>/dev/null; do
  q -c "SELECT p.phase FROM pg_stat_activity a JOIN pg_stat_progress_create_index p USING (pid)
        WHERE a.application_name = 'gg_interrupted' AND pg_log_backend_memory_contexts(a.pid)" \
    >>"$out/interrupts.txt" 2>/dev/null
  sleep 0.02
done
wait $builder
set -e
cat "$out/interrupted.log"
echo "interrupts sent, by build phase:"
sort "$out/interrupts.txt" | uniq -c
[ "$(cat "$out/interrupted.rc")" = 0 ] || fail "harmless interrupts stopped the build"
# the GPU works through both phases: the vector pages are written meanwhile
[ "$(grep -cE "writing vector pages|building graph" "$out/interrupts.txt")" -ge 5 ] ||
  fail "too few interrupts reached the build while the GPU worked to judge"
q -c "DROP INDEX interrupted"

# cancelled NAME WITH SQL...: a GPU build (WITH: its index options) in one
# session, the SQL before it setting how it is cancelled; checked_cancel then
# checks that it was, that no index is left, and that the backend holds no
# GPU memory afterwards
cancelled() {
  local name=$1 with=$2
  shift 2
  set +e
  {
    echo "SET maintenance_work_mem = '16GB';"
    echo "SET gpu_graph.build_device = gpu;"
    echo "SET application_name = 'gg_$name';"
    for line in "$@"; do echo "$line"; done
    echo "\\timing on"
    echo "CREATE INDEX $name ON items USING gpu_graph (embedding) $with;"
    echo "\\timing off"
    echo "RESET statement_timeout;"
    echo "SELECT pg_backend_pid() AS pid \\gset"
    echo "\\! nvidia-smi --query-compute-apps=pid --format=csv,noheader > $out/${name}_apps.txt"
    echo "\\echo backend :pid"
  } >"/tmp/$name.sql"
  # on past the ERROR: the rest of the script looks at the backend afterwards
  psql -X -At -f "/tmp/$name.sql" >"$out/$name.log" 2>&1
  set -e
}
echo 'compute apps while idle:'; nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader || true
checked_cancel() {
  local name=$1 expect=$2 pid
  cat "$out/$name.log"
  grep -q "$expect" "$out/$name.log" || fail "$name: the build was not cancelled"
  ! grep -q "^DETAIL" "$out/$name.log" || fail "$name: the cancel's ERROR carries a DETAIL (a Rust backtrace?)"
  [ -z "$(q -c "SELECT 1 FROM pg_class WHERE relname = '$name'")" ] || fail "$name: a cancelled build left an index"
  pid=$(awk '/^backend/ {print $2}' "$out/$name.log")
  [ -n "$pid" ] && [ -f "$out/${name}_apps.txt" ] || fail "$name: the session did not go on after the cancel"
  echo "compute apps after the cancel: $(tr '\n' ' ' <"$out/${name}_apps.txt") (backend $pid)"
  ! grep -qx "$pid" "$out/${name}_apps.txt" || fail "$name: the backend still holds GPU memory"
}

say "pg_cancel_backend while the graph is built"
(
  for _ in $(seq 1 3000); do
    q -c "SELECT pg_cancel_backend(a.pid) FROM pg_stat_activity a JOIN pg_stat_progress_create_index p USING (pid)
          WHERE a.application_name = 'gg_cancelled' AND p.phase LIKE '%building graph'" | grep -q t &&
      { date +%s.%N >"$out/cancel_sent"; break; }
    sleep 0.01
  done
) &
canceller=$!
# many more rounds than by default, so that the GPU is still at work when
# the pages are written and the backend waits for it
cancelled cancelled "WITH (t1 = 32, t2 = 64)"
end=$(date +%s.%N)
wait $canceller
[ -f "$out/cancel_sent" ] || { cat "$out/cancelled.log"; fail "the build never reached the graph phase"; }
checked_cancel cancelled "canceling statement due to user request"
awk -v a="$(cat "$out/cancel_sent")" -v b="$end" 'BEGIN { printf "the build ended %.2f s after the cancel\n", b - a; exit !(b - a < 5) }' ||
  fail "the build took more than 5 s to stop after the cancel"

say "statement_timeout while the vector pages are written"
# the timeout: the heap scan of the build above, and a little more
scan_ms=$(q -c "SELECT round((gpu_graph_info('items_embedding_idx')->'build'->'phases'->>'heap scan ms')::float)")
cancelled timed_out "" "SET statement_timeout = '$((scan_ms + 300))ms';"
checked_cancel timed_out "canceling statement due to statement timeout"
say "statement_timeout during streamed builds (maintenance_work_mem at a quarter of the vectors)"
# the points: 40, 60 and 80% of an uncancelled streamed build here (1M SIFT
# streamed in ~2.8 s on an H100: the scan to ~1 s, the pieces going up, the
# rounds with the entry point's pass, the lists coming down; fixed points of
# 1.2, 1.7 and 2.2 s fell past the end of a 2.16 s build on an H200)
q -c "SET maintenance_work_mem = '128MB'" -c "SET gpu_graph.build_device = gpu" -c '\timing on' \
  -c "CREATE INDEX streamed_probe ON items USING gpu_graph (embedding)" >"$out/streamed_probe.log" 2>&1 ||
  { cat "$out/streamed_probe.log"; fail "the uncancelled streamed build failed"; }
q -c "DROP INDEX streamed_probe" >/dev/null
streamed_ms=$(grep -oE '^Time: [0-9]+' "$out/streamed_probe.log" | tail -1 | awk '{print $2}')
[ -n "$streamed_ms" ] || fail "no time for the uncancelled streamed build"
echo "an uncancelled streamed build: $streamed_ms ms"
for pct in 40 60 80; do
  ms=$((streamed_ms * pct / 100))
  cancelled "streamed_$pct" "" "SET maintenance_work_mem = '128MB';" "SET statement_timeout = '${ms}ms';"
  checked_cancel "streamed_$pct" "canceling statement due to statement timeout"
done
say "gpu-interrupts-test: passed"
