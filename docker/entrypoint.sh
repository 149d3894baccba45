#!/bin/sh
# Entry point of the gpu_graph image (docker/Dockerfile). On the first start
# with an empty $PGDATA: initdb (local connections trusted, TCP by password),
# the password of the postgres role from POSTGRES_PASSWORD when given, and
# /etc/gpu_graph/gpu_graph.conf included from postgresql.conf. Then, with the
# image's NVRTC (NVRTC=1), GPU_GRAPH_LIBNVRTC for the server, and the command.
set -eu
: "${PGDATA:=/var/lib/postgresql/data}"
export PGDATA

if [ "${1:-}" = postgres ] && [ ! -s "$PGDATA/PG_VERSION" ]; then
  initdb -D "$PGDATA" -U postgres --encoding=UTF8 --locale=C.UTF-8 \
    --auth-local=trust --auth-host=scram-sha-256 >/dev/null
  if [ -n "${POSTGRES_PASSWORD:-}" ]; then
    # before the preload is configured: single-user mode, nothing loaded
    pw=$(printf '%s' "$POSTGRES_PASSWORD" | sed "s/'/''/g")
    echo "ALTER ROLE postgres PASSWORD '$pw';" | postgres --single -D "$PGDATA" postgres >/dev/null
  else
    echo "gpu_graph image: no POSTGRES_PASSWORD, so no login over TCP (docker exec ... psql works)" >&2
  fi
  echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
  echo "include '/etc/gpu_graph/gpu_graph.conf'" >>"$PGDATA/postgresql.conf"
  echo "gpu_graph image: initialised $PGDATA" >&2
fi

if [ -f /opt/gpu_graph/nvrtc/libnvrtc.so.13 ]; then
  export GPU_GRAPH_LIBNVRTC=/opt/gpu_graph/nvrtc/libnvrtc.so.13
fi
exec "$@"
