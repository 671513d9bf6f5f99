#!/bin/sh
# Stand-in for the official postgres image's entrypoint, as far as docker-compose.yml uses
# it: POSTGRES_USER, POSTGRES_PASSWORD and POSTGRES_DB make the cluster on first start in
# $PGDATA (a volume), UTF-8; later starts keep what is there.
set -eu
: "${PGDATA:=/var/lib/postgresql/data}"
: "${POSTGRES_USER:=postgres}"
: "${POSTGRES_DB:=$POSTGRES_USER}"
as_pg() { setpriv --reuid=postgres --regid=postgres --init-groups "$@"; }
mkdir -p "$PGDATA" /var/run/postgresql
chown -R postgres:postgres "$PGDATA" /var/run/postgresql
chmod 700 "$PGDATA"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  pw=$(mktemp); printf '%s\n' "${POSTGRES_PASSWORD:?}" >"$pw"; chown postgres "$pw"
  as_pg initdb -D "$PGDATA" -E UTF8 --locale=C.UTF-8 -U "$POSTGRES_USER" --pwfile="$pw" \
    --auth-local=trust --auth-host=scram-sha-256 >/dev/null
  rm -f "$pw"
  echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
  echo "listen_addresses = '*'" >>"$PGDATA/postgresql.conf"
  as_pg pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
  if [ "$POSTGRES_DB" != postgres ]; then
    as_pg psql -q -U "$POSTGRES_USER" -d postgres -c "CREATE DATABASE \"$POSTGRES_DB\""
  fi
  as_pg pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
fi
[ "$1" = postgres ] && shift && exec setpriv --reuid=postgres --regid=postgres --init-groups postgres -D "$PGDATA" "$@"
exec "$@"
