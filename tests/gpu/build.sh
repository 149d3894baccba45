#!/usr/bin/env bash
# The GPU test suite: run ON the GPU machine (the `device` tool), from the
# repository root, after staging here with `bash scripts/gpu-stage.sh`:
#
#   source .device/device-pg; bash tests/gpu/build.sh [ROWS]
#
# 1. generates ROWS (default 1,000,000) real SIFT vectors with ground truth
#    (make_sift128.py, on the GPU, about a minute);
# 2. gpu-graph-gpucheck: the GPU-built and the CPU-built graph reach recall@10
#    within 0.01 of each other at equal ef (engine search), the exact k-NN
#    graph equals brute force, a cancelled GPU build frees its memory; the
#    same parity check on a 10k-row prefix of minilm384 when staged;
# 3. through SQL: CREATE INDEX builds on the GPU (the NOTICE and
#    gpu_graph_info say so, with the time of each phase) and the index
#    answers with recall@10 of at least 0.95 at ef_search 20;
# 4. harmless interrupts (pg_log_backend_memory_contexts every 20 ms, after
#    another statement in the same session) do not stop a GPU build; a
#    cancel (pg_cancel_backend while the graph is being built, and
#    statement_timeout while the pages are written) stops one within a
#    round, leaves no index and frees the backend's GPU memory;
# 5. the GPU hidden (CUDA_VISIBLE_DEVICES=""): auto falls back to the CPU
#    with a WARNING, gpu is an ERROR, and the CPU build completes (timed).
# Exits non-zero on the first failure; logs go to $OUT when it is set.
set -euo pipefail
rows=${1:-1000000}
stage=$(pwd)/.device
out=${OUT:-/tmp/gpu-test}
mkdir -p "$out"
fail() { echo "gpu-test: FAIL: $*" >&2; exit 1; }
say() { echo "== $*"; }
q() { psql -X -v ON_ERROR_STOP=1 -At "$@"; }

say "data: $rows SIFT rows"
[ -f /tmp/sift/base.fvecs ] || python3 "$stage/make_sift128.py" /tmp/sift --rows "$rows" >"$out/make_sift.log" 2>&1 ||
  { tail "$out/make_sift.log"; fail "make_sift128.py"; }

say "graph builders (gpu-graph-gpucheck)"
"$stage/gpu-graph-gpucheck" --base /tmp/sift/base.fvecs --query /tmp/sift/query.fvecs \
  --gt /tmp/sift/groundtruth.ivecs --knn-check-rows 200000 2>&1 | tee "$out/gpucheck.log"

if [ -f "$stage/minilm384_base_10k.fvecs" ]; then
  # unit-length embeddings: L2 orders them as cosine does; exact ground truth
  # by brute force over the prefix
  say "graph builders on minilm384 (first 10k rows, 384 dims)"
  "$stage/gpu-graph-gpucheck" --base "$stage/minilm384_base_10k.fvecs" --query "$stage/minilm384_query.fvecs" \
    2>&1 | tee "$out/gpucheck_minilm.log"
fi

say "CREATE INDEX through SQL on the GPU"
"$stage/gpu-graph-bench" --base /tmp/sift/base.fvecs --query /tmp/sift/query.fvecs \
  --gt /tmp/sift/groundtruth.ivecs --metric l2 --ef 10,20,40,80 \
  --set maintenance_work_mem=16GB --set gpu_graph.build_device=gpu --csv "$out/sql_gpu.csv" 2>&1 | tee "$out/sql_gpu.log"
grep -q "on the GPU" "$out/sql_gpu.log" || fail "the build did not run on the GPU"
[ "$(q -c "SELECT gpu_graph_info('items_embedding_idx')->'build'->>'device'")" = gpu ] || fail "gpu_graph_info does not say gpu"
q -c "SELECT jsonb_pretty(gpu_graph_info('items_embedding_idx')->'build')"
r20=$(awk -F, '$9 == 20 {print $10}' "$out/sql_gpu.csv")
awk -v r="$r20" 'BEGIN { exit !(r >= 0.95) }' || fail "recall@10 at ef_search 20 is $r20 < 0.95"

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
[ "$(grep -c "building graph" "$out/interrupts.txt")" -ge 5 ] || fail "too few interrupts reached the graph phase to judge"
q -c "DROP INDEX interrupted"

