# shellcheck shell=bash
# Sourced by the cluster tests that crash a server and compare what its
# index answers before and after (wal_replay.sh, wal_minimal.sh): a table
# `items (id, v real[])` with the gpu_graph index `items_idx`, and `queries`.

# index_fingerprint [PSQL ARGS...]: what 50 index scans return, and the
# index's node counts (of table FP_TABLE, default items, and its index
# FP_INDEX, default items_idx)
index_fingerprint() {
  psql -X -q -v ON_ERROR_STOP=1 -At -v t="${FP_TABLE:-items}" -v i="${FP_INDEX:-items_idx}" "$@" <<'SQL'
SET enable_seqscan = off;
SELECT md5(string_agg(ids, ';' ORDER BY q)) FROM (
  SELECT q, (SELECT string_agg(id::text, ',') FROM
    (SELECT id FROM :"t" ORDER BY v <-> queries.v LIMIT 20) s) AS ids FROM queries) t;
SELECT gpu_graph_info(:'i')->'nodes';
SQL
}

# crash_restart DIR: an immediate stop (no shutdown checkpoint: recovery
# replays the WAL) and a start of the cluster in DIR
crash_restart() {
  local dir=$1 bindir
  bindir=$(gg_pg_bindir)
  gg_as_pg "$bindir/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null
  gg_as_pg "${GG_SERVER_ENV[@]}" "$bindir/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -w start >/dev/null
}
