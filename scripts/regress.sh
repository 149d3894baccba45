#!/usr/bin/env bash
# Run the pg_regress suite against a throwaway cluster with the extension as
# installed (run scripts/setup.sh first; scripts/test.sh does).
#
#   bash scripts/regress.sh [--accept] [TEST...]
#
# TEST: names of tests/pg_regress/sql/*.sql without .sql (default: all but
# those named pgvector*, which need pgvector installed and run when named
# (scripts/test.sh does, when it is), in the order of
# tests/pg_regress/schedule when that file exists, else by name).
# Expected output is tests/pg_regress/expected/TEST.out. On failure the diffs
# are printed and the results kept (the path is printed).
# --accept: copy each run test's actual output into expected/ (for a new or
# deliberately changed test; read the diff in git before committing it).
# Lines of tests/pg_regress/postgresql.conf, when it exists, are added to the
# cluster's configuration.
set -euo pipefail
# shellcheck source=scripts/cluster.sh
source "$(dirname "${BASH_SOURCE[0]}")/cluster.sh"

accept=0
tests=()
for arg in "$@"; do
  case "$arg" in
    --accept) accept=1 ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) gg_die "unknown option $arg" ;;
    *) tests+=("${arg%.sql}") ;;
  esac
done

suite=$GG_ROOT/tests/pg_regress
pg_regress=$("$PG_CONFIG" --pkglibdir)/pgxs/src/test/regress/pg_regress
[ -x "$pg_regress" ] || gg_die "no pg_regress at $pg_regress (install postgresql-server-dev-15: scripts/setup.sh)"

select=()   # what pg_regress is given
names=()    # the tests that will run
if [ ${#tests[@]} -gt 0 ]; then
  for t in "${tests[@]}"; do [ -f "$suite/sql/$t.sql" ] || gg_die "no test $suite/sql/$t.sql"; done
  select=("${tests[@]}")
  names=("${tests[@]}")
elif [ -f "$suite/schedule" ]; then
  select=(--schedule="$suite/schedule")
  read -r -a names <<<"$(sed -n 's/^[[:space:]]*test:[[:space:]]*//p' "$suite/schedule" | tr '\n' ' ')"
else
  for f in "$suite"/sql/*.sql; do
    case "$(basename "$f")" in pgvector*) ;; *) [ -e "$f" ] && select+=("$(basename "$f" .sql)") ;; esac
  done
  names=("${select[@]}")
fi
[ ${#names[@]} -gt 0 ] || gg_die "no tests in $suite/sql"

# pg_regress gives up on the whole run at a missing expected file
missing=()
for t in "${names[@]}"; do [ -f "$suite/expected/$t.out" ] || missing+=("$t"); done
if [ ${#missing[@]} -gt 0 ]; then
  if [ $accept = 1 ]; then
    mkdir -p "$suite/expected"
    for t in "${missing[@]}"; do : >"$suite/expected/$t.out"; done
  else
    gg_die "no expected output for: ${missing[*]} (write it with: bash scripts/regress.sh --accept ${missing[*]}, then read it)"
  fi
fi

conf=()
if [ -f "$suite/postgresql.conf" ]; then
  while IFS= read -r line; do
    case "$line" in ''|'#'*) ;; *) conf+=("$line") ;; esac
  done <"$suite/postgresql.conf"
fi
gg_cluster_start "${conf[@]}"

# --use-existing leaves creating the database to us
psql -X -q -v ON_ERROR_STOP=1 -c "CREATE DATABASE gpu_graph_regress" >/dev/null

out=$(mktemp -d "${TMPDIR:-/tmp}/gpu_graph-regress.XXXXXX")
# pg_regress writes its own sql/ and expected/ copies only for input/ and
# output/ templates; the results go under $out.
rc=0
"$pg_regress" \
  --use-existing \
  --bindir="$("$PG_CONFIG" --bindir)" \
  --host="$PGHOST" --port="$PGPORT" --user="$PGUSER" \
  --inputdir="$suite" \
  --outputdir="$out" \
  --dbname=gpu_graph_regress \
  "${select[@]}" || rc=$?

if [ $accept = 1 ]; then
  for f in "$out"/results/*.out; do
    [ -e "$f" ] || continue
    cp "$f" "$suite/expected/"
    gg_say "wrote expected/$(basename "$f") (read it before committing)"
  done
  rm -rf "$out"
  exit 0
fi
if [ $rc != 0 ]; then
  if [ -s "$out/regression.diffs" ]; then
    echo "---- regression.diffs"
    cat "$out/regression.diffs"
    echo "----"
  fi
  if grep -qE 'terminated by signal|PANIC|server process .* was terminated' "$GG_CLUSTER_DIR/postgres.log" 2>/dev/null; then
    echo "---- the server crashed: end of its log"
    tail -n 60 "$GG_CLUSTER_DIR/postgres.log"
    echo "----"
  fi
  gg_say "results kept in $out (the server log goes with the cluster unless GG_KEEP_CLUSTER=1)"
  exit "$rc"
fi
rm -rf "$out"