# cancelled NAME SQL...: runs a GPU build in one session (the SQL sets how it
# is cancelled) and checks that it was, that no index is left, and that the
# backend holds no GPU memory afterwards
cancelled() {
  local name=$1
  shift
  set +e
  {
    echo "SET maintenance_work_mem = '16GB';"
    echo "SET gpu_graph.build_device = gpu;"
    echo "SET application_name = 'gg_$name';"
    for line in "$@"; do echo "$line"; done
    echo "\\timing on"
    echo "CREATE INDEX $name ON items USING gpu_graph (embedding);"
    echo "\\timing off"
    echo "RESET statement_timeout;"
    echo "SELECT pg_backend_pid() AS pid \\gset"
    echo "\\! nvidia-smi --query-compute-apps=pid --format=csv,noheader > $out/${name}_apps.txt"
    echo "\\echo backend :pid"
  } >"/tmp/$name.sql"
  q -f "/tmp/$name.sql" >"$out/$name.log" 2>&1
  set -e
}
echo 'compute apps while idle:'; nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader || true
checked_cancel() {
  local name=$1 expect=$2 pid
  cat "$out/$name.log"
  grep -q "$expect" "$out/$name.log" || fail "$name: the build was not cancelled"
  [ -z "$(q -c "SELECT 1 FROM pg_class WHERE relname = '$name'")" ] || fail "$name: a cancelled build left an index"
  pid=$(awk '/^backend/ {print $2}' "$out/$name.log")
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
cancelled cancelled
end=$(date +%s.%N)
wait $canceller
[ -f "$out/cancel_sent" ] || { cat "$out/cancelled.log"; fail "the build never reached the graph phase"; }
checked_cancel cancelled "canceling statement due to user request"
awk -v a="$(cat "$out/cancel_sent")" -v b="$end" 'BEGIN { printf "the build ended %.2f s after the cancel\n", b - a; exit !(b - a < 5) }' ||
  fail "the build took more than 5 s to stop after the cancel"

say "statement_timeout while the vector pages are written"
# the timeout: the heap scan of the build above, and a little more
scan_ms=$(q -c "SELECT round((gpu_graph_info('items_embedding_idx')->'build'->'phases'->>'heap scan ms')::float)")
cancelled timed_out "SET statement_timeout = '$((scan_ms + 300))ms';"
checked_cancel timed_out "canceling statement due to statement timeout"

say "the GPU hidden: fallback to the CPU"
pg_ctl_restart() {
  su pg -c "env PATH=$PATH LD_LIBRARY_PATH=$LD_LIBRARY_PATH $* pg_ctl -D $PGDATA -l /tmp/pg.log -w restart" >/dev/null
}
pg_ctl_restart CUDA_VISIBLE_DEVICES=
set +e
q -c "SET maintenance_work_mem = '16GB'" -c "SET gpu_graph.build_device = gpu" \
  -c "CREATE INDEX hidden_gpu ON items USING gpu_graph (embedding)" >"$out/hidden_gpu.log" 2>&1
set -e
cat "$out/hidden_gpu.log"
grep -q "ERROR:  gpu_graph: cannot build on the GPU" "$out/hidden_gpu.log" || fail "build_device=gpu without a GPU is not an ERROR"
"$stage/gpu-graph-bench" --base /tmp/sift/base.fvecs --query /tmp/sift/query.fvecs \
  --gt /tmp/sift/groundtruth.ivecs --metric l2 --ef 20,40 --skip-load \
  --set maintenance_work_mem=16GB --set gpu_graph.build_device=auto --csv "$out/sql_cpu.csv" 2>&1 | tee "$out/sql_cpu.log"
grep -q "WARNING" "$out/sql_cpu.log" && grep -q "on the CPU" "$out/sql_cpu.log" || fail "auto did not fall back to the CPU with a WARNING"
pg_ctl_restart
say "gpu-test: passed"
